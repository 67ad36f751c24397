// AVX-512 (F/BW/VL/DQ) building blocks of the avx512 kernel tier (weight_kernels_avx512.cpp), the
// counterpart of weight_simd.h: 16-lane fp32 FMA, weights widened exactly to fp32 in registers (no bf16
// dot instructions, so every product is the exact fp32 product, as in the avx2 tier).
//
// Only the functions defined between the push/pop pragmas below are compiled for AVX-512, so the rest
// of the binary (and every inline function of the headers included first) still runs on an AVX2-only
// CPU; row_kernels() reaches these only when the CPU has AVX-512 (cpu_isa.h). Include this header only
// from files of the avx512 tier.
#pragma once
#include <immintrin.h>

#include <array>
#include <bit>
#include <cstdint>

#include "k3/core/weight.h"

// K3_AVX512_BEGIN ... K3_AVX512_END: the functions defined in between are compiled for AVX-512 (GCC's target
// pragma; clang ignores it, so there its attribute pragma applies the same target per function).
#if defined(__clang__)
#define K3_AVX512_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq\"))), apply_to = function)")
#define K3_AVX512_END _Pragma("clang attribute pop")
#else
#define K3_AVX512_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq\")")
#define K3_AVX512_END _Pragma("GCC pop_options")
#endif

// K3_AVX512BF16_BEGIN ... K3_AVX512BF16_END: the same for the avx512bf16 tier (weight_kernels_avx512bf16.cpp),
// which adds AVX512_BF16 (vcvtne2ps2bf16, vdpbf16ps) and AVX512_VNNI (vpdpbusd).
#if defined(__clang__)
#define K3_AVX512BF16_BEGIN                                                                                      \
  _Pragma(                                                                                                       \
      "clang attribute push(__attribute__((target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx512vbmi\"))), apply_to = function)")
#define K3_AVX512BF16_END _Pragma("clang attribute pop")
#else
#define K3_AVX512BF16_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vnni,avx512vbmi\")")
#define K3_AVX512BF16_END _Pragma("GCC pop_options")
#endif

namespace k3::cpu::simd512 {

// 0.5 x 2^(s - 127) = 2^(s - 128) per E8M0 byte (the 0.5: decoded E2M1 values are doubled); s = 255 is NaN.
// The same bits as 0.5f * e8m0_to_f32(s) (s = 0, 1: the exact denormals 2^-128, 2^-127), read with one
// broadcast instead of a branchy scalar conversion per group.
constexpr std::array<float, 256> make_half_e8m0() {
  std::array<float, 256> t{};
  for (int s = 0; s < 256; ++s) {
    const uint32_t u = s == 255 ? 0x7fc00000u : s == 0 ? 0x00200000u : s == 1 ? 0x00400000u : uint32_t(s - 1) << 23;
    t[static_cast<size_t>(s)] = std::bit_cast<float>(u);
  }
  return t;
}
inline constexpr std::array<float, 256> kHalfE8m0 = make_half_e8m0();

}  // namespace k3::cpu::simd512

K3_AVX512_BEGIN

namespace k3::cpu::simd512 {

// Lanes [0, k) of a 16-lane vector (k in 1..16).
inline __mmask16 first_lanes(int64_t k) { return static_cast<__mmask16>((1u << k) - 1u); }

inline __m512 widen_bf16(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }

// Weight loaders: 16 values, or the first k under `m` (masked lanes read nothing and give 0).
struct LoadF32 {
  __m512 operator()(const float* p) const { return _mm512_loadu_ps(p); }
  __m512 operator()(const float* p, __mmask16 m) const { return _mm512_maskz_loadu_ps(m, p); }
};
struct LoadBf16 {
  __m512 operator()(const uint16_t* p) const {
    return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  __m512 operator()(const uint16_t* p, __mmask16 m) const { return widen_bf16(_mm256_maskz_loadu_epi16(m, p)); }
};
struct LoadF16 {
  __m512 operator()(const uint16_t* p) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  __m512 operator()(const uint16_t* p, __mmask16 m) const { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p)); }
};

// The end of every float dot of this tier, after the 32-wide main loop stopped at i: one more full 16
// step into a0 if there is one, then the last cols % 16 values masked into a1, then one reduction. No
// scalar tail, so no fma-contraction question; the zeroed lanes add exact zeros.
template <class Wt, class Load>
inline float finish_dot(__m512 a0, __m512 a1, const Wt* w, const float* x, int64_t i, int64_t n, Load load) {
  if (i + 16 <= n) {
    a0 = _mm512_fmadd_ps(load(w + i), _mm512_loadu_ps(x + i), a0);
    i += 16;
  }
  if (i < n) {
    const __mmask16 m = first_lanes(n - i);
    a1 = _mm512_fmadd_ps(load(w + i, m), _mm512_maskz_loadu_ps(m, x + i), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// E2M1 values doubled, as int8, indexed by nibble (as weight_simd.h).
inline __m128i e2m1x2_table() { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }
// The same + 12 (0..24, unsigned): vpdpbusd's unsigned operand, the activations on its signed side (the avx512bf16
// tier's one-token MXFP4 rows, mxfp4_rowblocks).
inline __m128i e2m1x2_plus12_table() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }
// vpmultishiftqb control for 32 packed bytes broadcast to both halves of a register: byte i of each qword of the low
// half <- the low nibble of byte i of the same qword, of the high half <- its high nibble (vpermb then maps each
// nibble through a 16-entry table, which it reads mod 64: broadcast the table to all four 128-bit lanes).
inline __m512i nibble_halves_ctrl() {
  return _mm512_set_epi64(0x3C342C241C140C04LL, 0x3C342C241C140C04LL, 0x3C342C241C140C04LL, 0x3C342C241C140C04LL,
                          0x3830282018100800LL, 0x3830282018100800LL, 0x3830282018100800LL, 0x3830282018100800LL);
}

// One MXFP4 group (16 bytes = 32 weights, in order) as 2 vectors of 16 floats, doubled, unscaled.
inline void decode_mxfp4_group(const uint8_t* p, __m512 out[2]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i lo = _mm_shuffle_epi8(e2m1x2_table(), _mm_and_si128(b, _mm_set1_epi8(0x0f)));
  const __m128i hi = _mm_shuffle_epi8(e2m1x2_table(), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f)));
  out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(lo, hi)));  // weights 0..15
  out[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(lo, hi)));  // weights 16..31
}

// ggml's MXFP4 block (MXFP4_GGML): the 16 bytes after the scale, element j = low nibble of byte j, j + 16 =
// its high nibble; decoded into the vectors decode_mxfp4_group gives for the same values.
inline void decode_mxfp4_ggml_group(const uint8_t* qs, __m512 out[2]) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_shuffle_epi8(e2m1x2_table(), _mm_and_si128(b, _mm_set1_epi8(0x0f)))));
  out[1] = _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_shuffle_epi8(e2m1x2_table(), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f)))));
}

// Group g of a row in either MXFP4 layout (as weight_simd.h): weights into w, returns the E8M0 scale byte.
template <WeightFormat F>
inline uint8_t load_mxfp4_group(const uint8_t* row, const uint8_t* scales, int64_t g, __m512 w[2]) {
  if constexpr (F == WeightFormat::MXFP4_GGML) {
    decode_mxfp4_ggml_group(row + g * 17 + 1, w);
    return row[g * 17];
  } else {
    decode_mxfp4_group(row + g * 16, w);
    return scales[g];
  }
}

// One group's contribution before scaling, in the one order every MXFP4 path of this tier uses.
inline __m512 mxfp4_group_dot(const __m512 w[2], const float* xg) {
  return _mm512_fmadd_ps(w[1], _mm512_loadu_ps(xg + 16), _mm512_mul_ps(w[0], _mm512_loadu_ps(xg)));
}

inline __m512 mxfp4_scale(uint8_t s) { return _mm512_set1_ps(kHalfE8m0[s]); }

}  // namespace k3::cpu::simd512

K3_AVX512_END
