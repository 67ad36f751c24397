// Float64 reference of GGUF's block formats for the tests (test_quant_formats.cpp, test_quant_kernels.cpp),
// written from the format descriptions (docs/quantization.md), element by element: the value of element e
// of a block read straight from its bit positions, in double, where every product is exact. The project's
// decoders (quant/block_decode.h) loop over sub-blocks in fp32; an fp32 value equal to the rounded
// reference is the exact value rounded once, which is what they must give.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "k3/core/weight_format.h"

namespace k3test {

inline double f16_value(const uint8_t* p) {
  const unsigned h = p[0] | (p[1] << 8);
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

// IQ4_NL's 16 non-linear levels (the GGUF format's codebook, also used by IQ4_XS).
inline constexpr int kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// Q4_K / Q5_K: the 6-bit scale (which = 0) or min (which = 1) of sub-block j, from the 12 bytes at s.
inline int k_scale6(const uint8_t* s, int j, int which) {
  if (j < 4) return s[j + 4 * which] & 63;
  const int low4 = which == 0 ? s[j + 4] & 15 : s[j + 4] >> 4;
  return low4 | ((s[j - 4 + 4 * which] >> 6) << 4);
}

// The value of element e of block b in format f.
inline double ref_value(k3::WeightFormat f, const uint8_t* b, int e) {
  using F = k3::WeightFormat;
  const int h = e / 128, r = e % 128;  // 256-blocks: halves of 128 elements
  switch (f) {
    case F::Q8_0: return static_cast<int8_t>(b[2 + e]) * f16_value(b);
    case F::Q4_K:
    case F::Q5_K: {
      const int j = e / 32, l = e % 32;
      const uint8_t* qs = b + (f == F::Q4_K ? 16 : 48);
      int q = (qs[32 * (e / 64) + l] >> (4 * (j % 2))) & 15;
      if (f == F::Q5_K) q += ((b[16 + l] >> j) & 1) * 16;
      return f16_value(b) * k_scale6(b + 4, j, 0) * q - f16_value(b + 2) * k_scale6(b + 4, j, 1);
    }
    case F::Q6_K: {
      const int k = r / 32, l = r % 32;
      const int low4 = (b[64 * h + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
      const int hi2 = (b[128 + 32 * h + l] >> (2 * k)) & 3;
      return f16_value(b + 208) * static_cast<int8_t>(b[192 + e / 16]) * ((low4 | (hi2 << 4)) - 32);
    }
    case F::Q3_K: {
      const int low2 = (b[32 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const int hbit = (b[r % 32] >> (4 * h + r / 32)) & 1;
      const int i = e / 16;
      const int s_low4 = i < 8 ? b[96 + i] & 15 : b[96 + i - 8] >> 4;
      const int s_hi2 = (b[104 + i % 4] >> (2 * (i / 4))) & 3;
      return f16_value(b + 108) * ((s_low4 | (s_hi2 << 4)) - 32) * (low2 + 4 * hbit - 4);
    }
    case F::Q2_K: {
      const int q = (b[16 + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
      const int sc = b[e / 16];
      return f16_value(b + 80) * (sc & 15) * q - f16_value(b + 82) * (sc >> 4);
    }
    case F::IQ4_XS: {
      const int ib = e / 32, j = e % 32;
      const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 15) | ((((b[2] | (b[3] << 8)) >> (2 * ib)) & 3) << 4);
      const int idx = (b[8 + 16 * ib + j % 16] >> (j < 16 ? 0 : 4)) & 15;
      return f16_value(b) * (ls - 32) * kIq4Levels[idx];
    }
    default: return NAN;
  }
}

// The f16 scale fields of a block of f (offsets in bytes).
inline std::vector<int> f16_offsets(k3::WeightFormat f) {
  using F = k3::WeightFormat;
  switch (f) {
    case F::Q4_K:
    case F::Q5_K: return {0, 2};
    case F::Q6_K: return {208};
    case F::Q3_K: return {108};
    case F::Q2_K: return {80, 82};
    default: return {0};  // Q8_0, IQ4_XS
  }
}

// `blocks` random valid blocks of f: random bytes, f16 scales finite with exponents in [e_lo, e_hi]
// (biased f16 exponent field; 0: subnormal), never zero.
inline std::vector<uint8_t> random_blocks(k3::WeightFormat f, int64_t blocks, std::mt19937& rng, int e_lo = 0, int e_hi = 30) {
  const int bb = k3::weight_layout(f).block_bytes;
  std::vector<uint8_t> v(static_cast<size_t>(blocks * bb));
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  std::uniform_int_distribution<int> ed(e_lo, e_hi);
  for (int64_t i = 0; i < blocks; ++i)
    for (int off : f16_offsets(f)) {
      const unsigned h = ((rng() & 1) << 15) | (static_cast<unsigned>(ed(rng)) << 10) | (1 + rng() % 1023);
      v[static_cast<size_t>(i * bb + off)] = static_cast<uint8_t>(h);
      v[static_cast<size_t>(i * bb + off + 1)] = static_cast<uint8_t>(h >> 8);
    }
  return v;
}

inline constexpr k3::WeightFormat kGgufFormats[] = {k3::WeightFormat::Q8_0, k3::WeightFormat::Q4_K, k3::WeightFormat::Q5_K,
                                                    k3::WeightFormat::Q6_K, k3::WeightFormat::Q3_K, k3::WeightFormat::Q2_K,
                                                    k3::WeightFormat::IQ4_XS};

}  // namespace k3test
