// q8 blocks: values in blocks of 32, each an int8 code q and one float scale d per block, x ~ q d. The rule, the same
// as the CPU's MXFP4 row-block tier (backend/cpu/mxfp4_rowblocks.h) and the CUDA q8 decode kernels:
//   m = max |x_i| over the block; d = m / 127 (IEEE division); q_i = nearest-even(x_i (127 / m)), |q_i| <= 127.
//   m < 2^-120 (127 / m would overflow): q = 0 (d = m / 127 as above, so x' = 0).
//   A block holding a NaN or an infinity: q = 0, d = NaN (its products are NaN: an overflow stays visible).
// Against MXFP8 (core/mxfp8.h) a q8 block keeps 7 bits of magnitude relative to its largest value where E4M3 keeps 3
// bits of mantissa; q8's error is uniform, m / 254 at most.
#pragma once
#include <cstdint>

namespace k3 {

inline constexpr int kQ8Block = 32;
inline constexpr float kQ8MinScaledMax = 0x1p-120f;

// The n <= 32 values x[0..n) as one block: q[0..n) and the returned scale d.
float quantise_q8_block(const float* x, int n, int8_t* q);

// In place over a row of any width n >= 0: x[i] <- q_i d of its block, the full blocks from the row's start and a
// short last block of n % 32 values on its own (the same as zero padding: zeros change neither m nor the codes).
void fake_quant_q8_row(float* x, int64_t n);

}  // namespace k3
