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
#include "k3/quant/iq_tables.h"

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

inline uint32_t u32le(const uint8_t* p) { return p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t(p[3]) << 24); }
inline unsigned u16le(const uint8_t* p) { return p[0] | (p[1] << 8); }
// The sign byte of a 7-bit sign index: its 8th bit makes the number of negated weights even.
inline int sign8(int idx) { return idx | ((__builtin_popcount(idx) & 1) << 7); }
inline int grid_byte(uint64_t entry, int j) { return static_cast<int>((entry >> (8 * j)) & 0xFF); }
inline double iq_f16(unsigned h) {
  const uint8_t p[2] = {static_cast<uint8_t>(h), static_cast<uint8_t>(h >> 8)};
  return f16_value(p);
}

// The codebook i-quants, element e = 32 ib + 8 l + j (sub-block ib, group l of 8, weight j); the
// codebooks themselves are format data (k3::quant's generated tables), the sign bytes computed here.
inline double ref_iq_value(k3::WeightFormat f, const uint8_t* b, int e) {
  using F = k3::WeightFormat;
  namespace q = k3::quant;
  const int ib = e / 32, r = e % 32, l = r / 8, j = r % 8;
  auto sgn = [](int signs, int bit) { return (signs >> bit) & 1 ? -1.0 : 1.0; };
  switch (f) {
    case F::IQ2_XXS: {
      const uint32_t aux = u32le(b + 6 + 8 * ib);
      return iq_f16(u16le(b)) * (0.5 + (aux >> 28)) / 4 * grid_byte(q::kIq2xxsGrid[b[2 + 8 * ib + l]], j) * sgn(sign8((aux >> (7 * l)) & 127), j);
    }
    case F::IQ2_XS: {
      const unsigned v = u16le(b + 2 + 2 * (4 * ib + l));
      const int s = (b[66 + ib] >> (4 * (l / 2))) & 15;
      return iq_f16(u16le(b)) * (0.5 + s) / 4 * grid_byte(q::kIq2xsGrid[v & 511], j) * sgn(sign8(static_cast<int>(v >> 9)), j);
    }
    case F::IQ2_S: {
      const int idx = b[2 + 4 * ib + l] | (((b[66 + ib] >> (2 * l)) & 3) << 8);
      const int s = (b[74 + ib] >> (4 * (l / 2))) & 15;
      return iq_f16(u16le(b)) * (0.5 + s) / 4 * grid_byte(q::kIq2sGrid[idx], j) * sgn(b[34 + 4 * ib + l], j);
    }
    case F::IQ3_XXS: {
      const uint32_t aux = u32le(b + 66 + 4 * ib);
      const int k = r / 4;  // groups of 4 weights
      return iq_f16(u16le(b)) * (0.5 + (aux >> 28)) / 2 * grid_byte(q::kIq3xxsGrid[b[2 + 8 * ib + k]], r % 4) *
             sgn(sign8((aux >> (7 * l)) & 127), j);
    }
    case F::IQ3_S: {
      const int k = r / 4;
      const int idx = b[2 + 8 * ib + k] | (((b[66 + ib] >> k) & 1) << 8);
      const int s = (b[106 + ib / 2] >> (4 * (ib % 2))) & 15;
      return iq_f16(u16le(b)) * (1 + 2 * s) * grid_byte(q::kIq3sGrid[idx], r % 4) * sgn(b[74 + 4 * ib + l], j);
    }
    case F::IQ1_S: {
      const unsigned qh = u16le(b + 34 + 2 * ib);
      const int idx = b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8);
      const double g = static_cast<int8_t>(grid_byte(q::kIq1sGrid[idx], j)), delta = qh & 0x8000 ? -0.125 : 0.125;
      return iq_f16(u16le(b)) * (2 * ((qh >> 12) & 7) + 1) * (g + delta);
    }
    case F::IQ1_M: {
      unsigned sc[4], h = 0;
      for (int i = 0; i < 4; ++i) sc[i] = u16le(b + 48 + 2 * i), h |= (sc[i] >> 12) << (4 * i);
      const int qh = b[32 + 2 * ib + l / 2] >> (4 * (l % 2));
      const int idx = b[4 * ib + l] | ((qh & 7) << 8);
      const int s = (sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7;
      const double g = static_cast<int8_t>(grid_byte(q::kIq1sGrid[idx], j)), delta = qh & 8 ? -0.125 : 0.125;
      return iq_f16(h) * (2 * s + 1) * (g + delta);
    }
    default: return NAN;
  }
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
    case F::Q4_0:
    case F::Q4_1:
    case F::Q5_0:
    case F::Q5_1:
    case F::IQ4_NL: {  // 32 elements: the low nibble of qs[j] is element j, the high one j + 16
      const bool has_min = f == F::Q4_1 || f == F::Q5_1, five = f == F::Q5_0 || f == F::Q5_1;
      const int qs_at = f == F::Q4_0 || f == F::IQ4_NL ? 2 : f == F::Q4_1 || f == F::Q5_0 ? (five ? 6 : 4) : 8;
      int q = (b[qs_at + e % 16] >> (e < 16 ? 0 : 4)) & 15;
      if (five) q |= static_cast<int>((u32le(b + (has_min ? 4 : 2)) >> e) & 1) << 4;
      if (f == F::IQ4_NL) return f16_value(b) * kIq4Levels[q];
      if (has_min) return f16_value(b) * q + f16_value(b + 2);
      return f16_value(b) * (q - (five ? 16 : 8));
    }
    default: return ref_iq_value(f, b, e);
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
    case F::IQ1_M: return {};  // its d is spread over 4 nibbles: random_blocks sets it
    case F::Q4_1:
    case F::Q5_1: return {0, 2};
    default: return {0};       // Q8_0, IQ4_XS, the other i-quants
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
  if (f == k3::WeightFormat::IQ1_M)  // d: the top nibbles of the 4 u16 at 48 (bytes 49, 51, 53, 55)
    for (int64_t i = 0; i < blocks; ++i) {
      const unsigned h = ((rng() & 1) << 15) | (static_cast<unsigned>(ed(rng)) << 10) | (1 + rng() % 1023);
      for (int k = 0; k < 4; ++k) {
        uint8_t& hb = v[static_cast<size_t>(i * bb + 49 + 2 * k)];
        hb = static_cast<uint8_t>((hb & 0x0F) | (((h >> (4 * k)) & 0xF) << 4));
      }
    }
  return v;
}

// The formats k3 writes (quant::quantize_row) and all it reads.
inline constexpr k3::WeightFormat kQuantisableFormats[] = {k3::WeightFormat::Q8_0, k3::WeightFormat::Q4_K, k3::WeightFormat::Q5_K,
                                                           k3::WeightFormat::Q6_K, k3::WeightFormat::Q3_K, k3::WeightFormat::Q2_K,
                                                           k3::WeightFormat::IQ4_XS, k3::WeightFormat::Q4_0, k3::WeightFormat::Q4_1,
                                                           k3::WeightFormat::Q5_0, k3::WeightFormat::Q5_1, k3::WeightFormat::IQ4_NL,
                                                           k3::WeightFormat::IQ3_XXS, k3::WeightFormat::IQ3_S, k3::WeightFormat::IQ2_XXS,
                                                           k3::WeightFormat::IQ2_XS, k3::WeightFormat::IQ2_S, k3::WeightFormat::IQ1_S,
                                                           k3::WeightFormat::IQ1_M};
// The codebook i-quants (iq_pack.h).
inline constexpr k3::WeightFormat kCodebookFormats[] = {k3::WeightFormat::IQ3_XXS, k3::WeightFormat::IQ3_S, k3::WeightFormat::IQ2_XXS,
                                                        k3::WeightFormat::IQ2_XS, k3::WeightFormat::IQ2_S, k3::WeightFormat::IQ1_S,
                                                        k3::WeightFormat::IQ1_M};
inline constexpr k3::WeightFormat kGgufFormats[] = {
    k3::WeightFormat::Q8_0,    k3::WeightFormat::Q4_K,  k3::WeightFormat::Q5_K,    k3::WeightFormat::Q6_K,
    k3::WeightFormat::Q3_K,    k3::WeightFormat::Q2_K,  k3::WeightFormat::IQ4_XS,  k3::WeightFormat::IQ3_XXS,
    k3::WeightFormat::IQ3_S,   k3::WeightFormat::IQ2_XXS, k3::WeightFormat::IQ2_XS, k3::WeightFormat::IQ2_S,
    k3::WeightFormat::IQ1_S,   k3::WeightFormat::IQ1_M, k3::WeightFormat::Q4_0,    k3::WeightFormat::Q4_1,
    k3::WeightFormat::Q5_0,    k3::WeightFormat::Q5_1,  k3::WeightFormat::IQ4_NL};

}  // namespace k3test
