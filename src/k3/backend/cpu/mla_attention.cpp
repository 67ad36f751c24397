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

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define K3_MLA_F16C 1
#endif

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

// Stored-row readers of mla_attention_latent_rows_typed: decode(kr, dr, out) writes the row's values as
// fp32 with c_kv still to be multiplied by ckv_scale() (k_pe final).
struct Bf16Row {
  const uint16_t* v;
  Bf16Row(const void* row, int /*kr*/, int /*dr*/) : v(static_cast<const uint16_t*>(row)) {}
  float ckv_scale() const { return 1.f; }
  void decode(int kr, int dr, float* __restrict out) const {
#pragma omp simd
    for (int i = 0; i < kr + dr; ++i) out[i] = bf16_to_f32(v[i]);
  }
};

#ifdef K3_MLA_F16C
// Eight e4m3 codes -> eight floats times 2^-8, exactly: an e4m3 code with its exponent and mantissa moved
// into fp16's fields is the same value over 2^8 (bias 15 instead of 7), subnormals included, and F16C
// widens it; the NaN codes (S.1111.111) become fp16 NaN.
inline __m256 fp8x8_over_256(const uint8_t* p) {
  uint64_t bytes;
  std::memcpy(&bytes, p, 8);
  const __m128i c = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(bytes)));
  const __m128i mag = _mm_and_si128(c, _mm_set1_epi16(0x7f));
  __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8));
  const __m128i nan = _mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f));
  h = _mm_blendv_epi8(h, _mm_or_si128(h, _mm_set1_epi16(0x7e00)), nan);
  return _mm256_cvtph_ps(h);
}
#endif

// c_kv = code value * s. Decoded as code value / 2^8 with the 2^8 moved into the scale (exact: powers of
// two), so each dot product and weight is the one over code value * s up to rounding order.
struct Fp8Row {
  const uint8_t* v;
  const uint16_t* pe;
  float s256;  // 2^8 * the row's scale
  Fp8Row(const void* row, int kr, int dr)
      : v(static_cast<const uint8_t*>(row)), pe(reinterpret_cast<const uint16_t*>(v + mla_fp8_pe_offset(kr))) {
    std::memcpy(&s256, v + mla_fp8_scale_offset(kr, dr), 4);
    s256 *= 256.f;
  }
  float ckv_scale() const { return s256; }
  void decode(int kr, int dr, float* __restrict out) const {
    int i = 0;
#ifdef K3_MLA_F16C
    for (; i + 8 <= kr; i += 8) _mm256_storeu_ps(out + i, fp8x8_over_256(v + i));
#endif
    const float* lut = fp8_e4m3_table();
    for (; i < kr; ++i) out[i] = lut[v[i]] * (1.f / 256.f);
#pragma omp simd
    for (int j = 0; j < dr; ++j) out[kr + j] = bf16_to_f32(pe[j]);
  }
};

// Heads of one query token per task: each stored row is decoded once (into an L1-sized fp32 row) for
// kHeadBlock heads, as the CUDA kernel shares a row among 8 heads. Each (token, head) result is computed
// the same whatever the block, T or the batching.
constexpr int kHeadBlock = 8;

// Query token t, heads [h0, h0 + hn) (hn <= kHeadBlock): p holds hn x ps scores, row dc floats.
template <class Row>
void attend_typed_block(int t, int h0, int hn, int P, int nh, int kr, int dr, const float* q_lat, const void* const* rows,
                        float scale, float* out, float* p, std::size_t ps, float* row) {
  const int dc = kr + dr;
  const float* ql = q_lat + (static_cast<std::size_t>(t) * nh + h0) * dc;
  float* o = out + (static_cast<std::size_t>(t) * nh + h0) * kr;
  const int n = P + t + 1;
  for (int s = 0; s < n; ++s) {
    const Row r(rows[s], kr, dr);
    r.decode(kr, dr, row);
    for (int hh = 0; hh < hn; ++hh) {
      const float* q = ql + static_cast<std::size_t>(hh) * dc;
      p[hh * ps + s] = (dot(kr, q, row) * r.ckv_scale() + dot(dr, q + kr, row + kr)) * scale;
    }
  }
  for (int hh = 0; hh < hn; ++hh) softmax(n, p + hh * ps);
  std::fill_n(o, static_cast<std::size_t>(hn) * kr, 0.f);
  for (int s = 0; s < n; ++s) {
    const Row r(rows[s], kr, dr);
    r.decode(kr, 0, row);
    for (int hh = 0; hh < hn; ++hh) axpy(kr, p[hh * ps + s] * r.ckv_scale(), row, o + static_cast<std::size_t>(hh) * kr);
  }
}

template <class Row>
void attend_typed_rows(int T, int P, int nh, int kr, int dr, const float* q_lat, const void* const* rows,
                       float scale, float* out) {
  const int S = P + T;
  const int dc = kr + dr;
  const int nhb = (nh + kHeadBlock - 1) / kHeadBlock;
  ThreadPool::global().parallel_for(static_cast<int64_t>(T) * nhb, 1, [&](int64_t i0, int64_t i1, int) {
    const std::size_t ps = static_cast<std::size_t>(std::max(S, 1));
    std::vector<float> p(kHeadBlock * ps), row(static_cast<std::size_t>(dc));
    for (int64_t i = i0; i < i1; ++i) {
      const int t = static_cast<int>(i / nhb), h0 = static_cast<int>(i % nhb) * kHeadBlock;
      attend_typed_block<Row>(t, h0, std::min(kHeadBlock, nh - h0), P, nh, kr, dr, q_lat, rows, scale, out, p.data(), ps,
                              row.data());
    }
  });
}

// Query token t, head h over fp32 rows; p: P + t + 1 floats.
void attend_f32_head(int t, int h, int P, int nh, int kr, int dr, const float* q_lat, const float* const* rows, float scale,
                     float* out, float* p) {
  const int dc = kr + dr;
  const float* ql = q_lat + (static_cast<std::size_t>(t) * nh + h) * dc;
  const int n = P + t + 1;
  for (int s = 0; s < n; ++s) p[s] = dot(dc, ql, rows[s]) * scale;
  softmax(n, p);
  float* o = out + (static_cast<std::size_t>(t) * nh + h) * kr;
  std::fill_n(o, kr, 0.f);
  for (int s = 0; s < n; ++s) axpy(kr, p[s], rows[s], o);
}

}  // namespace

void mla_attention_latent_rows(int T, int P, int nh, int kr, int dr, const float* q_lat, const float* const* rows,
                               float scale, float* out) {
  const int S = P + T;
  // One (query, head) pair per index, handed out dynamically (causal rows differ in length).
  ThreadPool::global().parallel_for(static_cast<int64_t>(T) * nh, 1, [&](int64_t i0, int64_t i1, int) {
    std::vector<float> p(static_cast<std::size_t>(std::max(S, 1)));
    for (int64_t i = i0; i < i1; ++i)
      attend_f32_head(static_cast<int>(i / nh), static_cast<int>(i % nh), P, nh, kr, dr, q_lat, rows, scale, out, p.data());
  });
}

void mla_attention_latent_rows_heads(int t, int h0, int hn, int P, int nh, int kr, int dr, const float* q_lat,
                                     const void* const* rows, CacheDType dtype, float scale, float* out,
                                     std::vector<float>& scratch) {
  const std::size_t ps = static_cast<std::size_t>(P + t + 1), dc = static_cast<std::size_t>(kr + dr);
  scratch.resize(static_cast<std::size_t>(kHeadBlock) * ps + dc);
  float* p = scratch.data();
  float* row = p + static_cast<std::size_t>(kHeadBlock) * ps;
  for (int hb = h0; hb < h0 + hn; hb += kHeadBlock) {
    const int n = std::min(kHeadBlock, h0 + hn - hb);
    switch (dtype) {
      case CacheDType::F32:
        for (int h = hb; h < hb + n; ++h)
          attend_f32_head(t, h, P, nh, kr, dr, q_lat, reinterpret_cast<const float* const*>(rows), scale, out, p);
        break;
      case CacheDType::BF16: attend_typed_block<Bf16Row>(t, hb, n, P, nh, kr, dr, q_lat, rows, scale, out, p, ps, row); break;
      case CacheDType::FP8_E4M3: attend_typed_block<Fp8Row>(t, hb, n, P, nh, kr, dr, q_lat, rows, scale, out, p, ps, row); break;
      default: throw Error("mla_attention_latent_rows_heads: unknown cache dtype");
    }
  }
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
