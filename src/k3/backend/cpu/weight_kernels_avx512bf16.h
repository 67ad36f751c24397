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

}  // namespace k3::cpu
