// The amx kernel tier (weight_kernels_amx.cpp): private to weight_kernels.cpp, which puts it in the per-tier
// table that row_kernels() dispatches on.
#pragma once
#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

// The amx tier's own kernels of format f (BF16: AMX tiles, TDPBF16PS), or null (the tier table then uses the
// avx512bf16 tier's). Only call them on a CPU with AMX-TILE + AMX-BF16 and the avx512bf16 tier's features,
// in a process the kernel granted the tile data state (cpu_isa.cpp asks at start-up).
const RowKernels* amx_row_kernels(WeightFormat f);

}  // namespace k3::cpu
