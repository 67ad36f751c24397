// 8-lane exp, tanh and sigmoid for the element-wise ops (AVX2 + FMA, the build baseline), replacing
// per-element libm calls (expf / tanhf were ~2.5% of a k3-1b decode step, and the SiTU GLU ~9% of
// prefill). Every lane's result depends only on its own input, so a value's result does not depend on
// where it sits in a buffer (the ops process tails through a padded vector: batch invariance holds).
//
// Accuracy against the exact function (tests/unit/test_vec_math.cpp, random inputs over the whole range
// plus 0, +-inf, NaN, the overflow / underflow edges):
//   exp8:     relative error <= 4 x 2^-24 where e^x >= FLT_MIN; below, absolute <= 2^-149 (denormals, then 0
//             for x < -103.98); +inf for x > 88.7228; exp8(-inf) = 0, exp8(NaN) = NaN.
//   tanh8:    relative error <= 4 x 2^-24 everywhere (odd Taylor polynomial to x^19 for |x| < 0.55, where
//             1 - 2 / (e^2|x| + 1) would cancel; +-1 exactly beyond ~9.1); tanh8(+-inf) = +-1, NaN stays NaN.
//   sigmoid8: 1 / (1 + exp8(-x)): relative <= 6 x 2^-24 where the result is >= FLT_MIN; below
//             (x < -87.3) absolute <= FLT_MIN (e^-x overflows past x = -88.72: the result is 0, as
//             1 / (1 + expf(-x)) gives).
//   softplus8: log(1 + e^x); relative error <= 4 x 2^-24 where the result is >= FLT_MIN (the Kimi-Linear KDA
//             gate; it replaces a log1pf + expf per value, 2% of a kl-1b prefill).
// (glibc's expf / tanhf are within 1-2 ulp; the GLU tests' tolerances hold for either.)
#pragma once
#include <immintrin.h>

namespace k3::cpu {

inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.72283935546875f);  // largest x with e^x < FLT_MAX (rounded up)
  const __m256 lo = _mm256_set1_ps(-104.0f);             // e^x < 2^-150 below: rounds to 0
  const __m256 xc = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
  // x = n ln2 + r, |r| <= ln2 / 2; ln2 split so n * ln2_hi is exact for |n| <= 2^15.
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), xc);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  // e^r: Taylor to r^7 (truncation <= 0.35^8 / 8! = 6e-9 relative).
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n as two normal factors 2^(n/2) 2^(n - n/2): n in [-150, 128] has no single fp32 power of two
  // at either end; the second product rounds once into the denormals.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, hi, _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // NaN in, NaN out
}

inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  // |x| >= 0.55: 1 - 2 / (e^2a + 1) (the subtraction loses at most one bit: 2 / (e^1.1 + 1) < 0.5).
  const __m256 e = exp8(_mm256_add_ps(a, a));
  const __m256 big = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                   _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  // |x| < 0.55: tanh a = a + a^3 q(a^2), Taylor coefficients 2^2k (2^2k - 1) B_2k / (2k)! to a^19
  // (truncation < 1e-9 relative at 0.55).
  const __m256 a2 = _mm256_mul_ps(a, a);
  __m256 q = _mm256_set1_ps(-2.3912911424355248e-04f);
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(5.9002744094558600e-04f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-1.4558343870513183e-03f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(3.5921280365724810e-03f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-8.8632355299021970e-03f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(2.1869488536155203e-02f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-5.3968253968253970e-02f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(1.3333333333333333e-01f));
  q = _mm256_fmadd_ps(q, a2, _mm256_set1_ps(-3.3333333333333333e-01f));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(a, a2), q, a);
  const __m256 t = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.55f), _CMP_LT_OQ));
  return _mm256_or_ps(t, sign);  // NaN: big is NaN (exp8 keeps it), the sign bit is harmless
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_xor_ps(x, _mm256_set1_ps(-0.0f)))));
}

// log(1 + t) for t in [0, 1] (softplus8's use): u = 1 + t rounded, log u by Cephes' logf reduction and
// polynomial (u = 2^e m, m in [sqrt(1/2), sqrt(2))), plus the rounding of u corrected to first order,
// (t - (u - 1)) / u, so tiny t give t itself.
inline __m256 log1p01_8(__m256 t) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 u = _mm256_add_ps(one, t);
  const __m256 corr = _mm256_div_ps(_mm256_sub_ps(t, _mm256_sub_ps(u, one)), u);
  const __m256i bits = _mm256_castps_si256(u);
  __m256 e = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(126)));
  __m256 m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));  // [0.5, 1)
  const __m256 small = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm256_sub_ps(e, _mm256_and_ps(one, small));
  const __m256 x = _mm256_sub_ps(_mm256_add_ps(m, _mm256_and_ps(m, small)), one);
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 y = _mm256_set1_ps(7.0376836292e-2f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.1514610310e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.1676998740e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.2420140846e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.4249322787e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-1.6668057665e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(2.0000714765e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(-2.4999993993e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(3.3333331174e-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, x), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fnmadd_ps(_mm256_set1_ps(0.5f), z, y);
  const __m256 lg = _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(x, y));
  return _mm256_add_ps(lg, corr);
}

// softplus(x) = log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x, e^x itself (to a few
// ulp) for very negative x. softplus8(+inf) = +inf, (-inf) = 0, NaN stays NaN. Bound: test_vec_math.cpp.
inline __m256 softplus8(__m256 x) {
  const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 r = _mm256_add_ps(_mm256_max_ps(x, _mm256_setzero_ps()), log1p01_8(exp8(_mm256_sub_ps(_mm256_setzero_ps(), a))));
  return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));  // max_ps would drop a NaN x
}

// out[i] = fn(a[i], b[i]) over count floats, 8 at a time; the tail goes through zero-padded vectors, so
// every element gets the same lanes' arithmetic wherever it sits. out may alias a or b.
template <typename F>
inline void zip8(const float* a, const float* b, float* out, long count, F&& fn) {
  long i = 0;
  for (; i + 8 <= count; i += 8) _mm256_storeu_ps(out + i, fn(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  if (i < count) {
    alignas(32) float ta[8] = {}, tb[8] = {};
    for (long j = i; j < count; ++j) {
      ta[j - i] = a[j];
      tb[j - i] = b[j];
    }
    _mm256_store_ps(ta, fn(_mm256_load_ps(ta), _mm256_load_ps(tb)));
    for (long j = i; j < count; ++j) out[j] = ta[j - i];
  }
}

}  // namespace k3::cpu
