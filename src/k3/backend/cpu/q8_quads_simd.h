// The avx512bf16 tier's int8 activations: 16 fp32 values -> 4 "quads" of 4 int8 with one fp32 scale each
// (the 4 bytes one vpdpbusd lane sums), shared by the MXFP4 kernels (weight_kernels_avx512bf16.cpp) and the
// GGUF block kernels (weight_kernels_quant_vnni.cpp). Include only inside a K3_AVX512BF16_BEGIN/END region
// (the function is compiled for the tier there; internal linkage keeps each file's copy its own).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace k3::cpu::q8 {

// 16 activations (4 quads of 4 consecutive lanes) to q + 128 bytes (16; kOffset false: q itself, int8) and
// the quads' scales (4 floats):
// d = max|x| / 127 rounded up (so no q saturates), q = round(x / d) in [-127, 127], |d q - x| <= d/2 (1 + 2^-16).
// A quad holding a NaN or an infinity gets d = NaN (x * 0 summed over the quad is NaN exactly then, else
// +0), so its outputs are NaN.
template <bool kOffset = true>
static inline __attribute__((always_inline)) void quantise_quads(__m512 v, uint8_t* q_out, float* d_out) {
  __m512 a = _mm512_abs_ps(v);
  a = _mm512_max_ps(a, _mm512_permute_ps(a, 0xB1));  // max within pairs, then within the quad (128-bit lane)
  a = _mm512_max_ps(a, _mm512_permute_ps(a, 0x4E));
  __m512 poison = _mm512_mul_ps(v, _mm512_setzero_ps());
  poison = _mm512_add_ps(poison, _mm512_permute_ps(poison, 0xB1));
  poison = _mm512_add_ps(poison, _mm512_permute_ps(poison, 0x4E));
  const __m512 d = _mm512_add_ps(
      _mm512_div_round_ps(a, _mm512_set1_ps(127.f), _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC), poison);
  // d > 0 divides; an all-zero quad (q = 0) and a NaN one (its outputs are NaN through d) divide by 1.
  const __m512 div = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_GT_OQ), _mm512_set1_ps(1.f), d);
  const __m128i q = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_div_ps(v, div)));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q_out), kOffset ? _mm_xor_si128(q, _mm_set1_epi8(static_cast<char>(0x80))) : q);
  const __m512i first_of_quad = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm_storeu_ps(d_out, _mm512_castps512_ps128(_mm512_permutexvar_ps(first_of_quad, d)));
}

}  // namespace k3::cpu::q8
