#include "k3/backend/cpu/mla_absorb.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace k3::cpu {

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {  // bf16 -> fp32: the 16 bits become the high half (exact)
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline float load1(const float* p) { return *p; }
inline float load1(const uint16_t* p) {
  const uint32_t u = static_cast<uint32_t>(*p) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// dst[j] = sum_{d < rows} q[d] w[d][j] for j < kr: each column a chain of one FMA per term, d ascending, from 0 (so
// the first term is fma(q[0], w, 0)). dst (kr floats, L1-resident) is the accumulator and the rows are read in order,
// each in one contiguous run. Until session 33: 64-column sweeps over all rows, each row read in 128-byte pieces 1 KB
// apart -- the same chains, so the same bits; from DRAM on one core 300-314 -> 235-251 us per 16 heads' key rows
// (scripts/perf/mla_absorb_speed.cpp 64, docs/perf/cpu.md session 33).
template <typename T>
void combine_rows(const T* w, int64_t rows, int64_t kr, const float* q, float* dst) {
  std::fill(dst, dst + kr, 0.f);
  const int64_t k8 = kr & ~int64_t{7};
  for (int64_t d = 0; d < rows; ++d) {
    const __m256 qd = _mm256_set1_ps(q[d]);
    const T* r = w + d * kr;
    int64_t j = 0;
    for (; j + 32 <= k8; j += 32)
      for (int u = 0; u < 4; ++u)
        _mm256_storeu_ps(dst + j + 8 * u, _mm256_fmadd_ps(qd, load8(r + j + 8 * u), _mm256_loadu_ps(dst + j + 8 * u)));
    for (; j < k8; j += 8) _mm256_storeu_ps(dst + j, _mm256_fmadd_ps(qd, load8(r + j), _mm256_loadu_ps(dst + j)));
    for (; j < kr; ++j) dst[j] = std::fma(q[d], load1(r + j), dst[j]);
  }
}

// w[0:n] . x[0:n]: two 8-lane accumulators over 16-column steps, an 8-column step, a scalar FMA tail. One row is a
// chain of n / 16 dependent FMAs; four rows side by side were faster from cache but slower from DRAM (up_v below).
template <typename T>
float dot_row(const T* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  if (i + 8 <= n) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    i += 8;
  }
  const __m256 s = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float r = _mm_cvtss_f32(h);
  for (; i < n; ++i) r = std::fma(load1(w + i), x[i], r);
  return r;
}

template <typename T>
void absorb(const T* kvb, const KvB& k, int64_t h, int64_t rope, const float* q, float* q_lat) {
  combine_rows(kvb + h * (k.nope + k.value) * k.rank, k.nope, k.rank, q, q_lat);
  std::copy(q + k.nope, q + k.nope + rope, q_lat + k.rank);
}

template <typename T>
void up_v(const T* kvb, const KvB& k, int64_t h, const float* o_lat, float* o) {
  const T* rows = kvb + (h * (k.nope + k.value) + k.nope) * k.rank;
  // One row at a time: four at once (four FMA chains) took 16 heads from 75-77 to 57-59 us from cache but from 244-265
  // to 300-303 us from DRAM on one core (scripts/perf/mla_absorb_speed.cpp, session 33); at decode kv_b is in DRAM.
  for (int64_t d = 0; d < k.value; ++d) o[d] = dot_row(rows + d * k.rank, o_lat, k.rank);
}

}  // namespace

void mla_absorb_q_head(const KvB& kvb, int64_t h, int64_t rope, const float* q, float* q_lat) {
  if (kvb.bf16)
    absorb(kvb.bf16, kvb, h, rope, q, q_lat);
  else
    absorb(kvb.f32, kvb, h, rope, q, q_lat);
}

void mla_up_v_head(const KvB& kvb, int64_t h, const float* o_lat, float* o) {
  if (kvb.bf16)
    up_v(kvb.bf16, kvb, h, o_lat, o);
  else
    up_v(kvb.f32, kvb, h, o_lat, o);
}

}  // namespace k3::cpu
