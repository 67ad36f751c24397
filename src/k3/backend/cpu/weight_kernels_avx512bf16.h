// The avx512bf16 kernel tier (weight_kernels_avx512bf16.cpp): private to weight_kernels.cpp, which puts it
// in the per-tier table that row_kernels() dispatches on.
#pragma once
#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

// The avx512bf16 tier's own kernels of format f (BF16, MXFP4), or null (the tier table then uses the
// avx512 tier's). Only call them on a CPU with AVX-512 F/BW/VL/DQ + AVX512_BF16 + AVX512_VNNI (this
// function itself is plain code).
const RowKernels* avx512bf16_row_kernels(WeightFormat f);

// The avx512bf16 tier's kernels of GGUF's block formats (int8 activations, VNNI:
// weight_kernels_quant_vnni.cpp), or null when f is not one. The same CPU requirement.
const RowKernels* avx512bf16_quant_row_kernels(WeightFormat f);

// Q4_K, Q5_K and Q6_K on per-block int8 activations (llama.cpp's Q8_K layout, avx2int8's numbers bit for bit:
// weight_kernels_vnni_k.cpp), or null for other formats. The same CPU requirement.
const RowKernels* avx512bf16_k_row_kernels(WeightFormat f);

// The one-token weight prefetch distance of the tier's block kernels (K3_QUANT_PREFETCH bytes; 0 = none).
int64_t avx512bf16_quant_prefetch_bytes();

}  // namespace k3::cpu
