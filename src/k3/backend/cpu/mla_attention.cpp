// MLA attention cores (model-spec 3.3). See mla_attention.h for layouts.
#include "k3/backend/cpu/mla_attention.h"

#include "k3/backend/cpu/mla_cache_rows.h"
#include "k3/core/error.h"
#include "k3/core/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <vector>

namespace k3::cpu {
namespace {

inline float dot(int n, const float* __restrict a, const float* __restrict b) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

inline void axpy(int n, float a, const float* __restrict x, float* __restrict y) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

// In-place softmax of p[0..n) (already scaled); returns nothing, p holds probabilities.
inline void softmax(int n, float* p) {
  float m = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) m = std::max(m, p[i]);
  float sum = 0.f;
  for (int i = 0; i < n; ++i) {
    p[i] = std::exp(p[i] - m);
    sum += p[i];
  }
  const float inv = 1.f / sum;
  for (int i = 0; i < n; ++i) p[i] *= inv;
}

// Stored-row readers of mla_attention_latent_rows_typed: q . row (fp32 accumulation, an fp8 row's scale
// applied once) and the row's c_kv part for the weighted sum (c_kv[i] = at(i) * ckv_scale()).
inline float dot_bf16(int n, const float* __restrict q, const uint16_t* __restrict r) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += q[i] * bf16_to_f32(r[i]);
  return s;
}

struct Bf16Row {
  const uint16_t* v;
  Bf16Row(const void* row, int /*kr*/, int /*dr*/) : v(static_cast<const uint16_t*>(row)) {}
  float dot(int kr, int dr, const float* q) const { return dot_bf16(kr + dr, q, v); }
  float ckv_scale() const { return 1.f; }
  float at(int i) const { return bf16_to_f32(v[i]); }
};

struct Fp8Row {
  const uint8_t* v;
  const uint16_t* pe;
  const float* lut;
  float s;
  Fp8Row(const void* row, int kr, int dr)
      : v(static_cast<const uint8_t*>(row)),
        pe(reinterpret_cast<const uint16_t*>(v + mla_fp8_pe_offset(kr))),
        lut(fp8_e4m3_table()) {
    std::memcpy(&s, v + mla_fp8_scale_offset(kr, dr), 4);
  }
  float dot(int kr, int dr, const float* __restrict q) const {
    float d = 0.f;
#pragma omp simd reduction(+ : d)
    for (int i = 0; i < kr; ++i) d += q[i] * lut[v[i]];
    return d * s + dot_bf16(dr, q + kr, pe);
  }
  float ckv_scale() const { return s; }
  float at(int i) const { return lut[v[i]]; }
};

template <class Row>
void attend_typed_rows(int T, int P, int nh, int kr, int dr, const float* q_lat, const void* const* rows,
                       float scale, float* out) {
  const int S = P + T;
  const int dc = kr + dr;
  ThreadPool::global().parallel_for(static_cast<int64_t>(T) * nh, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> p(static_cast<std::size_t>(std::max(S, 1)));
    for (int64_t i = i0; i < i1; ++i) {
      const int t = static_cast<int>(i / nh), h = static_cast<int>(i % nh);
      const float* ql = q_lat + (static_cast<std::size_t>(t) * nh + h) * dc;
      const int n = P + t + 1;
      for (int s = 0; s < n; ++s) p[s] = Row(rows[s], kr, dr).dot(kr, dr, ql) * scale;
      softmax(n, p.data());
      float* __restrict o = out + (static_cast<std::size_t>(t) * nh + h) * kr;
      std::fill_n(o, kr, 0.f);
      for (int s = 0; s < n; ++s) {
        const Row r(rows[s], kr, dr);
        const float w = p[s] * r.ckv_scale();
#pragma omp simd
        for (int j = 0; j < kr; ++j) o[j] += w * r.at(j);
      }
    }
  });
}

}  // namespace

void mla_attention_mha(int T, int P, int nh, int dn, int dr, int dv, const float* q, const float* k_nope,
                       const float* k_pe, const float* v, float scale, float* out) {
  const int S = P + T;
  const int dq = dn + dr;
  // One (query, head) pair per index, handed out dynamically (causal rows differ in length).
  ThreadPool::global().parallel_for(static_cast<int64_t>(T) * nh, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> p(static_cast<std::size_t>(std::max(S, 1)));
    for (int64_t i = i0; i < i1; ++i) {
      const int t = static_cast<int>(i / nh), h = static_cast<int>(i % nh);
      {
        const float* qn = q + (static_cast<std::size_t>(t) * nh + h) * dq;
        const float* qp = qn + dn;
        const int n = P + t + 1;  // causal: keys 0 .. P+t
        for (int s = 0; s < n; ++s) {
          const float* kn = k_nope + (static_cast<std::size_t>(s) * nh + h) * dn;
          const float* kp = k_pe + static_cast<std::size_t>(s) * dr;
          p[s] = (dot(dn, qn, kn) + dot(dr, qp, kp)) * scale;
        }
        softmax(n, p.data());
        float* o = out + (static_cast<std::size_t>(t) * nh + h) * dv;
        std::fill_n(o, dv, 0.f);
        for (int s = 0; s < n; ++s) axpy(dv, p[s], v + (static_cast<std::size_t>(s) * nh + h) * dv, o);
      }
    }
  });
}

void mla_attention_latent_rows(int T, int P, int nh, int kr, int dr, const float* q_lat, const float* const* rows,
                               float scale, float* out) {
  const int S = P + T;
  const int dc = kr + dr;
  // One (query, head) pair per index, handed out dynamically (causal rows differ in length).
  ThreadPool::global().parallel_for(static_cast<int64_t>(T) * nh, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> p(static_cast<std::size_t>(std::max(S, 1)));
    for (int64_t i = i0; i < i1; ++i) {
      const int t = static_cast<int>(i / nh), h = static_cast<int>(i % nh);
      {
        const float* ql = q_lat + (static_cast<std::size_t>(t) * nh + h) * dc;
        const int n = P + t + 1;
        for (int s = 0; s < n; ++s) p[s] = dot(dc, ql, rows[s]) * scale;
        softmax(n, p.data());
        float* o = out + (static_cast<std::size_t>(t) * nh + h) * kr;
        std::fill_n(o, kr, 0.f);
        for (int s = 0; s < n; ++s) axpy(kr, p[s], rows[s], o);
      }
    }
  });
}

void mla_attention_latent_rows_typed(int T, int P, int nh, int kr, int dr, const float* q_lat,
                                     const void* const* rows, CacheDType dtype, float scale, float* out) {
  switch (dtype) {
    case CacheDType::F32:
      mla_attention_latent_rows(T, P, nh, kr, dr, q_lat, reinterpret_cast<const float* const*>(rows), scale, out);
      return;
    case CacheDType::BF16: return attend_typed_rows<Bf16Row>(T, P, nh, kr, dr, q_lat, rows, scale, out);
    case CacheDType::FP8_E4M3: return attend_typed_rows<Fp8Row>(T, P, nh, kr, dr, q_lat, rows, scale, out);
  }
  throw Error("mla_attention_latent_rows_typed: unknown cache dtype");
}

void mla_attention_latent(int T, int P, int nh, int kr, int dr, const float* q_lat, const float* cache,
                          float scale, float* out) {
  const int S = P + T;
  std::vector<const float*> rows(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) rows[static_cast<std::size_t>(s)] = cache + static_cast<std::size_t>(s) * (kr + dr);
  mla_attention_latent_rows(T, P, nh, kr, dr, q_lat, rows.data(), scale, out);
}

}  // namespace k3::cpu
