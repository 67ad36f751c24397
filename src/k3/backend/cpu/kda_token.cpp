// The KDA decode step's per-token kernels (kda_token.h): the reference loops, an AVX2 and an AVX-512 form with the
// same bits. The AVX-512 functions are compiled for AVX-512 (K3_AVX512_BEGIN below) and reached only where the CPU
// has it; everything else here is the AVX2 baseline.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 inside its AVX-512 headers (weight_kernels_avx512.cpp)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "k3/backend/cpu/kda_token.h"
#include "k3/backend/cpu/kda_vec.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/weight_simd512.h"
#include "k3/core/dtype.h"
#include "k3/core/error.h"

namespace k3::cpu {
namespace {

// ---- Reference: the loops kda_recurrent_head always ran (the compiler fuses y += a * x into one fma) ----

using kda_vec::axpy;
using kda_vec::scale;

void step_reference(int D, const float* q, const float* k, const float* v, const float* dg, float beta, float* S,
                    float* o, float* u) {
  // pass 1: S' = diag(exp g) S;  u = S'^T k
  std::fill_n(u, D, 0.f);
  for (int dk = 0; dk < D; ++dk) {
    float* Sr = S + static_cast<std::size_t>(dk) * D;
    scale(D, dg[dk], Sr);
    axpy(D, k[dk], Sr, u);
  }
  // delta = beta (v - u)
  for (int d = 0; d < D; ++d) u[d] = beta * (v[d] - u[d]);
  // pass 2: S = S' + k delta^T;  o = S^T q
  std::fill_n(o, D, 0.f);
  for (int dk = 0; dk < D; ++dk) {
    float* Sr = S + static_cast<std::size_t>(dk) * D;
    axpy(D, k[dk], u, Sr);
    axpy(D, q[dk], Sr, o);
  }
}

// ---- Avx2: per block of NB vectors (8 NB columns), u then o in registers ----

// 8 state values as fp32: a float state as is, a bf16 one widened (exact).
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
// Stores 8 fp32 values: as is, or rounded as f32_to_bf16 rounds (to nearest even, a NaN kept quiet).
inline void store8(float* p, __m256 x) { _mm256_storeu_ps(p, x); }
inline void store8(uint16_t* p, __m256 x) {
  const __m256i u = _mm256_castps_si256(x), hi = _mm256_srli_epi32(u, 16);
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(hi, _mm256_set1_epi32(1)))), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

// Pass 1 over the block's columns [c, c + 8 NB): u = (dg S)^T k, read-only; delta = beta (v - u) into delta[c ..).
template <int NB, class St>
void avx2_pass1(int D, int c, const float* k, const float* v, const float* dg, float beta, const St* S, float* delta) {
  __m256 u[NB];
  for (int j = 0; j < NB; ++j) u[j] = _mm256_setzero_ps();
  for (int dk = 0; dk < D; ++dk) {
    const St* Sr = S + static_cast<std::size_t>(dk) * D + c;
    const __m256 e = _mm256_broadcast_ss(dg + dk), kk = _mm256_broadcast_ss(k + dk);
    for (int j = 0; j < NB; ++j) u[j] = _mm256_fmadd_ps(kk, _mm256_mul_ps(e, load8(Sr + 8 * j)), u[j]);
  }
  const __m256 b = _mm256_set1_ps(beta);
  for (int j = 0; j < NB; ++j)
    _mm256_storeu_ps(delta + c + 8 * j, _mm256_mul_ps(b, _mm256_sub_ps(_mm256_loadu_ps(v + c + 8 * j), u[j])));
}

// Pass 2 over the same columns: S = dg S + k delta^T (dg S recomputed: the same product as pass 1's); o = S^T q
// from the fp32 S before a bf16 state is rounded.
template <int NB, class St>
void avx2_pass2(int D, int c, const float* q, const float* k, const float* dg, const float* delta, St* S, float* o) {
  __m256 acc[NB];
  for (int j = 0; j < NB; ++j) acc[j] = _mm256_setzero_ps();
  for (int dk = 0; dk < D; ++dk) {
    St* Sr = S + static_cast<std::size_t>(dk) * D + c;
    const __m256 e = _mm256_broadcast_ss(dg + dk), kk = _mm256_broadcast_ss(k + dk), qq = _mm256_broadcast_ss(q + dk);
    for (int j = 0; j < NB; ++j) {
      const __m256 s = _mm256_fmadd_ps(kk, _mm256_loadu_ps(delta + c + 8 * j), _mm256_mul_ps(e, load8(Sr + 8 * j)));
      store8(Sr + 8 * j, s);
      acc[j] = _mm256_fmadd_ps(qq, s, acc[j]);
    }
  }
  for (int j = 0; j < NB; ++j) _mm256_storeu_ps(o + c + 8 * j, acc[j]);
}

// Both passes of one block: the block's rows (32 KB at D = 128) stay in L1 from the first pass to the second.
template <int NB, class St>
void avx2_block(int D, int c, const float* q, const float* k, const float* v, const float* dg, float beta, St* S,
                float* o, float* delta) {
  avx2_pass1<NB>(D, c, k, v, dg, beta, S, delta);
  avx2_pass2<NB>(D, c, q, k, dg, delta, S, o);
}

template <class St>
void step_avx2(int D, const float* q, const float* k, const float* v, const float* dg, float beta, St* S, float* o,
               float* delta) {
  int c = 0;
  for (; c + 64 <= D; c += 64) avx2_block<8>(D, c, q, k, v, dg, beta, S, o, delta);
  switch ((D - c) / 8) {
    case 1: return avx2_block<1>(D, c, q, k, v, dg, beta, S, o, delta);
    case 2: return avx2_block<2>(D, c, q, k, v, dg, beta, S, o, delta);
    case 3: return avx2_block<3>(D, c, q, k, v, dg, beta, S, o, delta);
    case 4: return avx2_block<4>(D, c, q, k, v, dg, beta, S, o, delta);
    case 5: return avx2_block<5>(D, c, q, k, v, dg, beta, S, o, delta);
    case 6: return avx2_block<6>(D, c, q, k, v, dg, beta, S, o, delta);
    case 7: return avx2_block<7>(D, c, q, k, v, dg, beta, S, o, delta);
    default: return;
  }
}

}  // namespace
}  // namespace k3::cpu

K3_AVX512_BEGIN
namespace k3::cpu {
namespace {

// ---- Avx512: per block of NV vectors (16 NV columns; D = 128 is one block of whole rows), delta in registers ----
// The rows are read in order (the hardware prefetcher's stream) and u, delta and o never leave the registers.

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline void store16(float* p, __m512 x) { _mm512_storeu_ps(p, x); }
inline void store16(uint16_t* p, __m512 x) {  // f32_to_bf16's rounding (not vcvtneps2bf16: it flushes denormals)
  const __m512i u = _mm512_castps_si512(x), hi = _mm512_srli_epi32(u, 16);
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(hi, _mm512_set1_epi32(1)))), 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}

template <int NV, class St>
void avx512_block(int D, int c, const float* q, const float* k, const float* v, const float* dg, float beta, St* S,
                  float* o) {
  __m512 u[NV], acc[NV];
  for (int j = 0; j < NV; ++j) u[j] = _mm512_setzero_ps();
  for (int dk = 0; dk < D; ++dk) {  // pass 1: u = (dg S)^T k, S read only
    const St* Sr = S + static_cast<std::size_t>(dk) * D + c;
    const __m512 e = _mm512_set1_ps(dg[dk]), kk = _mm512_set1_ps(k[dk]);
    for (int j = 0; j < NV; ++j) u[j] = _mm512_fmadd_ps(kk, _mm512_mul_ps(e, load16(Sr + 16 * j)), u[j]);
  }
  const __m512 b = _mm512_set1_ps(beta);
  for (int j = 0; j < NV; ++j) {  // u becomes delta = beta (v - u)
    u[j] = _mm512_mul_ps(b, _mm512_sub_ps(_mm512_loadu_ps(v + c + 16 * j), u[j]));
    acc[j] = _mm512_setzero_ps();
  }
  for (int dk = 0; dk < D; ++dk) {  // pass 2: S = dg S + k delta^T, o = S^T q (the fp32 S, before rounding to bf16)
    St* Sr = S + static_cast<std::size_t>(dk) * D + c;
    const __m512 e = _mm512_set1_ps(dg[dk]), kk = _mm512_set1_ps(k[dk]), qq = _mm512_set1_ps(q[dk]);
    for (int j = 0; j < NV; ++j) {
      const __m512 s = _mm512_fmadd_ps(kk, u[j], _mm512_mul_ps(e, load16(Sr + 16 * j)));
      store16(Sr + 16 * j, s);
      acc[j] = _mm512_fmadd_ps(qq, s, acc[j]);
    }
  }
  for (int j = 0; j < NV; ++j) _mm512_storeu_ps(o + c + 16 * j, acc[j]);
}

template <class St>
void step_avx512(int D, const float* q, const float* k, const float* v, const float* dg, float beta, St* S, float* o) {
  int c = 0;
  for (; c + 128 <= D; c += 128) avx512_block<8>(D, c, q, k, v, dg, beta, S, o);
  switch ((D - c) / 16) {
    case 1: return avx512_block<1>(D, c, q, k, v, dg, beta, S, o);
    case 2: return avx512_block<2>(D, c, q, k, v, dg, beta, S, o);
    case 3: return avx512_block<3>(D, c, q, k, v, dg, beta, S, o);
    case 4: return avx512_block<4>(D, c, q, k, v, dg, beta, S, o);
    case 5: return avx512_block<5>(D, c, q, k, v, dg, beta, S, o);
    case 6: return avx512_block<6>(D, c, q, k, v, dg, beta, S, o);
    case 7: return avx512_block<7>(D, c, q, k, v, dg, beta, S, o);
    default: return;
  }
}

// The instantiations the dispatcher below calls (defined here, inside the AVX-512 region).
void step_avx512_f32(int D, const float* q, const float* k, const float* v, const float* dg, float beta, float* S, float* o) {
  step_avx512(D, q, k, v, dg, beta, S, o);
}
void step_avx512_bf16(int D, const float* q, const float* k, const float* v, const float* dg, float beta, uint16_t* S,
                      float* o) {
  step_avx512(D, q, k, v, dg, beta, S, o);
}

}  // namespace
}  // namespace k3::cpu
K3_AVX512_END

namespace k3::cpu {
namespace {

std::atomic<int> g_forced{-1};  // a KdaTokenKernel forced by a test, or -1

bool cpu_has_avx512() {
  const CpuFeatures& f = cpu_state().features;
  return f.os_avx512 && f.avx512f;
}

bool tier_is_avx512() {  // the tier chosen at start-up (K3_CPU_ISA or the CPU's best)
  const CpuIsa isa = active_cpu_isa();
  return isa == CpuIsa::Avx512 || isa == CpuIsa::Avx512Bf16 || isa == CpuIsa::Amx;
}

}  // namespace

bool kda_token_kernel_runs(KdaTokenKernel kernel, int D) {
  switch (kernel) {
    case KdaTokenKernel::Reference: return D > 0;
    case KdaTokenKernel::Avx2: return D > 0 && D % 8 == 0;
    case KdaTokenKernel::Avx512: return D > 0 && D % 16 == 0 && cpu_has_avx512();
  }
  return false;
}

KdaTokenKernel kda_token_kernel(int D) {
  if (const int f = g_forced.load(std::memory_order_relaxed); f >= 0 && kda_token_kernel_runs(static_cast<KdaTokenKernel>(f), D))
    return static_cast<KdaTokenKernel>(f);
  if (tier_is_avx512() && kda_token_kernel_runs(KdaTokenKernel::Avx512, D)) return KdaTokenKernel::Avx512;
  if (kda_token_kernel_runs(KdaTokenKernel::Avx2, D)) return KdaTokenKernel::Avx2;
  return KdaTokenKernel::Reference;
}

void kda_token_step(KdaTokenKernel kernel, int D, const float* q, const float* k, const float* v, const float* dg,
                    float beta, float* S, float* o, float* scratch) {
  if (!kda_token_kernel_runs(kernel, D)) throw Error("kda_token_step: the kernel cannot run this head dim on this CPU");
  switch (kernel) {
    case KdaTokenKernel::Reference: return step_reference(D, q, k, v, dg, beta, S, o, scratch);
    case KdaTokenKernel::Avx2: return step_avx2(D, q, k, v, dg, beta, S, o, scratch);
    case KdaTokenKernel::Avx512: return step_avx512_f32(D, q, k, v, dg, beta, S, o);
  }
}

void kda_token_step_bf16(KdaTokenKernel kernel, int D, const float* q, const float* k, const float* v, const float* dg,
                         float beta, uint16_t* S, float* o, float* scratch, float* wide) {
  if (!kda_token_kernel_runs(kernel, D)) throw Error("kda_token_step_bf16: the kernel cannot run this head dim on this CPU");
  switch (kernel) {
    case KdaTokenKernel::Reference: {
      const std::size_t DD = static_cast<std::size_t>(D) * D;
      for (std::size_t i = 0; i < DD; ++i) wide[i] = bf16_to_f32(S[i]);
      step_reference(D, q, k, v, dg, beta, wide, o, scratch);
      for (std::size_t i = 0; i < DD; ++i) S[i] = f32_to_bf16(wide[i]);
      return;
    }
    case KdaTokenKernel::Avx2: return step_avx2(D, q, k, v, dg, beta, S, o, scratch);
    case KdaTokenKernel::Avx512: return step_avx512_bf16(D, q, k, v, dg, beta, S, o);
  }
}

void force_kda_token_kernel_for_testing(std::optional<KdaTokenKernel> kernel) {
  g_forced.store(kernel ? static_cast<int>(*kernel) : -1, std::memory_order_relaxed);
}

}  // namespace k3::cpu
