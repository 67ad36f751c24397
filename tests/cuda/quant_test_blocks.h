// Random GGUF blocks for the CUDA quantised-kernel tests (test_quant_kernels.cpp, test_quant_moe.cpp): every
// byte random (quants, sub-scales, signs, grid indices), then the f16 super-block scales overwritten with
// random finite normal values of either sign (random bytes could make NaN / inf); and the CPU's dequantised
// rows of them, the reference side.
#pragma once
#include <algorithm>
#include <cmath>
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

// The float64 product of the CPU's dequantised rows w [rows][cols] and x [n][cols], the side every kernel is held to.
struct Product {
  std::vector<double> exact, abs_sum;  // [n][rows]: sum w x in float64, and sum |w x|
};

inline Product reference(const std::vector<float>& w, const std::vector<float>& x, int64_t rows, int64_t cols, int64_t n) {
  Product p;
  p.exact.resize(static_cast<size_t>(n * rows));
  p.abs_sum.resize(p.exact.size());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double v = static_cast<double>(w[r * cols + c]) * x[t * cols + c];
        s += v;
        a += std::fabs(v);
      }
      p.exact[t * rows + r] = s;
      p.abs_sum[t * rows + r] = a;
    }
  return p;
}

// Worst |got - exact| / (sum |w x|) over the outputs, in units of the bound's per-term rounding (2^-24 * k):
// <= 2 passes. NaN or a missed output: infinity.
inline double worst_ratio(const std::vector<float>& got, const Product& p, double k) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double err = std::fabs(got[i] - p.exact[i]);
    worst = std::max(worst, err / (std::ldexp(1.0, -24) * k * std::max(p.abs_sum[i], 1e-30)));
  }
  return worst;
}


// quant_mma.h's error bound in units of 2^-24 of sum |w x| (quant_gemv_mma.cu's header): x' = hi + lo within 2^-18
// of x (64), the MMAs' fp32 sums (up to 4 x 32 with truncating adds), one rounding per sub-block (cols / 16), the
// reduction; with x rounded to bf16 alone (no lo) 2^-9 of x (32768) on top.
inline double quant_mma_bound(int64_t cols, bool split) { return (split ? 0.0 : 32768.0) + 256.0 + static_cast<double>(cols) / 16; }

}  // namespace k3quanttest
