// The avx2int8 kernel tier (weight_kernels_avx2int8.cpp): private to weight_kernels.cpp, which puts it in
// the per-tier table that row_kernels() dispatches on.
#pragma once
#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

// The avx2int8 tier's own kernels of format f (MXFP4, MXFP4_GGML: int8 activations, maddubs), or null
// (the tier table then uses the avx2 tier's exact kernels). `exact`: the avx2 tier's kernels of f, whose
// dequant the tier keeps (it rounds activations, never weights). Needs AVX2 + FMA + F16C only.
const RowKernels* avx2int8_row_kernels(WeightFormat f, const RowKernels& exact);

// The tier's kernels of GGUF's block formats: Q8_0, Q4_K, Q5_K, Q6_K on int8 activations, the others the
// avx2 tier's exact ones; null when f is not a block format.
const RowKernels* avx2int8_quant_row_kernels(WeightFormat f);

}  // namespace k3::cpu
