// Decoding of one block of a GGUF block format (core/weight_format.h: Q8_0, Q4_K, ..., IQ4_XS, and the
// codebook i-quants of block_decode_iq.h) into the
// floats its bytes mean: THE dequantisation every CPU path uses (dequant, dot, gemm of each kernel tier,
// the quantisers' error measurement), so that they all agree bit for bit.
//
// Bit-exact with llama.cpp's dequantize_row_* on the same bytes (tests/data/quant-golden/): each value is
// the same fp32 expression in the same order, e.g. Q4_K's (d * sc) * q - (dmin * m). Those products are
// exact in fp32 (an f16 scale has 11 significant bits, a 6-bit sub-scale and a 4-bit quant add 10), so
// only the final subtraction rounds, once, whether or not a compiler fuses it into an fma: the result
// does not depend on the compiler, the ISA or vectorisation.
//
// Byte layouts (little-endian, offsets within a block; QK = 256 elements for the K and i-quant formats):
//   Q8_0   (34 B, 32 el.): d f16 @0, qs int8[32] @2.                          x = qs * d
//   Q2_K   (84 B): scales u8[16] @0 (low nibble: scale, high: min), qs[64] @16 (2 bits), d @80, dmin @82
//   Q3_K  (110 B): hmask[32] @0 (bit 3 of each quant), qs[64] @32 (low 2 bits), scales[12] @96 (16 x 6 bits),
//                  d @108.                                                    x = d (s - 32) (q - 4 [hbit 0])
//   Q4_K  (144 B): d @0, dmin @2, scales[12] @4 (8 x 6-bit scale + 8 x 6-bit min), qs[128] @16
//   Q5_K  (176 B): Q4_K's header, qh[32] @16 (fifth bits), qs[128] @48
//   Q6_K  (210 B): ql[128] @0 (low 4 bits), qh[64] @128 (high 2 bits), scales int8[16] @192, d @208
//   IQ4_XS(136 B): d @0, scales_h u16 @2, scales_l[4] @4 (8 x 6-bit scales), qs[128] @8 (4-bit indices
//                  into the IQ4_NL codebook)
//   32-element blocks (the low nibble of qs[j] is element j, the high one element j + 16):
//   Q4_0   (18 B): d @0, qs[16] @2.                                           x = (q - 8) * d
//   Q4_1   (20 B): d @0, m @2, qs[16] @4.                                     x = q * d + m
//   Q5_0   (22 B): d @0, qh u32 @2 (bit j: fifth bit of element j), qs[16] @6. x = (q - 16) * d
//   Q5_1   (24 B): d @0, m @2, qh u32 @4, qs[16] @8.                           x = q * d + m
//   IQ4_NL (18 B): d @0, qs[16] @2 (indices into the IQ4_NL codebook).         x = d * L[q]
// (Q4_1 / Q5_1: q * d is exact in fp32, so only the addition rounds, fused or not.)
// Quants of a 256-block are interleaved in 128-element halves: in Q2_K / Q3_K a byte of qs holds 4 quants
// 32 elements apart (bit pairs 0-1, 2-3, 4-5, 6-7); in Q4_K / Q5_K / Q6_K / IQ4_XS a byte holds 2 quants
// (low nibble, high nibble) 32 (K) or 16 (IQ4_XS) elements apart.
//
// The functions are `static inline`: each kernel tier includes this header inside its own target region
// (AVX2 baseline, AVX-512), and internal linkage keeps one tier's compiled copy from replacing another's.
#pragma once
#include <cstdint>
#include <cstring>

#include "k3/core/dtype.h"
#include "k3/core/weight_format.h"
#include "k3/quant/iq_tables.h"
#include "k3/quant/block_decode_iq.h"

namespace k3::quant {

inline constexpr int kQK = 256;  // elements of a K / i-quant super-block (ggml's QK_K)

static inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

static inline void decode_q8_0(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(q[j]) * d;
}

// Q4_K / Q5_K: sub-block j (0..7) of 32 elements has a 6-bit scale and a 6-bit min packed in 12 bytes:
// j < 4: scale = s[j] & 63, min = s[j + 4] & 63; j >= 4: low 4 bits from s[j + 4] (scale: low nibble,
// min: high nibble), high 2 bits from the top bits of s[j - 4] (scale) and s[j] (min).
static inline void k4_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

static inline void decode_q4_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
    int sc, m;
    k4_scale_min(j, s, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    k4_scale_min(j + 1, s, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

static inline void decode_q5_k(const uint8_t* b, float* y) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* q = b + 48;
  for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
    int sc, m;
    k4_scale_min(j, s, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    k4_scale_min(j + 1, s, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const int lo_bit = j, hi_bit = j + 1;  // sub-block j's fifth bits: bit j of qh[l]
    for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>((q[l] & 0xF) | (((qh[l] >> lo_bit) & 1) << 4)) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>((q[l] >> 4) | (((qh[l] >> hi_bit) & 1) << 4)) - m2;
  }
}

static inline void decode_q6_k(const uint8_t* b, float* y) {
  const float d = f16_at(b + 208);
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8, y += 128)
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
}

// Q3_K's 16 6-bit scales in 12 bytes: low 4 bits of scale i from byte i (i < 8, low nibble) or byte i - 8
// (high nibble); high 2 bits from byte 8 + i % 4, bit pair i / 4.
static inline int q3_k_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

static inline void decode_q3_k(const uint8_t* b, float* y) {
  const float d = f16_at(b + 108);
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* s = b + 96;
  int is = 0, hbit = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2, ++hbit)
      for (int part = 0; part < 2; ++part, y += 16) {
        const float dl = d * static_cast<float>(q3_k_scale(s, is++));
        for (int l = 0; l < 16; ++l) {
          const int i = l + 16 * part;
          const int v = ((q[i] >> shift) & 3) - (((hm[i] >> hbit) & 1) ? 0 : 4);
          y[l] = dl * static_cast<float>(v);
        }
      }
}

static inline void decode_q2_k(const uint8_t* b, float* y) {
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  const uint8_t* s = b;
  const uint8_t* q = b + 16;
  int is = 0;
  for (int half = 0; half < 2; ++half, q += 32)
    for (int shift = 0; shift < 8; shift += 2)
      for (int part = 0; part < 2; ++part, y += 16) {
        const uint8_t sc = s[is++];
        const float dl = d * static_cast<float>(sc & 0xF), ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) y[l] = dl * static_cast<float>((q[l + 16 * part] >> shift) & 3) - ml;
      }
}

static inline void decode_iq4_xs(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  const unsigned scales_h = b[2] | (b[3] << 8);
  const uint8_t* scales_l = b + 4;
  const uint8_t* q = b + 8;
  for (int ib = 0; ib < 8; ++ib, q += 16, y += 32) {
    const int ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    const float dl = d * static_cast<float>(ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * static_cast<float>(kIq4nlValues[q[j] & 0xF]);
      y[j + 16] = dl * static_cast<float>(kIq4nlValues[q[j] >> 4]);
    }
  }
}

// The 32-element formats; `hbits`: Q5's fifth bits (0 for Q4), `offset` subtracted from the quant when
// there is no min.
static inline void decode_q4_5(const uint8_t* qs, uint32_t hbits, float d, int offset, float y[32]) {
  for (int j = 0; j < 16; ++j) {
    const int x0 = ((qs[j] & 0xF) | static_cast<int>(((hbits >> j) & 1) << 4)) - offset;
    const int x1 = ((qs[j] >> 4) | static_cast<int>(((hbits >> (j + 16)) & 1) << 4)) - offset;
    y[j] = static_cast<float>(x0) * d;
    y[j + 16] = static_cast<float>(x1) * d;
  }
}
static inline void decode_q4_0(const uint8_t* b, float* y) { decode_q4_5(b + 2, 0, f16_at(b), 8, y); }
static inline void decode_q5_0(const uint8_t* b, float* y) { decode_q4_5(b + 6, u32_at(b + 2), f16_at(b), 16, y); }
static inline void decode_q4_1(const uint8_t* b, float* y) {
  const float m = f16_at(b + 2);
  decode_q4_5(b + 4, 0, f16_at(b), 0, y);
  for (int j = 0; j < 32; ++j) y[j] += m;
}
static inline void decode_q5_1(const uint8_t* b, float* y) {
  const float m = f16_at(b + 2);
  decode_q4_5(b + 8, u32_at(b + 4), f16_at(b), 0, y);
  for (int j = 0; j < 32; ++j) y[j] += m;
}
static inline void decode_iq4_nl(const uint8_t* b, float* y) {
  const float d = f16_at(b);
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>(kIq4nlValues[b[2 + j] & 0xF]);
    y[j + 16] = d * static_cast<float>(kIq4nlValues[b[2 + j] >> 4]);
  }
}

// Decodes block `b` of format F (a GGUF block format) into weight_layout(F).block_elems floats.
template <WeightFormat F>
static inline void decode_block(const uint8_t* b, float* y) {
  if constexpr (F == WeightFormat::Q8_0) decode_q8_0(b, y);
  else if constexpr (F == WeightFormat::Q4_K) decode_q4_k(b, y);
  else if constexpr (F == WeightFormat::Q5_K) decode_q5_k(b, y);
  else if constexpr (F == WeightFormat::Q6_K) decode_q6_k(b, y);
  else if constexpr (F == WeightFormat::Q3_K) decode_q3_k(b, y);
  else if constexpr (F == WeightFormat::Q2_K) decode_q2_k(b, y);
  else if constexpr (F == WeightFormat::IQ4_XS) decode_iq4_xs(b, y);
  else if constexpr (F == WeightFormat::IQ3_XXS) decode_iq3_xxs(b, y);
  else if constexpr (F == WeightFormat::IQ3_S) decode_iq3_s(b, y);
  else if constexpr (F == WeightFormat::IQ2_XXS) decode_iq2_xxs(b, y);
  else if constexpr (F == WeightFormat::IQ2_XS) decode_iq2_xs(b, y);
  else if constexpr (F == WeightFormat::IQ2_S) decode_iq2_s(b, y);
  else if constexpr (F == WeightFormat::IQ1_S) decode_iq1_s(b, y);
  else if constexpr (F == WeightFormat::IQ1_M) decode_iq1_m(b, y);
  else if constexpr (F == WeightFormat::Q4_0) decode_q4_0(b, y);
  else if constexpr (F == WeightFormat::Q4_1) decode_q4_1(b, y);
  else if constexpr (F == WeightFormat::Q5_0) decode_q5_0(b, y);
  else if constexpr (F == WeightFormat::Q5_1) decode_q5_1(b, y);
  else if constexpr (F == WeightFormat::IQ4_NL) decode_iq4_nl(b, y);
  else static_assert(F == WeightFormat::Q8_0, "not a GGUF block format");
}

}  // namespace k3::quant
