// Random GGUF blocks for the CUDA quantised-kernel tests (test_quant_kernels.cpp, test_quant_moe.cpp): every
// byte random (quants, sub-scales, signs, grid indices), then the f16 super-block scales overwritten with
// random finite normal values of either sign (random bytes could make NaN / inf); and the CPU's dequantised
// rows of them, the reference side.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "k3/backend/cpu/ops.h"
#include "k3/core/weight.h"

namespace k3quanttest {

using k3::WeightFormat;

inline const WeightFormat kFormats[] = {WeightFormat::Q8_0,    WeightFormat::Q4_K,    WeightFormat::Q5_K,   WeightFormat::Q6_K,
                                 WeightFormat::Q3_K,    WeightFormat::Q2_K,    WeightFormat::IQ4_XS, WeightFormat::IQ3_XXS,
                                 WeightFormat::IQ3_S,   WeightFormat::IQ2_XXS, WeightFormat::IQ2_XS, WeightFormat::IQ2_S,
                                 WeightFormat::IQ1_S,   WeightFormat::IQ1_M,   WeightFormat::Q4_0,   WeightFormat::Q4_1,
                                 WeightFormat::Q5_0,    WeightFormat::Q5_1,    WeightFormat::IQ4_NL};

// A finite normal f16 of random sign and mantissa, exponent in [lo, hi] (15 = 2^0).
inline uint16_t random_f16(std::mt19937& rng, int lo, int hi) {
  const unsigned sign = rng() & 1, exp = lo + rng() % (hi - lo + 1), man = rng() & 0x3FF;
  return static_cast<uint16_t>((sign << 15) | (exp << 10) | man);
}

inline void put_u16(uint8_t* p, unsigned v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

// Byte offsets of a format's f16 scales in its block (IQ1_M's d is split over 4 nibbles: handled apart).
inline std::vector<int> f16_fields(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K:
    case WeightFormat::Q4_1:
    case WeightFormat::Q5_1: return {0, 2};
    case WeightFormat::Q6_K: return {208};
    case WeightFormat::Q3_K: return {108};
    case WeightFormat::Q2_K: return {80, 82};
    case WeightFormat::IQ1_M: return {};
    default: return {0};
  }
}

inline std::vector<uint8_t> random_blocks(WeightFormat f, int64_t rows, int64_t cols, uint32_t seed, int exp_lo, int exp_hi) {
  std::mt19937 rng(seed);
  const k3::WeightLayout l = k3::weight_layout(f);
  const int64_t nblocks = rows * cols / l.block_elems;
  std::vector<uint8_t> b(static_cast<size_t>(nblocks * l.block_bytes));
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < nblocks; ++i) {
    uint8_t* blk = b.data() + i * l.block_bytes;
    for (int off : f16_fields(f)) put_u16(blk + off, random_f16(rng, exp_lo, exp_hi));
    if (f == WeightFormat::IQ1_M) {  // d's nibble k is the top nibble of the u16 at 48 + 2k
      const unsigned d = random_f16(rng, exp_lo, exp_hi);
      for (int k = 0; k < 4; ++k) {
        uint8_t* p = blk + 48 + 2 * k;
        const unsigned v = (p[0] | (p[1] << 8)) & 0x0FFF;
        put_u16(p, v | (((d >> (4 * k)) & 0xF) << 12));
      }
    }
  }
  return b;
}

inline k3::WeightMatrix host_matrix(WeightFormat f, const std::vector<uint8_t>& b, int64_t rows, int64_t cols) {
  return k3::WeightMatrix{f, b.data(), nullptr, rows, cols, k3::kHostDevice};
}

inline std::vector<float> cpu_rows(const k3::WeightMatrix& W) {
  std::vector<float> out(static_cast<size_t>(W.rows * W.cols));
  for (int64_t r = 0; r < W.rows; ++r) k3::cpu::dequant_row(W, r, out.data() + r * W.cols);
  return out;
}

}  // namespace k3quanttest
