#include "k3/backend/cpu/mla_absorb.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "k3/backend/cpu/prefetch_cursor.h"
#include "k3/backend/cpu/weight_kernels.h"

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
// Rows kAheadRows ahead requested into L1 as each row starts (K3_MLA_PREFETCH=0: not, A/B): at decode kv_b comes from
// DRAM, one head's run a thread, and one core's hardware prefetcher kept too few lines in flight (session 47). A head's
// rows are one contiguous run, so one prefetch_cursor.h cursor walks it.
constexpr int64_t kAheadRows = 4;  // 4 KB of bf16 rows: 2 and 4 measured alike on one core, 8 and 16 slower
const bool g_mla_prefetch = [] {
  const char* e = std::getenv("K3_MLA_PREFETCH");
  return e == nullptr || e[0] != '0';
}();
// Requests the run's rows up to row `upto` (exclusive, clamped to `rows`) of `n` values each.
template <typename T>
struct RowsAhead {
  PrefetchCursor<0> cur;
  uintptr_t base;
  int64_t row_bytes, rows;
  RowsAhead(const T* w, int64_t n, int64_t rows_)
      : cur{reinterpret_cast<uintptr_t>(w) & ~uintptr_t{63}}, base(reinterpret_cast<uintptr_t>(w)),
        row_bytes(n * static_cast<int64_t>(sizeof(T))), rows(rows_) {}
  void through(int64_t upto) {
    if (g_mla_prefetch) cur.upto(base + static_cast<uintptr_t>(std::min(upto, rows) * row_bytes));
  }
};

template <typename T>
void combine_rows(const T* w, int64_t rows, int64_t kr, const float* q, float* dst) {
  std::fill(dst, dst + kr, 0.f);
  const int64_t k8 = kr & ~int64_t{7};
  RowsAhead<T> ahead(w, kr, rows);
  for (int64_t d = 0; d < rows; ++d) {
    ahead.through(d + 1 + kAheadRows);
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
  RowsAhead<T> ahead(rows, k.rank, k.value);
  for (int64_t d = 0; d < k.value; ++d) {
    ahead.through(d + 1 + kAheadRows);
    o[d] = dot_row(rows + d * k.rank, o_lat, k.rank);
  }
}

// The stored halves (KvB::k_b / v_b): rows [r, r + n) of W decoded exactly into out (n x W.cols values). The rows are
// whole blocks back to back, so they decode as one row of n x cols values: one call per piece, not per row.
void decode_rows(const WeightMatrix& W, int64_t r, int64_t n, float* out) {
  WeightMatrix v = W;
  v.data = W.row_data(r);
  v.scales = W.scales ? W.row_scales(r) : nullptr;
  v.rows = 1;
  v.cols = n * W.cols;
  row_kernels(W.format).dequant(v, 0, out);
}

// The stored halves' dot (mla_absorb.h): one 8-lane accumulator over 8-column steps (n a multiple of 8: GGUF blocks
// are whole 32s), its lanes summed ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)). Eight rows at once: eight
// independent FMA chains, and one transposing reduction for the eight (hadd pairs) where a row at a time paid a
// chain's latency and a reduction per row (absorb_q's rows are only nope = 128 wide).
float dot8_row(const float* w, const float* x, int64_t n) {
  __m256 a = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(x + i), a);
  const __m256 p = _mm256_hadd_ps(a, a), q = _mm256_hadd_ps(p, p);  // lane 0: (l0+l1)+(l2+l3); lane 4: (l4+l5)+(l6+l7)
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(q), _mm256_extractf128_ps(q, 1)));
}

void dot8_rows8(const float* w, int64_t n, const float* x, float* out) {
  __m256 a[8];
  for (int r = 0; r < 8; ++r) a[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(w + r * n + i), xv, a[r]);
  }
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7]: after two rounds lane r of the low half holds
  // row r's (l0+l1)+(l2+l3) and lane r of the high half its (l4+l5)+(l6+l7) (rows 0-3 in u0, 4-7 in u1).
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
  const __m256 lo = _mm256_permute2f128_ps(u0, u1, 0x20), hi = _mm256_permute2f128_ps(u0, u1, 0x31);
  _mm256_storeu_ps(out, _mm256_add_ps(lo, hi));
}

// out[t][i] = dot8 of row r0 + i of W with x[t], for i < rows and t < n tokens; the rows decoded kPieceFloats values
// (16 KB, in L1) at a time, each piece once for all the tokens.
void dot_stored_rows(const WeightMatrix& W, int64_t r0, int64_t rows, int64_t n, const float* const* x, float* const* out) {
  constexpr int64_t kPieceFloats = 4096;
  const int64_t cols = W.cols, per = std::max<int64_t>(1, kPieceFloats / cols);
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(per * cols));
  for (int64_t i = 0; i < rows; i += per) {
    const int64_t m = std::min(per, rows - i);
    decode_rows(W, r0 + i, m, buf.data());
    for (int64_t t = 0; t < n; ++t) {
      int64_t k = 0;
      for (; k + 8 <= m; k += 8) dot8_rows8(buf.data() + k * cols, cols, x[t], out[t] + i + k);
      for (; k < m; ++k) out[t][i + k] = dot8_row(buf.data() + k * cols, x[t], cols);
    }
  }
}

}  // namespace

void mla_absorb_q_head_n(const KvB& kvb, int64_t h, int64_t rope, int64_t n, const float* const* q, float* const* q_lat) {
  if (kvb.k_b) dot_stored_rows(*kvb.k_b, h * kvb.rank, kvb.rank, n, q, q_lat);
  for (int64_t t = 0; t < n; ++t) {
    if (kvb.k_b)
      std::copy(q[t] + kvb.nope, q[t] + kvb.nope + rope, q_lat[t] + kvb.rank);
    else if (kvb.bf16)
      absorb(kvb.bf16, kvb, h, rope, q[t], q_lat[t]);
    else
      absorb(kvb.f32, kvb, h, rope, q[t], q_lat[t]);
  }
}

void mla_up_v_head_n(const KvB& kvb, int64_t h, int64_t n, const float* const* o_lat, float* const* o) {
  if (kvb.v_b) return dot_stored_rows(*kvb.v_b, h * kvb.value, kvb.value, n, o_lat, o);
  for (int64_t t = 0; t < n; ++t) {
    if (kvb.bf16)
      up_v(kvb.bf16, kvb, h, o_lat[t], o[t]);
    else
      up_v(kvb.f32, kvb, h, o_lat[t], o[t]);
  }
}

void mla_absorb_q_head(const KvB& kvb, int64_t h, int64_t rope, const float* q, float* q_lat) {
  mla_absorb_q_head_n(kvb, h, rope, 1, &q, &q_lat);
}

void mla_up_v_head(const KvB& kvb, int64_t h, const float* o_lat, float* o) { mla_up_v_head_n(kvb, h, 1, &o_lat, &o); }

}  // namespace k3::cpu
