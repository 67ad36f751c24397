// Decoding of GGUF's codebook i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) into the
// floats their bytes mean; part of block_decode.h (same rules: `static inline`, one definition for every
// CPU path, bit-exact with llama.cpp's dequantize_row_*). Each 256-block is 8 sub-blocks of 32; a group of
// 8 (or 4) weights is one index into a lattice codebook (iq_tables.h: magnitudes as bytes, or int8 values
// for IQ1) plus, for IQ2 / IQ3, a sign byte: bit j negates weight j. Every value here is exact in fp32 (an
// f16 scale times a sub-scale of at most 5 bits times a codebook entry of at most 6 bits), so the order of
// the multiplications does not change the result.
//
// Byte layouts (offsets in a block; d = f16 super-block scale):
//   IQ2_XXS (66 B): d @0; per sub-block ib 8 bytes @2+8ib: 4 grid indices (iq2xxs, bytes 0-3), then a u32:
//                   4 x 7-bit sign indices (ksigns) and a 4-bit scale s (bits 28-31).  x = d (0.5 + s) / 4 g
//   IQ2_XS  (74 B): d @0; u16[32] @2: 9-bit grid index (iq2xs) | 7-bit sign index << 9; scales[8] @66
//                   (groups 0-1 of ib: low nibble, 2-3: high).
//   IQ2_S   (82 B): d @0; grid low bytes[32] @2, sign bytes[32] @34, qh[8] @66 (2 high index bits per
//                   group), scales[8] @74.
//   IQ3_XXS (98 B): d @0; grid indices[64] @2 (iq3xxs, 4 weights each), u32[8] @66 as IQ2_XXS's; x = d (0.5 + s) / 2 g
//   IQ3_S  (110 B): d @0; grid low bytes[64] @2, qh[8] @66 (the 9th index bit), sign bytes[32] @74,
//                   scales[4] @106 (nibble per sub-block).                         x = d (1 + 2 s) g
//   IQ1_S   (50 B): d @0; grid low bytes[32] @2, u16[8] @34: 3 high index bits per group, scale bits 12-14,
//                   delta sign bit 15.                                              x = d (2 s + 1) (g +- 1/8)
//   IQ1_M   (56 B): grid low bytes[32] @0, qh[16] @32 (3 high index bits + delta sign per group), 4 x u16
//                   @48: 3-bit scales (two per sub-block) and, in their top nibbles, the f16 d.
#pragma once
#include <bit>
#include <cstdint>
#include <cstring>

#include "k3/core/dtype.h"
#include "k3/quant/iq_tables.h"

namespace k3::quant {

static inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
static inline unsigned u16_at(const uint8_t* p) { return p[0] | (p[1] << 8); }
static inline float f16_bits_to_float(unsigned h) { return f16_to_f32(static_cast<uint16_t>(h)); }

// n weights: byte j of `grid` (magnitudes), negated where bit j of `signs` is set, times db. llama.cpp
// multiplies by -1.f or 1.f; flipping the sign bit gives the same bits for every non-NaN value, without
// the data-dependent branch GCC made of the select (random signs: ~4 ns per weight in mispredictions).
static inline void put_signed(float* y, uint64_t grid, unsigned signs, float db, int n) {
  for (int j = 0; j < n; ++j) {
    const float v = db * static_cast<float>((grid >> (8 * j)) & 0xFF);
    y[j] = std::bit_cast<float>(std::bit_cast<uint32_t>(v) ^ (((signs >> j) & 1u) << 31));
  }
}

static inline void decode_iq2_xxs(const uint8_t* b, float* y) {
  const float d = f16_bits_to_float(u16_at(b));
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* g = b + 2 + 8 * ib;
    const uint32_t aux = u32_at(g + 4);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l, y += 8) put_signed(y, kIq2xxsGrid[g[l]], kIq2Signs[(aux >> (7 * l)) & 127], db, 8);
  }
}

static inline void decode_iq2_xs(const uint8_t* b, float* y) {
  const float d = f16_bits_to_float(u16_at(b));
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t sc = b[66 + ib];
    const float db[2] = {d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f, d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l, y += 8) {
      const unsigned q = u16_at(b + 2 + 2 * (4 * ib + l));
      put_signed(y, kIq2xsGrid[q & 511], kIq2Signs[q >> 9], db[l / 2], 8);
    }
  }
}

static inline void decode_iq2_s(const uint8_t* b, float* y) {
  const float d = f16_bits_to_float(u16_at(b));
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t sc = b[74 + ib], qh = b[66 + ib];
    const float db[2] = {d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f, d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f};
    for (int l = 0; l < 4; ++l, y += 8) {
      const unsigned idx = b[2 + 4 * ib + l] | (((qh >> (2 * l)) & 3) << 8);
      put_signed(y, kIq2sGrid[idx], b[34 + 4 * ib + l], db[l / 2], 8);
    }
  }
}

static inline void decode_iq3_xxs(const uint8_t* b, float* y) {
  const float d = f16_bits_to_float(u16_at(b));
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* q = b + 2 + 8 * ib;
    const uint32_t aux = u32_at(b + 66 + 4 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int l = 0; l < 4; ++l, y += 8) {
      const unsigned signs = kIq2Signs[(aux >> (7 * l)) & 127];
      put_signed(y, kIq3xxsGrid[q[2 * l]], signs, db, 4);
      put_signed(y + 4, kIq3xxsGrid[q[2 * l + 1]], signs >> 4, db, 4);
    }
  }
}

static inline void decode_iq3_s(const uint8_t* b, float* y) {
  const float d = f16_bits_to_float(u16_at(b));
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* q = b + 2 + 8 * ib;
    const uint8_t qh = b[66 + ib];
    const uint8_t* signs = b + 74 + 4 * ib;
    const float db = d * static_cast<float>(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF));
    for (int l = 0; l < 4; ++l, y += 8) {
      put_signed(y, kIq3sGrid[q[2 * l] | (((qh >> (2 * l)) & 1) << 8)], signs[l], db, 4);
      put_signed(y + 4, kIq3sGrid[q[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8)], signs[l] >> 4, db, 4);
    }
  }
}

// IQ1: 8 weights dl * (g_j + delta), g_j the int8 bytes of an iq1s_grid entry.
static inline void put_iq1(float* y, uint64_t grid, float dl, float delta) {
  for (int j = 0; j < 8; ++j) y[j] = dl * (static_cast<float>(static_cast<int8_t>((grid >> (8 * j)) & 0xFF)) + delta);
}
inline constexpr float kIq1Delta = 0.125f;
// +-kIq1Delta by a sign bit (0 or 1), without a branch on random data.
static inline float iq1_delta(unsigned negative) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(kIq1Delta) | (negative << 31));
}

static inline void decode_iq1_s(const uint8_t* b, float* y) {
  const float d = f16_bits_to_float(u16_at(b));
  for (int ib = 0; ib < 8; ++ib) {
    const unsigned qh = u16_at(b + 34 + 2 * ib);
    const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
    const float delta = iq1_delta((qh >> 15) & 1);
    for (int l = 0; l < 4; ++l, y += 8) put_iq1(y, kIq1sGrid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], dl, delta);
  }
}

static inline void decode_iq1_m(const uint8_t* b, float* y) {
  unsigned sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = u16_at(b + 48 + 2 * i);
  const float d = f16_bits_to_float((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
  for (int ib = 0; ib < 8; ++ib) {
    const float dl[2] = {d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                         d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
    for (int l = 0; l < 4; ++l, y += 8) {
      const uint8_t qh = b[32 + 2 * ib + l / 2];
      const unsigned hi = l % 2 == 0 ? qh & 7 : (qh >> 4) & 7;  // 3 high index bits
      const unsigned neg = (qh >> (l % 2 == 0 ? 3 : 7)) & 1;
      put_iq1(y, kIq1sGrid[b[4 * ib + l] | (hi << 8)], dl[l / 2], iq1_delta(neg));
    }
  }
}

}  // namespace k3::quant
