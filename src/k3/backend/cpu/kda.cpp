// KDA recurrence cores (model-spec 3.2). See kda.h for layouts and docs/kernels-cpu.md for notes.
#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/kda_token.h"
#include "k3/backend/cpu/kda_vec.h"
#include "k3/backend/cpu/vec_math.h"

#include "k3/core/error.h"
#include "k3/core/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define K3_KDA_AVX2 1
#endif

namespace k3::cpu {
namespace {

// ---------------------------------------------------------------------------------------------
// Small vector helpers (contiguous, n arbitrary). The compiler vectorises the simd loops.

using kda_vec::axpy;
using kda_vec::scale;

#ifdef K3_KDA_AVX2
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

// y[i] = x[i] * exp(a[i] - b[i]);  b == nullptr means exp(a[i])
inline void mul_exp_diff(int n, const float* x, const float* a, const float* b, float* y) {
  int i = 0;
#ifdef K3_KDA_AVX2
  for (; i + 8 <= n; i += 8) {
    __m256 d = _mm256_loadu_ps(a + i);
    if (b) d = _mm256_sub_ps(d, _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), exp8(d)));
  }
#endif
  for (; i < n; ++i) y[i] = x[i] * std::exp(b ? a[i] - b[i] : a[i]);
}

// C[m][n] += alpha * sum_k A(m,k) B[k][n];  A(m,k) = A[m*lda + k], or A[k*lda + m] when transA.
// Register-blocked MR x 16 AVX2 micro-kernel with scalar column tail.
template <int MR>
inline void gemm_rows(int m0, int N, int K, float alpha, const float* A, int lda, bool transA, const float* B,
                      int ldb, float* C, int ldc) {
  auto a_at = [&](int r, int k) {
    return transA ? A[static_cast<std::size_t>(k) * lda + m0 + r] : A[static_cast<std::size_t>(m0 + r) * lda + k];
  };
  int n = 0;
#ifdef K3_KDA_AVX2
  for (; n + 16 <= N; n += 16) {
    __m256 c0[MR], c1[MR];
    for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
    for (int k = 0; k < K; ++k) {
      const float* b = B + static_cast<std::size_t>(k) * ldb + n;
      const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_set1_ps(a_at(r, k));
        c0[r] = _mm256_fmadd_ps(a, b0, c0[r]);
        c1[r] = _mm256_fmadd_ps(a, b1, c1[r]);
      }
    }
    const __m256 al = _mm256_set1_ps(alpha);
    for (int r = 0; r < MR; ++r) {
      float* c = C + static_cast<std::size_t>(m0 + r) * ldc + n;
      _mm256_storeu_ps(c, _mm256_fmadd_ps(al, c0[r], _mm256_loadu_ps(c)));
      _mm256_storeu_ps(c + 8, _mm256_fmadd_ps(al, c1[r], _mm256_loadu_ps(c + 8)));
    }
  }
#endif
  for (; n < N; ++n)
    for (int r = 0; r < MR; ++r) {
      float acc = 0.f;
      for (int k = 0; k < K; ++k) acc += a_at(r, k) * B[static_cast<std::size_t>(k) * ldb + n];
      C[static_cast<std::size_t>(m0 + r) * ldc + n] += alpha * acc;
    }
}

void gemm_acc(int M, int N, int K, float alpha, const float* A, int lda, bool transA, const float* B, int ldb,
              float* C, int ldc) {
  int m = 0;
  for (; m + 4 <= M; m += 4) gemm_rows<4>(m, N, K, alpha, A, lda, transA, B, ldb, C, ldc);
  for (; m < M; ++m) gemm_rows<1>(m, N, K, alpha, A, lda, transA, B, ldb, C, ldc);
}

// Both sums_d ki[d] kj[d] e[d] and qi[d] kj[d] e[d] with e = exp(Gi - Gj) (<= 1 for j <= i).
inline void decayed_dots(int n, const float* Gi, const float* Gj, const float* ki, const float* qi,
                         const float* kj, float& akk, float& aqk) {
  int d = 0;
  float sk = 0.f, sq = 0.f;
#ifdef K3_KDA_AVX2
  __m256 vk = _mm256_setzero_ps(), vq = _mm256_setzero_ps();
  for (; d + 8 <= n; d += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(Gi + d), _mm256_loadu_ps(Gj + d)));
    const __m256 ke = _mm256_mul_ps(_mm256_loadu_ps(kj + d), e);
    vk = _mm256_fmadd_ps(_mm256_loadu_ps(ki + d), ke, vk);
    vq = _mm256_fmadd_ps(_mm256_loadu_ps(qi + d), ke, vq);
  }
  sk = hsum8(vk);
  sq = hsum8(vq);
#endif
  for (; d < n; ++d) {
    const float ke = kj[d] * std::exp(Gi[d] - Gj[d]);
    sk += ki[d] * ke;
    sq += qi[d] * ke;
  }
  akk = sk;
  aqk = sq;
}

constexpr int kSubBlock = 16;  // rows per sub-block of a chunk (cross_block_scores)

// Per-thread workspace of the chunked form; sized once per call.
struct ChunkWs {
  std::vector<float> Q, K, ones, G, B, U, Vt, Kd, Akk, Aqk, beta, e, KQp, KnT, A2;
  void init(int C, int D) {
    const std::size_t cd = static_cast<std::size_t>(C) * D;
    for (auto* v : {&Q, &K, &G, &B, &U, &Vt, &Kd, &KnT}) v->assign(cd, 0.f);
    KQp.assign(static_cast<std::size_t>(2) * kSubBlock * D, 0.f);
    A2.assign(static_cast<std::size_t>(2) * kSubBlock * C, 0.f);
    ones.assign(D, 1.f);
    Akk.assign(static_cast<std::size_t>(C) * C, 0.f);
    Aqk.assign(static_cast<std::size_t>(C) * C, 0.f);
    beta.assign(C, 0.f);
    e.assign(D, 0.f);
  }
};

void finish_chunk(ChunkWs& ws, int t0, int L, int H, int h, int D, float* S, float* out);

// The chunk's scores with the decay factored through a reference row. For j < i,
//   exp(G_i - G_j) = exp(G_i - G_r) exp(G_r - G_j),   r = the first row of i's sub-block of kSubBlock rows,
// and for j < r both factors are <= 1 when the gates are <= 0 (G non-increasing: every KDA gate, -a
// softplus or lower_bound sigmoid): no overflow, and a factor that underflows belongs to a pair whose
// true weight is below it. So the pairs across sub-blocks are one small GEMM per sub-block,
// [K_i e^(G_i - G_r); Q_i e^(G_i - G_r)] x [K_j e^(G_r - G_j)]^T, and only the pairs inside a sub-block
// (where exp(G_r - G_j) >= 1 could overflow) keep an exp per (i, j, channel): at the default chunk of 64,
// 89k exps per chunk and head instead of 258k, which were most of the chunked form's time.
bool gates_nonpositive(const float* g, int L, int H, int D, int t0, int h) {
  bool ok = true;
  for (int i = 0; i < L; ++i) {
    const float* gi = g + (static_cast<std::size_t>(t0 + i) * H + h) * D;
#pragma omp simd reduction(&& : ok)
    for (int d = 0; d < D; ++d) ok = ok && gi[d] <= 0.f;  // false for NaN too
  }
  return ok;
}

// A_kk[i][j] (j < i) and A_qk[i][j] (j <= i) for the pairs j < r(i), through the factored decay.
void cross_block_scores(ChunkWs& ws, int L, int D) {
  const float* G = ws.G.data();
  float* KQp = ws.KQp.data();  // [2 kSubBlock][D]: K then Q rows of the sub-block, times e^(G_i - G_r)
  float* KnT = ws.KnT.data();  // [D][r]: K_j e^(G_r - G_j), transposed
  float* A = ws.A2.data();     // [2 kSubBlock][r]
  float* row = ws.e.data();    // [D]
  for (int r = kSubBlock; r < L; r += kSubBlock) {
    const int m = std::min(kSubBlock, L - r);
    const float* Gr = G + r * D;
    for (int i = 0; i < m; ++i) {
      mul_exp_diff(D, ws.K.data() + (r + i) * D, G + (r + i) * D, Gr, KQp + i * D);
      mul_exp_diff(D, ws.Q.data() + (r + i) * D, G + (r + i) * D, Gr, KQp + (m + i) * D);
    }
    for (int j = 0; j < r; ++j) {
      mul_exp_diff(D, ws.K.data() + j * D, Gr, G + j * D, row);
      for (int d = 0; d < D; ++d) KnT[static_cast<std::size_t>(d) * r + j] = row[d];
    }
    std::fill_n(A, static_cast<std::size_t>(2 * m) * r, 0.f);
    gemm_acc(2 * m, r, D, 1.f, KQp, D, false, KnT, r, A, r);
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < r; ++j) {
        ws.Akk[(r + i) * L + j] = A[i * r + j];
        ws.Aqk[(r + i) * L + j] = A[(m + i) * r + j];
      }
  }
}

// One chunk of L tokens starting at t0 for head h; S = that head's [D][D] state, updated in place.
void kda_chunk(ChunkWs& ws, int t0, int L, int H, int h, int D, const float* q, const float* k,
               const float* v, const float* g, const float* beta, float* S, float* out) {
  float* Q = ws.Q.data();
  float* K = ws.K.data();
  float* G = ws.G.data();
  float* U = ws.U.data();  // V, then U = T V in place (finish_chunk)
  float* Akk = ws.Akk.data();
  float* Aqk = ws.Aqk.data();
  float* bt = ws.beta.data();

  // Gather the chunk for this head into contiguous rows; cumulative log-decay.
  for (int i = 0; i < L; ++i) {
    const std::size_t src = (static_cast<std::size_t>(t0 + i) * H + h) * D;
    std::copy_n(q + src, D, Q + i * D);
    std::copy_n(k + src, D, K + i * D);
    std::copy_n(v + src, D, U + i * D);
    float* Gi = G + i * D;
    const float* gi = g + src;
    if (i == 0) {
      std::copy_n(gi, D, Gi);
    } else {
      const float* Gp = Gi - D;
#pragma omp simd
      for (int d = 0; d < D; ++d) Gi[d] = Gp[d] + gi[d];
    }
    bt[i] = beta[static_cast<std::size_t>(t0 + i) * H + h];
  }

  // A_kk (strictly lower, without the beta_i factor) and A_qk (lower incl. diagonal, zero above).
  const bool factored = gates_nonpositive(g, L, H, D, t0, h);
  std::fill_n(Aqk, static_cast<std::size_t>(L) * L, 0.f);
  if (factored) cross_block_scores(ws, L, D);
  for (int i = 0; i < L; ++i) {
    const float* Gi = G + i * D;
    for (int j = factored ? i / kSubBlock * kSubBlock : 0; j < i; ++j)
      decayed_dots(D, Gi, G + j * D, K + i * D, Q + i * D, K + j * D, Akk[i * L + j], Aqk[i * L + j]);
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; ++d) s += Q[i * D + d] * K[i * D + d];
    Aqk[i * L + i] = s;
  }
  finish_chunk(ws, t0, L, H, h, D, S, out);
}

// The rest of a chunk once A_kk (strictly lower) and A_qk (lower, zero above) are in ws.
void finish_chunk(ChunkWs& ws, int t0, int L, int H, int h, int D, float* S, float* out) {
  float* Q = ws.Q.data();
  float* K = ws.K.data();
  const float* ones = ws.ones.data();
  float* G = ws.G.data();
  float* B = ws.B.data();    // exp(G) * K, then W in place
  float* U = ws.U.data();    // V, then U = T V in place
  float* Vt = ws.Vt.data();  // V~ = U - W S_in
  float* Kd = ws.Kd.data();  // exp(G_last - G) * K
  float* Akk = ws.Akk.data();
  float* Aqk = ws.Aqk.data();
  float* bt = ws.beta.data();
  float* e = ws.e.data();

  // B = exp(G) * K. Forward substitution of (I + diag(beta) A) X = diag(beta) [B | V] gives
  // W = T B and U = T V with T = (I + A_kk)^-1 diag(beta), A_kk = diag(beta) A.
  for (int i = 0; i < L; ++i) {
    float* Wi = B + i * D;
    float* Ui = U + i * D;
    mul_exp_diff(D, K + i * D, G + i * D, nullptr, Wi);
    for (int j = 0; j < i; ++j) {
      const float a = -Akk[i * L + j];
      axpy(D, a, B + j * D, Wi);
      axpy(D, a, U + j * D, Ui);
    }
    scale(D, bt[i], Wi);
    scale(D, bt[i], Ui);
  }

  // V~ = U - W S_in
  std::copy_n(U, static_cast<std::size_t>(L) * D, Vt);
  gemm_acc(L, D, D, -1.f, B, D, false, S, D, Vt, D);

  // O = (Q * exp(G)) S_in + A_qk V~   (A_qk's upper triangle is zero)
  float* Qe = Kd;
  for (int i = 0; i < L; ++i) mul_exp_diff(D, Q + i * D, G + i * D, nullptr, Qe + i * D);
  float* O = out + (static_cast<std::size_t>(t0) * H + h) * D;
  const int ldo = H * D;
  for (int i = 0; i < L; ++i) std::fill_n(O + static_cast<std::size_t>(i) * ldo, D, 0.f);
  gemm_acc(L, D, D, 1.f, Qe, D, false, S, D, O, ldo);
  gemm_acc(L, D, L, 1.f, Aqk, L, false, Vt, D, O, ldo);

  // S_out = exp(G_last) * S_in + (exp(G_last - G) * K)^T V~
  const float* Gl = G + (L - 1) * D;
  for (int i = 0; i < L; ++i) mul_exp_diff(D, K + i * D, Gl, G + i * D, Kd + i * D);
  mul_exp_diff(D, ones, Gl, nullptr, e);  // e = exp(G_last)
  for (int dk = 0; dk < D; ++dk) scale(D, e[dk], S + static_cast<std::size_t>(dk) * D);
  gemm_acc(D, D, L, 1.f, Kd, D, true, Vt, D, S, D);
}

}  // namespace

namespace {

// One head's tokens: the decay exp(g) of each, then the kernel's step (kda_token.h; the same bits whichever runs) on
// the state as stored. scratch: 3 D floats, + D * D for a bf16 state (the Reference kernel's fp32 copy).
template <class St>
void head_tokens(int T, int H, int D, int h, const float* q, const float* k, const float* v, const float* g,
                 const float* beta, St* S, float* out, float* scratch) {
  float* u = scratch;
  float* dg = scratch + D;
  float* ones = scratch + 2 * D;
  std::fill_n(ones, D, 1.0f);
  const KdaTokenKernel kernel = kda_token_kernel(D);
  for (int t = 0; t < T; ++t) {
    const std::size_t off = (static_cast<std::size_t>(t) * H + h) * D;
    mul_exp_diff(D, ones, g + off, nullptr, dg);  // exp(g), 8 lanes at a time
    const float b = beta[static_cast<std::size_t>(t) * H + h];
    if constexpr (std::is_same_v<St, float>)
      kda_token_step(kernel, D, q + off, k + off, v + off, dg, b, S, out + off, u);
    else
      kda_token_step_bf16(kernel, D, q + off, k + off, v + off, dg, b, S, out + off, u, scratch + 3 * D);
  }
}

}  // namespace

void kda_recurrent_head(int T, int H, int D, int h, const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* S, float* out, float* scratch) {
  head_tokens(T, H, D, h, q, k, v, g, beta, S, out, scratch);
}

void kda_recurrent(int T, int H, int D, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* state, float* out) {
  ThreadPool::global().parallel_for(H, 1, [&](int64_t h0, int64_t h1, int) {
    std::vector<float> scratch(3 * static_cast<std::size_t>(D));
    for (int h = static_cast<int>(h0); h < static_cast<int>(h1); ++h)
      kda_recurrent_head(T, H, D, h, q, k, v, g, beta, state + static_cast<std::size_t>(h) * D * D, out, scratch.data());
  });
}

void kda_chunked(int T, int H, int D, int chunk, const float* q, const float* k, const float* v,
                 const float* g, const float* beta, float* state, float* out) {
  if (T <= 0) return;
  const int C = std::max(1, std::min(chunk, T));
  ThreadPool::global().parallel_for(H, 1, [&](int64_t h0, int64_t h1, int) {
    ChunkWs ws;
    ws.init(C, D);
    for (int h = static_cast<int>(h0); h < static_cast<int>(h1); ++h) {
      float* S = state + static_cast<std::size_t>(h) * D * D;
      for (int t0 = 0; t0 < T; t0 += C) kda_chunk(ws, t0, std::min(C, T - t0), H, h, D, q, k, v, g, beta, S, out);
    }
  });
}

namespace {

// Runs `step(float* state)` on an fp32 copy of a state stored as `dtype`, then stores it back rounded.
template <class Step>
void with_fp32_state(int H, int D, void* state, CacheDType dtype, const Step& step) {
  if (dtype == CacheDType::F32) return step(static_cast<float*>(state));
  if (dtype != CacheDType::BF16)
    throw Error(std::string("KDA state: cache dtype ") + cache_dtype_name(dtype) + " is not supported (float32, bfloat16)");
  const std::size_t n = static_cast<std::size_t>(H) * D * D;
  auto* stored = static_cast<uint16_t*>(state);
  std::vector<float> s(n);
  for (std::size_t i = 0; i < n; ++i) s[i] = bf16_to_f32(stored[i]);
  step(s.data());
  for (std::size_t i = 0; i < n; ++i) stored[i] = f32_to_bf16(s[i]);
}

}  // namespace

void kda_recurrent_typed(int T, int H, int D, const float* q, const float* k, const float* v, const float* g,
                         const float* beta, void* state, CacheDType state_dtype, float* out) {
  if (state_dtype == CacheDType::F32) {
    kda_recurrent(T, H, D, q, k, v, g, beta, static_cast<float*>(state), out);
    return;
  }
  if (state_dtype != CacheDType::BF16)
    throw Error(std::string("KDA state: cache dtype ") + cache_dtype_name(state_dtype) + " is not supported (float32, bfloat16)");
  // Heads in parallel, each rounded after every token (kda_recurrent_head_typed): the state is then the same however
  // the tokens are split into calls (batching, prompt chunks, prefix-cache restarts), so the decode form stays exactly
  // batch-invariant.
  ThreadPool::global().parallel_for(H, 1, [&](int64_t h0, int64_t h1, int) {
    std::vector<float> scratch(3 * static_cast<std::size_t>(D) + static_cast<std::size_t>(D) * D);
    for (int h = static_cast<int>(h0); h < static_cast<int>(h1); ++h)
      kda_recurrent_head_typed(T, H, D, h, q, k, v, g, beta, state, state_dtype, out, scratch.data());
  });
}

void kda_recurrent_head_typed(int T, int H, int D, int h, const float* q, const float* k, const float* v,
                              const float* g, const float* beta, void* state, CacheDType state_dtype, float* out,
                              float* scratch) {
  const std::size_t DD = static_cast<std::size_t>(D) * D;
  if (state_dtype == CacheDType::F32) {
    kda_recurrent_head(T, H, D, h, q, k, v, g, beta, static_cast<float*>(state) + h * DD, out, scratch);
    return;
  }
  if (state_dtype != CacheDType::BF16)
    throw Error(std::string("KDA state: cache dtype ") + cache_dtype_name(state_dtype) + " is not supported (float32, bfloat16)");
  // As kda_recurrent_typed: each token on the state widened, then rounded back (kda_token_step_bf16: the same bits
  // as widening the head, the fp32 step and rounding it, which this did before).
  head_tokens(T, H, D, h, q, k, v, g, beta, static_cast<uint16_t*>(state) + h * DD, out, scratch);
}

void kda_chunked_typed(int T, int H, int D, int chunk, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, void* state, CacheDType state_dtype, float* out) {
  with_fp32_state(H, D, state, state_dtype,
                  [&](float* s) { kda_chunked(T, H, D, chunk, q, k, v, g, beta, s, out); });
}

namespace {
// One token of a width-4 conv (every KDA model's), 8 channels at a time without gathers: the group's taps [8][4]
// and tails [8][3] are read as whole vectors and transposed in registers (Zen 4 gathers ~1 element a cycle: with
// the gathers, the three convs were ~30% of a head's kda_mix work). Lane l of the transposed vectors holds channel
// kConvLane[l] (what the 4 x 4 transposes of unpack + shuffle give); each lane runs its channel's chain
// acc = fma(w[c][j], in[j], acc), j ascending from +0, then the same vector SiLU: the gathers' bits.
constexpr int kConvLane[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// Lanes whose tail float 3 kConvLane[l] + j (of the group's 24) lies in tail vector `part` (0, 1, 2).
constexpr int conv_tail_mask(int j, int part) {
  int m = 0;
  for (int l = 0; l < 8; ++l) m |= ((3 * kConvLane[l] + j) / 8 == part) << l;
  return m;
}

// Tail tap j (0..2) of the group's channels, in lane order: float 3 kConvLane[l] + j of t0 | t1 | t2.
template <int j>
inline __m256 conv_tail_tap(__m256 t0, __m256 t1, __m256 t2) {
  auto pos = [](int l) { return (3 * kConvLane[l] + j) % 8; };
  const __m256i p = _mm256_setr_epi32(pos(0), pos(1), pos(2), pos(3), pos(4), pos(5), pos(6), pos(7));
  const __m256 r = _mm256_blend_ps(_mm256_permutevar8x32_ps(t0, p), _mm256_permutevar8x32_ps(t1, p), conv_tail_mask(j, 1));
  return _mm256_blend_ps(r, _mm256_permutevar8x32_ps(t2, p), conv_tail_mask(j, 2));
}

// The group's taps w[8][4] as 4 vectors (tap j of every channel), in lane order.
inline void conv_taps4(const float* w, __m256 tap[4]) {
  const __m256 r0 = _mm256_loadu_ps(w), r1 = _mm256_loadu_ps(w + 8), r2 = _mm256_loadu_ps(w + 16), r3 = _mm256_loadu_ps(w + 24);
  const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  tap[0] = _mm256_shuffle_ps(t0, t2, 0x44);
  tap[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
  tap[2] = _mm256_shuffle_ps(t1, t3, 0x44);
  tap[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
}

// The group's new tails (old tail[1], old tail[2], x) per channel: the 24 old floats one to the left, x at every
// third place. All three loads come before the stores, and none reads past the group's 24 floats.
inline void conv_store_tails4(float* st, __m256 x) {
  const __m256 n0 = _mm256_loadu_ps(st + 1), n1 = _mm256_loadu_ps(st + 9);
  const __m256 n2 = _mm256_permutevar8x32_ps(_mm256_loadu_ps(st + 16), _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 7));
  _mm256_storeu_ps(st, _mm256_blend_ps(n0, _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(0, 0, 0, 0, 0, 1, 0, 0)), 0x24));
  _mm256_storeu_ps(st + 8, _mm256_blend_ps(n1, _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(2, 0, 0, 3, 0, 0, 4, 0)), 0x49));
  _mm256_storeu_ps(st + 16, _mm256_blend_ps(n2, _mm256_permutevar8x32_ps(x, _mm256_setr_epi32(0, 5, 0, 0, 6, 0, 0, 7)), 0x92));
}

// Channels [c_begin, c_end) of one token, W = 4, in whole groups of 8; returns the first channel not done.
int conv4_silu_one_token(const float* x, const float* w, float* cstate, float* y, int c_begin, int c_end) {
  const __m256i to_lanes = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), to_channels = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int c0 = c_begin;
  for (; c0 + 8 <= c_end; c0 += 8) {
    float* st = cstate + static_cast<std::size_t>(c0) * 3;
    __m256 tap[4];
    conv_taps4(w + static_cast<std::size_t>(c0) * 4, tap);
    const __m256 t0 = _mm256_loadu_ps(st), t1 = _mm256_loadu_ps(st + 8), t2 = _mm256_loadu_ps(st + 16);
    const __m256 xc = _mm256_loadu_ps(x + c0);
    __m256 acc = _mm256_fmadd_ps(tap[0], conv_tail_tap<0>(t0, t1, t2), _mm256_setzero_ps());
    acc = _mm256_fmadd_ps(tap[1], conv_tail_tap<1>(t0, t1, t2), acc);
    acc = _mm256_fmadd_ps(tap[2], conv_tail_tap<2>(t0, t1, t2), acc);
    acc = _mm256_fmadd_ps(tap[3], _mm256_permutevar8x32_ps(xc, to_lanes), acc);
    acc = _mm256_permutevar8x32_ps(acc, to_channels);
    _mm256_storeu_ps(y + c0, _mm256_mul_ps(acc, sigmoid8(acc)));
    conv_store_tails4(st, xc);
  }
  return c0;
}

// A few tokens (decode, draft verification): straight from the weights' and the state's [C][W] / [C][P]
// layouts (gathers) instead of transposing both per call as the token-major path below does: that transpose
// is ~6 C scalar moves and two allocations for 4 C multiply-adds. Same fma chain per channel and the same
// vector SiLU per 8 channels: the same bits (KdaConv.ShortConvSiluMatchesReferenceAndStreams).
void short_conv_silu_few(int T, int C, int W, const float* x, const float* w, float* cstate, float* y, int c_begin,
                         int c_end) {
  if (T == 1 && W == 4) c_begin = conv4_silu_one_token(x, w, cstate, y, c_begin, c_end);  // the rest: below
  const int P = W - 1;
  for (int t = 0; t < T; ++t) {
    float* yt = y + static_cast<std::size_t>(t) * C;
    auto input = [&](int c, int tau) {  // input at relative time tau in [-P, T) of channel c
      return tau < 0 ? cstate[static_cast<std::size_t>(c) * P + (P + tau)] : x[static_cast<std::size_t>(tau) * C + c];
    };
    // 8 channels per step: their taps and past inputs are W and P floats apart, gathered; the rest one by one.
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i wstep = _mm256_mullo_epi32(lane, _mm256_set1_epi32(W)), pstep = _mm256_mullo_epi32(lane, _mm256_set1_epi32(std::max(P, 1)));
    int c0 = c_begin;
    for (; c0 + 8 <= c_end; c0 += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int j = 0; j < W; ++j) {
        const int tau = t - P + j;
        const __m256 in = tau < 0 ? _mm256_i32gather_ps(cstate + static_cast<std::size_t>(c0) * P + (P + tau), pstep, 4)
                                  : _mm256_loadu_ps(x + static_cast<std::size_t>(tau) * C + c0);
        acc = _mm256_fmadd_ps(_mm256_i32gather_ps(w + static_cast<std::size_t>(c0) * W + j, wstep, 4), in, acc);
      }
      _mm256_storeu_ps(yt + c0, _mm256_mul_ps(acc, sigmoid8(acc)));
    }
    for (; c0 < c_end; ++c0) {
      float acc = 0.f;
      for (int j = 0; j < W; ++j) acc = std::fma(w[static_cast<std::size_t>(c0) * W + j], input(c0, t - P + j), acc);
      alignas(32) float b[8] = {acc};
      _mm256_store_ps(b, _mm256_mul_ps(_mm256_load_ps(b), sigmoid8(_mm256_load_ps(b))));
      yt[c0] = b[0];
    }
  }
  // new state = the last P inputs of [state, x], shifted per channel in place (ascending j reads ahead of
  // what it overwrites)
  for (int c = c_begin; c < c_end; ++c)
    for (int j = 0; j < P; ++j) {
      const int tau = T - P + j;
      cstate[static_cast<std::size_t>(c) * P + j] =
          tau < 0 ? cstate[static_cast<std::size_t>(c) * P + (P + tau)] : x[static_cast<std::size_t>(tau) * C + c];
    }
}
}  // namespace

void short_conv_silu_channels(int T, int C, int W, const float* x, const float* w, float* cstate, float* y, int c0, int c1) {
  short_conv_silu_few(T, C, W, x, w, cstate, y, c0, c1);
}

// Token-major: for each token, 8 channels at a time (weights transposed to [W][C] once per call), so the
// inputs are read row by row (channel-major walked x with a stride of C floats: 4% of a prefill). Every
// (t, c) is the same FMA chain acc = fma(w[c][j], in[t-P+j][c], acc), j ascending, in a vector lane or the
// scalar tail alike, so results do not depend on T (decode == prefill) or on the channel's position.
void short_conv_silu(int T, int C, int W, const float* x, const float* w, float* cstate, float* y) {
  if (T <= kShortConvFewTokens) {
    // Channels are independent: in parallel in chunks of 256 (multiples of 8) when there are several chunks (one
    // token's three convs of 2048 channels were ~80 us of a 10 ms decode step on one thread at 16 threads).
    constexpr int kChunk = kShortConvChunk;
    const int chunks = (C + kChunk - 1) / kChunk;
    parallel_for(chunks, chunks > 1, [&](int64_t i) {
      const int b = static_cast<int>(i) * kChunk;
      short_conv_silu_few(T, C, W, x, w, cstate, y, b, std::min(C, b + kChunk));
    });
    return;
  }
  const int P = W - 1;  // previous inputs kept
  std::vector<float> wt(static_cast<std::size_t>(W) * C), past(static_cast<std::size_t>(P) * C);
  for (int c = 0; c < C; ++c) {
    for (int j = 0; j < W; ++j) wt[static_cast<std::size_t>(j) * C + c] = w[static_cast<std::size_t>(c) * W + j];
    for (int j = 0; j < P; ++j) past[static_cast<std::size_t>(j) * C + c] = cstate[static_cast<std::size_t>(c) * P + j];
  }
  // input row at relative time tau in [-P, T): tau < 0 comes from the state
  auto row = [&](int tau) { return tau < 0 ? past.data() + static_cast<std::size_t>(P + tau) * C : x + static_cast<std::size_t>(tau) * C; };
  parallel_for(T, static_cast<long>(T) * C * W > 65536, [&](int64_t ti) {
    const int t = static_cast<int>(ti);
    float* yt = y + static_cast<std::size_t>(t) * C;
    int c = 0;
    for (; c + 8 <= C; c += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int j = 0; j < W; ++j)
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt.data() + static_cast<std::size_t>(j) * C + c), _mm256_loadu_ps(row(t - P + j) + c), acc);
      _mm256_storeu_ps(yt + c, _mm256_mul_ps(acc, sigmoid8(acc)));
    }
    for (; c < C; ++c) {
      float acc = 0.f;
      for (int j = 0; j < W; ++j) acc = std::fma(wt[static_cast<std::size_t>(j) * C + c], row(t - P + j)[c], acc);
      alignas(32) float b[8] = {acc};
      _mm256_store_ps(b, _mm256_mul_ps(_mm256_load_ps(b), sigmoid8(_mm256_load_ps(b))));
      yt[c] = b[0];
    }
  });
  // new state = the last P inputs of [state, x]
  for (int j = 0; j < P; ++j) {
    const float* r = row(T - P + j);
    for (int c = 0; c < C; ++c) cstate[static_cast<std::size_t>(c) * P + j] = r[c];
  }
}

}  // namespace k3::cpu
