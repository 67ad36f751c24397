// AVX2 building blocks shared by the CPU backend's single-token row kernels (weight_kernels.cpp) and its
// multi-token tiles (weight_gemm.cpp). Private to those two files: both must use the very same
// conversions, reductions and loop shapes, since a token's result has to be bit-identical whichever path
// computes it (the batch-invariance contract of weight_kernels.h).
#pragma once
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "k3/core/weight.h"

namespace k3::cpu::simd {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// One dot-product loop for every float format, templated over how 8 weights are loaded (`Load`, an
// AVX2 conversion) and how one is converted in the tail (`Scalar`): two 8-lane accumulators, 16 per
// step, then the same hsum and fma tail. weight_gemm.cpp's float_tile repeats exactly this per (row,
// token) pair, which is what makes matmul's n > 1 path give the bits of n == 1 (batch invariance).
// The scalar tail uses explicit fma: left to the compiler, `s += a * b` was contracted in some places
// and not in others, so a row with cols % 16 != 0 gave different bits through two paths
// (CpuKernels.Matmul*, issue 12).
template <class T, class Load, class Scalar>
inline float dot_loop(const T* w, const float* x, int64_t n, Load load8, Scalar to_f32) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) s = std::fma(to_f32(w[i]), x[i], s);
  return s;
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// E2M1 values doubled, as int8, indexed by nibble: pshufb maps 16 nibbles at once. A function, not a
// global, so that it folds into a constant load (no dynamic initialisation in every includer).
inline __m128i e2m1x2_table() { return _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12); }
// The same + 12 (0..24, unsigned): the unsigned operand of vpdpbusd / vpmaddubsw, the activations on the signed side and
// -12 x their sum added once (the MXFP4 row-block product's two forms, mxfp4_rowblocks_forms.h).
inline __m128i e2m1x2_plus12_table() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }

// Decodes one MXFP4 group (16 packed bytes = 32 weights, in order) into 4 vectors of 8 floats,
// without the scale and doubled (the caller multiplies by 0.5 * 2^(s-127)).
inline void decode_mxfp4_group(const uint8_t* p, __m256 out[4]) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
  __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
  lo = _mm_shuffle_epi8(e2m1x2_table(), lo);
  hi = _mm_shuffle_epi8(e2m1x2_table(), hi);
  __m128i e0 = _mm_unpacklo_epi8(lo, hi);  // weights 0..15 (element 2i = low nibble of byte i)
  __m128i e1 = _mm_unpackhi_epi8(lo, hi);  // weights 16..31
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e0));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e0, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e1));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(e1, 8)));
}

// ggml's MXFP4 block (MXFP4_GGML): the 16 bytes after its scale byte, element j = low nibble of byte j,
// element j + 16 = its high nibble. Decoded into the vectors decode_mxfp4_group gives for the same
// values, so that both layouts run the very same arithmetic (a GGUF gives the HF checkpoint's bits).
inline void decode_mxfp4_ggml_group(const uint8_t* qs, __m256 out[4]) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  __m128i lo = _mm_shuffle_epi8(e2m1x2_table(), _mm_and_si128(b, _mm_set1_epi8(0x0f)));                  // 0..15
  __m128i hi = _mm_shuffle_epi8(e2m1x2_table(), _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f)));  // 16..31
  out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  out[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  out[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  out[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}

// Group g of a row in either MXFP4 layout (F = MXFP4: nibbles + a separate scale array; MXFP4_GGML: 17-byte
// blocks, scale first): decodes its weights into w and returns its E8M0 scale byte.
template <WeightFormat F>
inline uint8_t load_mxfp4_group(const uint8_t* row, const uint8_t* scales, int64_t g, __m256 w[4]) {
  if constexpr (F == WeightFormat::MXFP4_GGML) {
    decode_mxfp4_ggml_group(row + g * 17 + 1, w);
    return row[g * 17];
  } else {
    decode_mxfp4_group(row + g * 16, w);
    return scales[g];
  }
}

// One group's contribution before scaling: w[0..3] (decoded) against the 32 activations at xg, in the
// one order every MXFP4 path uses (a product, then three fmas).
inline __m256 mxfp4_group_dot(const __m256 w[4], const float* xg) {
  __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(xg));
  s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xg + 8), s);
  s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xg + 16), s);
  return _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xg + 24), s);
}

// The factor of group scale s (E8M0): the decoded values are doubled, hence the 0.5.
inline __m256 mxfp4_scale(uint8_t s) { return _mm256_set1_ps(0.5f * e8m0_to_f32(s)); }

}  // namespace k3::cpu::simd
