// The avx512 kernel tier (weight_kernels_avx512.cpp): private to weight_kernels.cpp, which puts it in the
// per-tier table that row_kernels() dispatches on.
#pragma once
#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

// The avx512 tier's kernels of format f, or null when it has none. Only call them on a CPU with
// AVX-512 F/BW/VL/DQ (this function itself is plain code).
const RowKernels* avx512_row_kernels(WeightFormat f);

}  // namespace k3::cpu
