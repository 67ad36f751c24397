// The CPU kernels of GGUF's block formats (Q8_0, the K formats, IQ4_XS and the codebook i-quants;
// core/weight_format.h) in the avx2 and avx512 tiers: private to weight_kernels.cpp, which puts them in its
// per-tier tables.
//
// Exact tier: a block is decoded into fp32 (quant_decode_simd.h: the values of quant/block_decode.h and of
// llama.cpp's dequantisation, bit for bit) and multiplied by the fp32 activations with fp32 FMAs; so the
// products are the exact fp32 products of the stored weights and the activations, as for the float formats
// and MXFP4. The gemm decodes a block once for a tile of tokens; each (row, token) keeps the dot's
// accumulators and order, so its outputs have the dot's bits (the contract of weight_kernels.h).
#pragma once
#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

// The kernels of f in the avx2 / avx512 tier, or null when f is not a GGUF block format. Only call the
// avx512 ones on a CPU with AVX-512 F/BW/VL/DQ.
const RowKernels* avx2_quant_row_kernels(WeightFormat f);
const RowKernels* avx512_quant_row_kernels(WeightFormat f);

}  // namespace k3::cpu
