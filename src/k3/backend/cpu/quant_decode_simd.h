// AVX2 decoders of GGUF's block formats into fp32 for the CPU kernels (weight_kernels_quant*.cpp): the
// same values as quant/block_decode.h's scalar decoders, bit for bit, because each value is the same fp32
// expression -- an exact int -> float conversion, then (sub-scale) * q, then "- sub-min" where the format
// has one, with the sub-scale and sub-min computed by the same scalar code -- only 8 lanes at a time.
// (QuantGolden and QuantKernelsTier check the kernels' dequant against ggml and the float64 reference.)
//
// `static inline` as block_decode.h: the avx512 tier includes this inside its target region and gets its
// own copy; the code itself only needs AVX2.
#pragma once
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "k3/quant/block_decode.h"

// Always inlined into the kernels: besides speed, GCC 12 at -O3 (IPA pure-const + modref) treated the
// out-of-line Q2_K decoder writing through StoreSink as free of side effects and deleted the calls
// (QuantGolden / QuantKernelsTier caught it: the avx2 dequant returned without writing).
#define K3_QDECODE static inline __attribute__((always_inline))

namespace k3::cpu::qsimd {

// 8 int8 lanes (the low 8 bytes of v) -> fp32.
K3_QDECODE __m256 i8x8_to_f32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// 32 int8 quants (v) -> fp32 r[0..3] (8 lanes each): lanes 0-15 are d0 * q - m0, lanes 16-31 d1 * q - m1
// (kMin: with the subtraction; without it the value is d * q alone, as the formats without mins compute
// it).
template <bool kMin>
K3_QDECODE void to_f32x32(__m256i v, float d0, float m0, float d1, float m1, __m256 r[4]) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_mul_ps(_mm256_set1_ps(k < 2 ? d0 : d1), i8x8_to_f32(parts[k]));
    if constexpr (kMin) r[k] = _mm256_sub_ps(r[k], _mm256_set1_ps(k < 2 ? m0 : m1));
  }
}

// Where decoded weights go. A decoder hands a Sink elements i..i+31 of the block (i a multiple of 32, in
// increasing order) either as 32 int8 quants with their sub-scales, `put32q<kMin>(i, v, d0, m0, d1, m1)`
// (the values of to_f32x32; kMin: value = d q - m with UNSIGNED quants q in 0..31, the K-quants with sub-mins:
// Q2_K, Q4_K, Q5_K), or as 32 floats, `put32f(i, w)` (the i-quants' scalar decoders). A sink
// converts them with its tier's lanes (avx512: 16 at a time, weight_kernels_quant_avx512.cpp) -- the same
// per-element operations, so the same values -- and stores them (StoreSink) or multiplies them into a
// dot's accumulators at once (the kernels' DotSinks): the very products, in the very order, that the dot
// would apply to them after a store and a reload.
// In an unnamed namespace: each tier's file gets its own (differently compiled) copy, not one shared
// inline definition the linker would pick for both.
namespace {
struct StoreSink {
  float* y;
  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float m0, float d1, float m1) const {
    __m256 r[4];
    to_f32x32<kMin>(v, d0, m0, d1, m1, r);
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + i + 8 * k, r[k]);
  }
  __attribute__((always_inline)) void put32f(int i, const float* w) const {
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + i + 8 * k, _mm256_loadu_ps(w + 8 * k));
  }
};
}  // namespace

template <bool kMin, class Sink>
K3_QDECODE void put32(Sink& s, int i, __m256i v, float d0, float m0, float d1, float m1) {
  s.template put32q<kMin>(i, v, d0, m0, d1, m1);
}

// The f16 scale at p: F16C's conversion is exact (subnormals included), as f16_to_f32.
K3_QDECODE float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

K3_QDECODE __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
K3_QDECODE __m256i bytes(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
// Bits [s, s + w) of every byte (s + w <= 8): 16-bit shifts move bits across bytes only above the mask.
K3_QDECODE __m256i bit_field(__m256i v, int s, int mask) { return _mm256_and_si256(_mm256_srli_epi16(v, s), bytes(mask)); }

template <class Sink>
K3_QDECODE void decode_q8_0(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  put32<false>(out, 0, load32(b + 2), d, 0, d, 0);
}

template <class Sink>
K3_QDECODE void decode_q4_k(const uint8_t* b, Sink& out) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (int j = 0; j < 8; j += 2) {
    int sc, m;
    quant::k4_scale_min(j, b + 4, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    quant::k4_scale_min(j + 1, b + 4, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const __m256i q = load32(b + 16 + 16 * j);
    put32<true>(out, 32 * j, bit_field(q, 0, 0xF), d1, m1, d1, m1);
    put32<true>(out, 32 * j + 32, bit_field(q, 4, 0xF), d2, m2, d2, m2);
  }
}

template <class Sink>
K3_QDECODE void decode_q5_k(const uint8_t* b, Sink& out) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const __m256i qh = load32(b + 16);
  for (int j = 0; j < 8; j += 2) {
    int sc, m;
    quant::k4_scale_min(j, b + 4, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    quant::k4_scale_min(j + 1, b + 4, &sc, &m);
    const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
    const __m256i q = load32(b + 48 + 16 * j);
    const __m256i lo = _mm256_or_si256(bit_field(q, 0, 0xF), _mm256_slli_epi16(bit_field(qh, j, 1), 4));
    const __m256i hi = _mm256_or_si256(bit_field(q, 4, 0xF), _mm256_slli_epi16(bit_field(qh, j + 1, 1), 4));
    put32<true>(out, 32 * j, lo, d1, m1, d1, m1);
    put32<true>(out, 32 * j + 32, hi, d2, m2, d2, m2);
  }
}

template <class Sink>
K3_QDECODE void decode_q6_k(const uint8_t* b, Sink& out) {
  const float d = f16_at(b + 208);
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int h = 0; h < 2; ++h, sc += 8) {
    const __m256i ql0 = load32(b + 64 * h), ql1 = load32(b + 64 * h + 32), qh = load32(b + 128 + 32 * h);
    const __m256i q[4] = {
        _mm256_or_si256(bit_field(ql0, 0, 0xF), _mm256_slli_epi16(bit_field(qh, 0, 3), 4)),
        _mm256_or_si256(bit_field(ql1, 0, 0xF), _mm256_slli_epi16(bit_field(qh, 2, 3), 4)),
        _mm256_or_si256(bit_field(ql0, 4, 0xF), _mm256_slli_epi16(bit_field(qh, 4, 3), 4)),
        _mm256_or_si256(bit_field(ql1, 4, 0xF), _mm256_slli_epi16(bit_field(qh, 6, 3), 4)),
    };
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)  // quants k * 32 + l: sub-blocks 2k (l < 16) and 2k + 1; the value is (d * s) * q
      put32<false>(out, 128 * h + 32 * k, _mm256_sub_epi8(q[k], bytes(32)), d * static_cast<float>(sc[2 * k]), 0,
                   d * static_cast<float>(sc[2 * k + 1]), 0);
  }
}

template <class Sink>
K3_QDECODE void decode_q3_k(const uint8_t* b, Sink& out) {
  const float d = f16_at(b + 108);
  const __m256i hm = load32(b);
  int is = 0;
  for (int h = 0; h < 2; ++h) {
    const __m256i q = load32(b + 32 + 32 * h);
    for (int k = 0; k < 4; ++k, is += 2) {
      // q - 4 where the high bit (bit 4h + k of hmask) is clear: low2 + 4 * hbit - 4.
      const __m256i hb = _mm256_slli_epi16(bit_field(hm, 4 * h + k, 1), 2);
      const __m256i v = _mm256_sub_epi8(_mm256_or_si256(bit_field(q, 2 * k, 3), hb), bytes(4));
      put32<false>(out, 128 * h + 32 * k, v, d * static_cast<float>(quant::q3_k_scale(b + 96, is)), 0,
                   d * static_cast<float>(quant::q3_k_scale(b + 96, is + 1)), 0);
    }
  }
}

template <class Sink>
K3_QDECODE void decode_q2_k(const uint8_t* b, Sink& out) {
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  for (int h = 0; h < 2; ++h) {
    const __m256i q = load32(b + 16 + 32 * h);
    for (int k = 0; k < 4; ++k) {
      const int s0 = b[8 * h + 2 * k], s1 = b[8 * h + 2 * k + 1];  // the sub-blocks' (scale, min) bytes
      const float dl0 = d * static_cast<float>(s0 & 0xF), ml0 = dmin * static_cast<float>(s0 >> 4);
      const float dl1 = d * static_cast<float>(s1 & 0xF), ml1 = dmin * static_cast<float>(s1 >> 4);
      put32<true>(out, 128 * h + 32 * k, bit_field(q, 2 * k, 3), dl0, ml0, dl1, ml1);
    }
  }
}

template <class Sink>
K3_QDECODE void decode_iq4_xs(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  const unsigned scales_h = b[2] | (b[3] << 8);
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues));
  const __m256i table = _mm256_broadcastsi128_si256(levels);
  for (int ib = 0; ib < 8; ib += 2) {
    // Two sub-blocks (16 bytes each): low nibbles are elements 0-15, high nibbles 16-31 of each.
    const __m256i q = load32(b + 8 + 16 * ib);
    const __m256i lo = _mm256_shuffle_epi8(table, bit_field(q, 0, 0xF));
    const __m256i hi = _mm256_shuffle_epi8(table, bit_field(q, 4, 0xF));
    float dl[2];
    for (int k = 0; k < 2; ++k) {
      const int i = ib + k;
      const int ls = ((b[4 + i / 2] >> (4 * (i % 2))) & 0xF) | (((scales_h >> (2 * i)) & 3) << 4);
      dl[k] = d * static_cast<float>(ls - 32);
    }
    // Sub-block ib: its low nibbles (lane 0-15 of lo) then high nibbles (lanes 0-15 of hi).
    put32<false>(out, 32 * ib, _mm256_permute2x128_si256(lo, hi, 0x20), dl[0], 0, dl[0], 0);
    put32<false>(out, 32 * ib + 32, _mm256_permute2x128_si256(lo, hi, 0x31), dl[1], 0, dl[1], 0);
  }
}

// ---- ggml's 32-element formats (block_decode.h's layouts): low nibbles are elements 0-15, high 16-31 ----

// The 16 quant bytes at qs as 32 nibbles in element order, plus Q5's fifth bits (bit j of hbits -> 16 in
// byte j: each byte picks its hbits byte, tests its own bit, and keeps 0x10 where set).
K3_QDECODE __m256i nibbles32(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)), m = _mm_set1_epi8(0x0F);
  return _mm256_setr_m128i(_mm_and_si128(q, m), _mm_and_si128(_mm_srli_epi16(q, 4), m));
}
K3_QDECODE __m256i fifth_bits(uint32_t hbits) {
  const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(hbits)),
                                          _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit), bytes(0x10));
}

// Q4_0 / Q5_0: (q - 8) d / (q - 16) d, signed quants; Q4_1 / Q5_1: q d + m, unsigned quants with the min
// handed on negated (the Sink computes d q - m', and d q - (-m) is d q + m exactly).
template <bool kFive, bool kMin, class Sink>
K3_QDECODE void decode_q45(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  const float m = kMin ? f16_at(b + 2) : 0.f;
  const int qs = (kMin ? 4 : 2) + (kFive ? 4 : 0);
  __m256i v = nibbles32(b + qs);
  if constexpr (kFive) v = _mm256_or_si256(v, fifth_bits(quant::u32_at(b + (kMin ? 4 : 2))));
  if constexpr (!kMin) v = _mm256_sub_epi8(v, bytes(kFive ? 16 : 8));
  put32<kMin>(out, 0, v, d, -m, d, -m);
}

template <class Sink>
K3_QDECODE void decode_iq4_nl(const uint8_t* b, Sink& out) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues)));
  const float d = f16_at(b);
  put32<false>(out, 0, _mm256_shuffle_epi8(table, nibbles32(b + 2)), d, 0, d, 0);
}

// ---- codebook i-quants (block_decode_iq.h's layouts): the grid entries' magnitudes as 32 int8, negated
// under their sign bytes, then the sub-scale as for the K formats. db * (-g) = -(db * g): the products are
// exact and no grid value is 0 (so no -0 question), the same values as the scalar db * g * (+-1).

// Sign bytes s[0..3] (bit j negates weight j of group k) -> 0xFF per negated byte of a 32-byte vector.
K3_QDECODE __m256i sign_mask(uint32_t s4) {
  const __m256i rep = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(s4)),
                                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2,
                                                           2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_cmpeq_epi8(_mm256_and_si256(rep, bit), bit);
}
K3_QDECODE __m256i apply_signs(__m256i mag, uint32_t s4) {
  const __m256i m = sign_mask(s4);
  return _mm256_sub_epi8(_mm256_xor_si256(mag, m), m);
}
// The 128 7-bit sign codes of IQ2_XXS / IQ2_XS / IQ3_XXS as byte masks (0xFF per negated weight of 8): ggml's
// ksigns_iq2xs[i] (quant::kIq2Signs) is i with bit 7 set when i has an odd number of bits, so the masks are computed
// at compile time. One 64-bit load per 8 weights instead of a sign byte and sign_mask's arithmetic (session 42).
struct Iq2SignMasks {
  uint64_t m[128];
  constexpr Iq2SignMasks() : m() {
    for (int i = 0; i < 128; ++i) {
      const int s = i | ((__builtin_popcount(static_cast<unsigned>(i)) & 1) << 7);
      uint64_t v = 0;
      for (int j = 0; j < 8; ++j)
        if (s >> j & 1) v |= uint64_t{0xFF} << (8 * j);
      m[i] = v;
    }
  }
};
inline constexpr Iq2SignMasks kIq2SignMasks{};
// mag negated where the masks of the four 8-weight groups' codes say so.
K3_QDECODE __m256i apply_codes(__m256i mag, uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3) {
  const uint64_t* M = kIq2SignMasks.m;
  const __m256i m = _mm256_setr_epi64x(static_cast<long long>(M[c0]), static_cast<long long>(M[c1]),
                                       static_cast<long long>(M[c2]), static_cast<long long>(M[c3]));
  return _mm256_sub_epi8(_mm256_xor_si256(mag, m), m);
}
K3_QDECODE __m256i grid8x4(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3) {
  return _mm256_setr_epi64x(static_cast<long long>(g0), static_cast<long long>(g1), static_cast<long long>(g2),
                            static_cast<long long>(g3));
}

template <class Sink>
K3_QDECODE void decode_iq2_xxs(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* g = b + 2 + 8 * ib;
    const uint32_t aux = quant::u32_at(g + 4);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
    const __m256i mag = grid8x4(quant::kIq2xxsGrid[g[0]], quant::kIq2xxsGrid[g[1]], quant::kIq2xxsGrid[g[2]], quant::kIq2xxsGrid[g[3]]);
    put32<false>(out, 32 * ib, apply_codes(mag, aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127), db, 0, db, 0);
  }
}

template <class Sink>
K3_QDECODE void decode_iq2_xs(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t sc = b[66 + ib];
    const float db0 = d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f, db1 = d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f;
    unsigned q[4];
    for (int l = 0; l < 4; ++l) q[l] = quant::u16_at(b + 2 + 2 * (4 * ib + l));
    const __m256i mag = grid8x4(quant::kIq2xsGrid[q[0] & 511], quant::kIq2xsGrid[q[1] & 511], quant::kIq2xsGrid[q[2] & 511],
                                quant::kIq2xsGrid[q[3] & 511]);
    put32<false>(out, 32 * ib, apply_codes(mag, q[0] >> 9, q[1] >> 9, q[2] >> 9, q[3] >> 9), db0, 0, db1, 0);
  }
}

template <class Sink>
K3_QDECODE void decode_iq2_s(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t sc = b[74 + ib], qh = b[66 + ib];
    const float db0 = d * (0.5f + static_cast<float>(sc & 0xF)) * 0.25f, db1 = d * (0.5f + static_cast<float>(sc >> 4)) * 0.25f;
    const uint8_t* q = b + 2 + 4 * ib;
    auto idx = [&](int l) { return q[l] | (((qh >> (2 * l)) & 3) << 8); };
    const __m256i mag = grid8x4(quant::kIq2sGrid[idx(0)], quant::kIq2sGrid[idx(1)], quant::kIq2sGrid[idx(2)], quant::kIq2sGrid[idx(3)]);
    put32<false>(out, 32 * ib, apply_signs(mag, quant::u32_at(b + 34 + 4 * ib)), db0, 0, db1, 0);
  }
}

template <class Sink>
K3_QDECODE void decode_iq3_xxs(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* q = b + 2 + 8 * ib;
    const uint32_t aux = quant::u32_at(b + 66 + 4 * ib);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    const uint32_t* G = quant::kIq3xxsGrid;
    const __m256i mag = _mm256_setr_epi32(static_cast<int>(G[q[0]]), static_cast<int>(G[q[1]]), static_cast<int>(G[q[2]]),
                                          static_cast<int>(G[q[3]]), static_cast<int>(G[q[4]]), static_cast<int>(G[q[5]]),
                                          static_cast<int>(G[q[6]]), static_cast<int>(G[q[7]]));
    put32<false>(out, 32 * ib, apply_codes(mag, aux & 127, (aux >> 7) & 127, (aux >> 14) & 127, (aux >> 21) & 127), db, 0, db, 0);
  }
}

template <class Sink>
K3_QDECODE void decode_iq3_s(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const uint8_t* q = b + 2 + 8 * ib;
    const unsigned qh = b[66 + ib];
    const float db = d * static_cast<float>(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF));
    const uint32_t* G = quant::kIq3sGrid;
    int g[8];
    for (int k = 0; k < 8; ++k) g[k] = static_cast<int>(G[q[k] | (((qh >> k) & 1) << 8)]);
    const __m256i mag = _mm256_setr_epi32(g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]);
    put32<false>(out, 32 * ib, apply_signs(mag, quant::u32_at(b + 74 + 4 * ib)), db, 0, db, 0);
  }
}

// IQ1_S / IQ1_M: dl (g + delta), g in {-1, 0, 1}, delta = +-1/8, is (dl / 8) (8 g +- 1): int8 quants 8 g + s
// (odd, never 0) under the sub-scale dl / 8 -- both forms are exact products of the same real value.
K3_QDECODE __m256i iq1_quants(__m256i g, __m256i s) { return _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), s); }
K3_QDECODE long long iq1_sign_bytes(unsigned negative) { return negative ? -1LL : 0x0101010101010101LL; }

template <class Sink>
K3_QDECODE void decode_iq1_s(const uint8_t* b, Sink& out) {
  const float d = f16_at(b);
  for (int ib = 0; ib < 8; ++ib) {
    const unsigned qh = quant::u16_at(b + 34 + 2 * ib);
    const float dl8 = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1) * 0.125f;
    const uint8_t* q = b + 2 + 4 * ib;
    auto idx = [&](int l) { return q[l] | (((qh >> (3 * l)) & 7) << 8); };
    const __m256i g = grid8x4(quant::kIq1sGrid[idx(0)], quant::kIq1sGrid[idx(1)], quant::kIq1sGrid[idx(2)], quant::kIq1sGrid[idx(3)]);
    put32<false>(out, 32 * ib, iq1_quants(g, _mm256_set1_epi64x(iq1_sign_bytes((qh >> 15) & 1))), dl8, 0, dl8, 0);
  }
}

// IQ1_M's four 8-value groups' shift bytes (+1, or -1 where bit j of the 4-bit code is set), one 32-byte row per code:
// one load instead of four selects and a vector build (session 43).
struct Iq1mShifts {
  alignas(32) uint64_t s[16][4];
  constexpr Iq1mShifts() : s() {
    for (int c = 0; c < 16; ++c)
      for (int j = 0; j < 4; ++j) s[c][j] = (c >> j & 1) ? ~uint64_t{0} : 0x0101010101010101ULL;
  }
};
inline constexpr Iq1mShifts kIq1mShifts{};

template <class Sink>
K3_QDECODE void decode_iq1_m(const uint8_t* b, Sink& out) {
  unsigned sc[4];
  for (int i = 0; i < 4; ++i) sc[i] = quant::u16_at(b + 48 + 2 * i);
  // F16C, as f16_at (exact, subnormals included; the scalar f16_bits_to_float took ldexp per block)
  const float d = _cvtsh_ss(static_cast<unsigned short>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000)));
  for (int ib = 0; ib < 8; ++ib) {
    const float dl0 = d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) * 0.125f;
    const float dl1 = d * static_cast<float>(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) * 0.125f;
    const uint8_t* q = b + 4 * ib;
    const unsigned h0 = b[32 + 2 * ib], h1 = b[32 + 2 * ib + 1];
    const __m256i g = grid8x4(quant::kIq1sGrid[q[0] | ((h0 & 7) << 8)], quant::kIq1sGrid[q[1] | (((h0 >> 4) & 7) << 8)],
                              quant::kIq1sGrid[q[2] | ((h1 & 7) << 8)], quant::kIq1sGrid[q[3] | (((h1 >> 4) & 7) << 8)]);
    const unsigned neg = ((h0 >> 3) & 1) | ((h0 >> 6) & 2) | ((h1 >> 1) & 4) | ((h1 >> 4) & 8);
    const __m256i s = load32(reinterpret_cast<const uint8_t*>(kIq1mShifts.s[neg]));
    put32<false>(out, 32 * ib, iq1_quants(g, s), dl0, 0, dl1, 0);
  }
}

// A format without a SIMD decoder here: its scalar decoder (block_decode.h) into a
// buffer, handed on 32 at a time.
template <WeightFormat F, class Sink>
K3_QDECODE void decode_scalar_into(const uint8_t* b, Sink& s) {
  constexpr int E = weight_layout(F).block_elems;
  alignas(64) float w[E];
  quant::decode_block<F>(b, w);
  for (int i = 0; i < E; i += 32) s.put32f(i, w + i);
}

template <WeightFormat F, class Sink>
K3_QDECODE void decode_into(const uint8_t* b, Sink& y) {
  if constexpr (F == WeightFormat::Q8_0) decode_q8_0(b, y);
  else if constexpr (F == WeightFormat::Q4_K) decode_q4_k(b, y);
  else if constexpr (F == WeightFormat::Q5_K) decode_q5_k(b, y);
  else if constexpr (F == WeightFormat::Q6_K) decode_q6_k(b, y);
  else if constexpr (F == WeightFormat::Q3_K) decode_q3_k(b, y);
  else if constexpr (F == WeightFormat::Q2_K) decode_q2_k(b, y);
  else if constexpr (F == WeightFormat::IQ4_XS) decode_iq4_xs(b, y);
  else if constexpr (F == WeightFormat::IQ2_XXS) decode_iq2_xxs(b, y);
  else if constexpr (F == WeightFormat::IQ2_XS) decode_iq2_xs(b, y);
  else if constexpr (F == WeightFormat::IQ2_S) decode_iq2_s(b, y);
  else if constexpr (F == WeightFormat::IQ3_XXS) decode_iq3_xxs(b, y);
  else if constexpr (F == WeightFormat::IQ3_S) decode_iq3_s(b, y);
  else if constexpr (F == WeightFormat::IQ1_S) decode_iq1_s(b, y);
  else if constexpr (F == WeightFormat::IQ1_M) decode_iq1_m(b, y);
  else if constexpr (F == WeightFormat::Q4_0) decode_q45<false, false>(b, y);
  else if constexpr (F == WeightFormat::Q5_0) decode_q45<true, false>(b, y);
  else if constexpr (F == WeightFormat::Q4_1) decode_q45<false, true>(b, y);
  else if constexpr (F == WeightFormat::Q5_1) decode_q45<true, true>(b, y);
  else if constexpr (F == WeightFormat::IQ4_NL) decode_iq4_nl(b, y);
  else decode_scalar_into<F>(b, y);
}

// The block into y[0 .. block_elems).
template <WeightFormat F>
K3_QDECODE void decode_block(const uint8_t* b, float* y) {
  StoreSink s{y};
  decode_into<F>(b, s);
}

}  // namespace k3::cpu::qsimd

#undef K3_QDECODE
