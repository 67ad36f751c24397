// KDA kernels (see kda_kernels.h; reference: backend/cpu/kda.cpp and model/kda_layer.cpp).
//
// Layouts: activations are [N][C] rows with C = H * D (head h = columns [h*D, h*D + D)); beta is [N][H];
// a sequence's state is S[h][dk][dv] (row-major), its conv states [C][W-1].
//
// Why the thread mappings:
// - The delta rule never mixes value columns: every column S[:, dv] evolves on its own, given the
//   token's q, k, exp(g), beta and v[dv]. So one thread owns one dv column as `float s[D]` in registers
//   (loops over dk fully unrolled, so indices are compile-time and s never leaves registers), and
//   k.S and q.S are thread-local dot products. q_t, k_t, exp(g_t) are shared by all columns and are
//   staged in shared memory, read as broadcast float4 loads. State loads/stores S[dk][dv] over a
//   warp's consecutive dv are coalesced. For D = 128 the recurrent and decode kernels give each column
//   to two adjacent lanes (64 state values each, one shuffle per dot product): a whole column per
//   thread needed > 255 registers and spilled (kSplit below). The chunked kernel keeps one thread per
//   column (207 registers, no spill).
// - kda_recurrent: one warp per (seq, head, 32/kSplit dv columns), so even a decode batch of 1 spreads
//   over H * D*kSplit/32 blocks. Token data is double-buffered in shared memory (one __syncwarp per
//   token) and the next token's inputs are prefetched into registers while the current one is computed.
// - kda_chunked: one block of D threads per (seq, head). Per chunk the block builds, in shared memory,
//   the intra-chunk quantities that all columns share (cumulative log decay G relative to the chunk
//   start, A_kk, A_qk, W = T exp(G) K, Q exp(G), exp(G_last - G) K, exp(G_last)); every exponent is a
//   difference G_i - G_j with j <= i or G itself, i.e. <= 0, so nothing overflows (as on the CPU). Then
//   thread dv does its column's U = T V, V~ = U - W S, O and the state update with s[] in registers.
//   The block is ~164 KB of shared memory for D = 128, chunk 64 (one block per SM).
// - kda_conv_l2norm: block of D threads per (tile of 16 tokens, head, seq); each thread one channel.
//   The conv of token t reads its W inputs directly (x rows, or the old conv state for t < W-1), so
//   token tiles run in parallel; only tile 0 touches the state (it alone reads it, as 16 >= W-1),
//   writing the new state after it has read the old one into registers. The per-head L2 norm is a
//   block reduction per token.
// - kda_decode_fused: block of D*kSplit threads per (seq, head): thread d < D is channel d for the conv,
//   norms and gates; for the recurrence the threads map to value columns as in kda_recurrent. It uses
//   the same device helpers as the unfused kernels, so it matches them to rounding.
#include "k3/backend/cuda/kda_kernels.h"

#include <cstddef>

namespace k3::cuda {
namespace {

constexpr int kConvTile = 16;  // tokens per conv block; must be >= W-1 (see above)
constexpr int kMaxConvW = 4;   // the models use 4

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum of (a, b) over a block of NT threads (NT a multiple of 32, <= 1024). Every thread gets the result.
// `red` is shared scratch of NT/32 float2; the trailing barrier lets the next call reuse it.
template <int NT>
__device__ __forceinline__ float2 block_sum2(float a, float b, float2* red) {
  a = warp_sum(a);
  b = warp_sum(b);
  if constexpr (NT == 32) {
    return make_float2(a, b);
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = make_float2(a, b);
    __syncthreads();
    float2 s = red[0];
#pragma unroll
    for (int w = 1; w < NT / 32; ++w) {
      s.x += red[w].x;
      s.y += red[w].y;
    }
    __syncthreads();
    return s;
  }
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float z) { return z > 20.f ? z : log1pf(expf(z)); }

// Log decay of one channel (kda_layer.cpp): z = g + dt_bias; a = exp(A_log[h]).
__device__ __forceinline__ float gate_value(float z, float a, bool bounded, float lower_bound) {
  return bounded ? lower_bound * sigmoid(a * z) : -a * softplus(z);
}

// r = v[idx] for a small register array with a run-time idx in [0, P) (keeps v in registers).
template <int P>
__device__ __forceinline__ float pick(const float (&v)[P], int idx) {
  float r = 0.f;
#pragma unroll
  for (int m = 0; m < P; ++m)
    if (m == idx) r = v[m];
  return r;
}

// Conv + SiLU of channel c at sequence-relative token t (cpu::short_conv_silu): input tau < 0 comes
// from the old conv state `st` (registers), else from row (offset + tau) of x.
template <int W>
__device__ __forceinline__ float conv_silu_at(const float* __restrict__ x, int C, int c, int offset, int t,
                                              const float (&w)[W], const float (&st)[W > 1 ? W - 1 : 1]) {
  constexpr int P = W - 1;
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const int tau = t - P + j;
    float in;
    if constexpr (P > 0) {
      in = tau < 0 ? pick(st, P + tau) : x[static_cast<size_t>(offset + tau) * C + c];
    } else {
      in = x[static_cast<size_t>(offset + tau) * C + c];
    }
    acc += w[j] * in;
  }
  return silu(acc);
}

// How many threads share one value column in the recurrent / decode kernels. With D = 128 one thread
// holding all 128 state values plus the pipelined shared-memory operands needs more than 255 registers
// (ptxas spilled), so two adjacent lanes split the key dimension and combine dot products with one
// shuffle. Lane p of a pair owns the float4 groups i4 = SPLIT*m + p, so the pair reads adjacent 16-byte
// words (different banks) of the staged k/q/exp(g) rows.
template <int D>
constexpr int kSplit = D == 128 ? 2 : 1;

// Register slot 4m + r of part p holds key index dk = 4 (SPLIT m + p) + r.
template <int D, int SPLIT>
__device__ __forceinline__ void load_column(float (&s)[D / SPLIT], const float* S, int dv, int p) {
#pragma unroll
  for (int m = 0; m < D / (4 * SPLIT); ++m)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[4 * m + r] = S[(4 * (SPLIT * m + p) + r) * D + dv];
}
template <int D, int SPLIT>
__device__ __forceinline__ void store_column(const float (&s)[D / SPLIT], float* S, int dv, int p) {
#pragma unroll
  for (int m = 0; m < D / (4 * SPLIT); ++m)
#pragma unroll
    for (int r = 0; r < 4; ++r) S[(4 * (SPLIT * m + p) + r) * D + dv] = s[4 * m + r];
}

// Sum over the SPLIT lanes that share a column (adjacent lanes; all 32 lanes of the warp must call).
template <int SPLIT>
__device__ __forceinline__ float pair_sum(float a) {
  if constexpr (SPLIT == 2) a += __shfl_xor_sync(0xffffffffu, a, 1);
  return a;
}

// One token of the gated delta rule on the column s = S[:, dv] (this thread's part p of it):
//   s = exp(g) * s;  u = beta (v - k.s);  s += k u;  return q.s
// ks, qs, es (= exp(g)) are D floats in shared memory, 16-byte aligned. Four partial sums break the
// FMA dependency chains. Every lane of a SPLIT group returns the same value.
template <int D, int SPLIT>
__device__ __forceinline__ float delta_step(float (&s)[D / SPLIT], const float* ks, const float* qs,
                                            const float* es, float v, float beta, int p) {
  const float4* k4 = reinterpret_cast<const float4*>(ks);
  const float4* q4 = reinterpret_cast<const float4*>(qs);
  const float4* e4 = reinterpret_cast<const float4*>(es);
  float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma unroll
  for (int m = 0; m < D / (4 * SPLIT); ++m) {
    const int i4 = SPLIT * m + p;
    const float4 e = e4[i4], k = k4[i4];
    s[4 * m + 0] *= e.x;
    s[4 * m + 1] *= e.y;
    s[4 * m + 2] *= e.z;
    s[4 * m + 3] *= e.w;
    a0 = fmaf(k.x, s[4 * m + 0], a0);
    a1 = fmaf(k.y, s[4 * m + 1], a1);
    a2 = fmaf(k.z, s[4 * m + 2], a2);
    a3 = fmaf(k.w, s[4 * m + 3], a3);
  }
  const float u = beta * (v - pair_sum<SPLIT>((a0 + a1) + (a2 + a3)));
  a0 = a1 = a2 = a3 = 0.f;
#pragma unroll
  for (int m = 0; m < D / (4 * SPLIT); ++m) {
    const int i4 = SPLIT * m + p;
    const float4 k = k4[i4], q = q4[i4];
    s[4 * m + 0] = fmaf(k.x, u, s[4 * m + 0]);
    s[4 * m + 1] = fmaf(k.y, u, s[4 * m + 1]);
    s[4 * m + 2] = fmaf(k.z, u, s[4 * m + 2]);
    s[4 * m + 3] = fmaf(k.w, u, s[4 * m + 3]);
    a0 = fmaf(q.x, s[4 * m + 0], a0);
    a1 = fmaf(q.y, s[4 * m + 1], a1);
    a2 = fmaf(q.z, s[4 * m + 2], a2);
    a3 = fmaf(q.w, s[4 * m + 3], a3);
  }
  return pair_sum<SPLIT>((a0 + a1) + (a2 + a3));
}

// ---------------------------------------------------------------------------------------------------
// kda_recurrent: grid (n_seqs, H, D*SPLIT/32), one warp per block; the warp covers 32/SPLIT value columns,
// lane = SPLIT * column + part.

template <int D>
__global__ void __launch_bounds__(32)
    kda_recurrent_kernel(const KdaSeq* __restrict__ seqs, int H, const float* __restrict__ q,
                         const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ g,
                         const float* __restrict__ beta, float* __restrict__ o) {
  constexpr int SPLIT = kSplit<D>;
  constexpr int E = D / 32;  // elements of q/k/g each lane stages per token
  __shared__ __align__(16) float ks[2][D], qs[2][D], es[2][D];
  const KdaSeq sq = seqs[blockIdx.x];
  const int h = blockIdx.y, lane = threadIdx.x, p = lane % SPLIT;
  const int dv = blockIdx.z * (32 / SPLIT) + lane / SPLIT;
  const int C = H * D;
  float* S = sq.S + static_cast<size_t>(h) * D * D;
  float s[D / SPLIT];
  load_column<D, SPLIT>(s, S, dv, p);

  float nq[E], nk[E], ng[E], nv = 0.f, nb = 0.f;
  auto prefetch = [&](int t) {
    if (t >= sq.n) return;
    const size_t row = static_cast<size_t>(sq.offset + t);
    const size_t base = row * C + static_cast<size_t>(h) * D;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      nq[e] = q[base + lane + 32 * e];
      nk[e] = k[base + lane + 32 * e];
      ng[e] = g[base + lane + 32 * e];
    }
    nv = v[base + dv];
    nb = beta[row * H + h];
  };
  prefetch(0);
  for (int t = 0; t < sq.n; ++t) {
    const int b = t & 1;  // double buffer: one __syncwarp per token suffices
#pragma unroll
    for (int e = 0; e < E; ++e) {
      qs[b][lane + 32 * e] = nq[e];
      ks[b][lane + 32 * e] = nk[e];
      es[b][lane + 32 * e] = expf(ng[e]);
    }
    const float vt = nv, bt = nb;
    __syncwarp();
    prefetch(t + 1);
    const float ot = delta_step<D, SPLIT>(s, ks[b], qs[b], es[b], vt, bt, p);
    if (p == 0) o[static_cast<size_t>(sq.offset + t) * C + static_cast<size_t>(h) * D + dv] = ot;
  }
  store_column<D, SPLIT>(s, S, dv, p);
}

// ---------------------------------------------------------------------------------------------------
// kda_chunked: grid (n_seqs, H), D threads; thread = value column dv (and column d of the staging loads).
// Shared memory (floats): Qs, Ks, Gs, Vs [L][D]; Akk, Aqk [L][L]; eL [D]; bs [L]  (L = chunk).

inline size_t chunked_smem_bytes(int D, int L) {
  return (4 * static_cast<size_t>(L) * D + 2 * static_cast<size_t>(L) * L + D + L) * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(D)
    kda_chunked_kernel(const KdaSeq* __restrict__ seqs, int H, int L, const float* __restrict__ q,
                       const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ g,
                       const float* __restrict__ beta, float* __restrict__ o) {
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);  // q, then Q exp(G)
  float* Ks = Qs + L * D;                       // k, then exp(G_last - G) k
  float* Gs = Ks + L * D;                       // G (cumulative log decay), then exp(G) k, then W
  float* Vs = Gs + L * D;                       // v, then U, then V~ (column dv only touched by thread dv)
  float* Akk = Vs + L * D;                      // [L][L], strictly lower, without beta
  float* Aqk = Akk + L * L;                     // [L][L], lower incl. diagonal
  float* eL = Aqk + L * L;                      // exp(G_last)
  float* bs = eL + D;                           // beta of the chunk's tokens

  const KdaSeq sq = seqs[blockIdx.x];
  const int h = blockIdx.y, tid = threadIdx.x;
  const int C = H * D;
  const size_t hcol = static_cast<size_t>(h) * D;
  float* S = sq.S + hcol * D;
  float s[D];
  load_column<D, 1>(s, S, tid, 0);

  for (int t0 = 0; t0 < sq.n; t0 += L) {
    const int Lc = min(L, sq.n - t0);
    __syncthreads();  // the previous chunk's readers are done with every buffer

    // Stage the chunk; thread tid owns column tid, so the cumulative decay is a thread-local scan.
    {
      float run = 0.f;
      for (int i = 0; i < Lc; ++i) {
        const size_t at = static_cast<size_t>(sq.offset + t0 + i) * C + hcol + tid;
        Qs[i * D + tid] = q[at];
        Ks[i * D + tid] = k[at];
        Vs[i * D + tid] = v[at];
        run += g[at];
        Gs[i * D + tid] = run;
      }
      for (int i = tid; i < Lc; i += D) bs[i] = beta[static_cast<size_t>(sq.offset + t0 + i) * H + h];
    }
    __syncthreads();

    // A_kk[i][j] = sum_d k_i k_j exp(G_i - G_j) (j < i), A_qk[i][j] = same with q_i (j <= i).
    // One (i, j) pair per thread; the float4 index is rotated by the thread id so that a warp's lanes
    // (which read different rows) hit different banks.
    {
      const int npairs = Lc * (Lc + 1) / 2;
      for (int p = tid; p < npairs; p += D) {
        int i = static_cast<int>((sqrtf(8.f * p + 1.f) - 1.f) * 0.5f);
        while (i * (i + 1) / 2 > p) --i;
        while ((i + 1) * (i + 2) / 2 <= p) ++i;
        const int j = p - i * (i + 1) / 2;
        const float4* Ki = reinterpret_cast<const float4*>(Ks + i * D);
        const float4* Qi = reinterpret_cast<const float4*>(Qs + i * D);
        const float4* Gi = reinterpret_cast<const float4*>(Gs + i * D);
        const float4* Kj = reinterpret_cast<const float4*>(Ks + j * D);
        const float4* Gj = reinterpret_cast<const float4*>(Gs + j * D);
        float akk = 0.f, aqk = 0.f;
#pragma unroll 4
        for (int d0 = 0; d0 < D / 4; ++d0) {
          const int d4 = (d0 + tid) & (D / 4 - 1);
          const float4 gi = Gi[d4], gj = Gj[d4], ki = Ki[d4], qi = Qi[d4], kj = Kj[d4];
          const float ex = kj.x * expf(gi.x - gj.x), ey = kj.y * expf(gi.y - gj.y);
          const float ez = kj.z * expf(gi.z - gj.z), ew = kj.w * expf(gi.w - gj.w);
          akk = fmaf(ki.x, ex, fmaf(ki.y, ey, fmaf(ki.z, ez, fmaf(ki.w, ew, akk))));
          aqk = fmaf(qi.x, ex, fmaf(qi.y, ey, fmaf(qi.z, ez, fmaf(qi.w, ew, aqk))));
        }
        if (j < i) Akk[i * L + j] = akk;
        Aqk[i * L + j] = aqk;
      }
    }
    __syncthreads();

    // Column-local (column tid): Q exp(G), exp(G_last - G) k, exp(G) k; then the forward substitutions
    // W_i = beta_i (exp(G_i) k_i - sum_{j<i} A_kk[i][j] W_j) and the same for U from V.
    {
      const float gl = Gs[(Lc - 1) * D + tid];
      eL[tid] = expf(gl);
      for (int i = 0; i < Lc; ++i) {
        const int at = i * D + tid;
        const float gi = Gs[at], ki = Ks[at];
        Qs[at] *= expf(gi);
        Ks[at] = ki * expf(gl - gi);
        Gs[at] = ki * expf(gi);
      }
      for (int i = 0; i < Lc; ++i) {
        float w = Gs[i * D + tid], u = Vs[i * D + tid];
        for (int j = 0; j < i; ++j) {
          const float a = Akk[i * L + j];
          w = fmaf(-a, Gs[j * D + tid], w);
          u = fmaf(-a, Vs[j * D + tid], u);
        }
        Gs[i * D + tid] = bs[i] * w;
        Vs[i * D + tid] = bs[i] * u;
      }
    }
    __syncthreads();

    // Value column dv = tid: V~_i = U_i - W_i . s;  O_i = Qe_i . s + sum_{j<=i} A_qk[i][j] V~_j.
    for (int i = 0; i < Lc; ++i) {
      const float4* W4 = reinterpret_cast<const float4*>(Gs + i * D);
      const float4* Q4 = reinterpret_cast<const float4*>(Qs + i * D);
      float w0 = 0.f, w1 = 0.f, q0 = 0.f, q1 = 0.f;
#pragma unroll
      for (int d4 = 0; d4 < D / 4; ++d4) {
        const float4 w = W4[d4], qe = Q4[d4];
        w0 = fmaf(w.x, s[4 * d4 + 0], w0);
        w1 = fmaf(w.y, s[4 * d4 + 1], w1);
        w0 = fmaf(w.z, s[4 * d4 + 2], w0);
        w1 = fmaf(w.w, s[4 * d4 + 3], w1);
        q0 = fmaf(qe.x, s[4 * d4 + 0], q0);
        q1 = fmaf(qe.y, s[4 * d4 + 1], q1);
        q0 = fmaf(qe.z, s[4 * d4 + 2], q0);
        q1 = fmaf(qe.w, s[4 * d4 + 3], q1);
      }
      const float vt = Vs[i * D + tid] - (w0 + w1);
      Vs[i * D + tid] = vt;
      float acc = q0 + q1;
      for (int j = 0; j <= i; ++j) acc = fmaf(Aqk[i * L + j], Vs[j * D + tid], acc);
      o[static_cast<size_t>(sq.offset + t0 + i) * C + hcol + tid] = acc;
    }
    // s = exp(G_last) s + sum_i (exp(G_last - G_i) k_i) V~_i
    {
      const float4* e4 = reinterpret_cast<const float4*>(eL);
#pragma unroll
      for (int d4 = 0; d4 < D / 4; ++d4) {
        const float4 e = e4[d4];
        s[4 * d4 + 0] *= e.x;
        s[4 * d4 + 1] *= e.y;
        s[4 * d4 + 2] *= e.z;
        s[4 * d4 + 3] *= e.w;
      }
      for (int i = 0; i < Lc; ++i) {
        const float vt = Vs[i * D + tid];
        const float4* K4 = reinterpret_cast<const float4*>(Ks + i * D);
#pragma unroll
        for (int d4 = 0; d4 < D / 4; ++d4) {
          const float4 kd = K4[d4];
          s[4 * d4 + 0] = fmaf(kd.x, vt, s[4 * d4 + 0]);
          s[4 * d4 + 1] = fmaf(kd.y, vt, s[4 * d4 + 1]);
          s[4 * d4 + 2] = fmaf(kd.z, vt, s[4 * d4 + 2]);
          s[4 * d4 + 3] = fmaf(kd.w, vt, s[4 * d4 + 3]);
        }
      }
    }
  }
  store_column<D, 1>(s, S, tid, 0);
}

// ---------------------------------------------------------------------------------------------------
// kda_conv_l2norm: grid (token tiles, H, n_seqs), D threads; thread = channel h*D + tid.

template <int D, int W>
__global__ void __launch_bounds__(D)
    kda_conv_l2norm_kernel(const KdaSeq* __restrict__ seqs, int H, const float* __restrict__ xq,
                           const float* __restrict__ xk, const float* __restrict__ xv,
                           const float* __restrict__ wq, const float* __restrict__ wk,
                           const float* __restrict__ wv, float* __restrict__ q, float* __restrict__ k,
                           float* __restrict__ v) {
  constexpr int P = W - 1;
  constexpr int PS = P > 0 ? P : 1;
  __shared__ float2 red[D / 32];
  const KdaSeq sq = seqs[blockIdx.z];
  const int t_begin = blockIdx.x * kConvTile;
  if (t_begin >= sq.n) return;  // uniform over the block
  const int t_end = min(sq.n, t_begin + kConvTile);
  const int h = blockIdx.y, C = H * D, c = h * D + threadIdx.x;

  float w_q[W], w_k[W], w_v[W];
#pragma unroll
  for (int j = 0; j < W; ++j) {
    w_q[j] = wq[static_cast<size_t>(c) * W + j];
    w_k[j] = wk[static_cast<size_t>(c) * W + j];
    w_v[j] = wv[static_cast<size_t>(c) * W + j];
  }
  // Old conv state: only tile 0 reads it (kConvTile >= P), and only tile 0 rewrites it below.
  float s_q[PS] = {}, s_k[PS] = {}, s_v[PS] = {};
  if (blockIdx.x == 0) {
#pragma unroll
    for (int j = 0; j < P; ++j) {
      s_q[j] = sq.conv_q[static_cast<size_t>(c) * P + j];
      s_k[j] = sq.conv_k[static_cast<size_t>(c) * P + j];
      s_v[j] = sq.conv_v[static_cast<size_t>(c) * P + j];
    }
  }
  const float qscale = 1.0f / sqrtf(static_cast<float>(D));
  for (int t = t_begin; t < t_end; ++t) {
    const float yq = conv_silu_at<W>(xq, C, c, sq.offset, t, w_q, s_q);
    const float yk = conv_silu_at<W>(xk, C, c, sq.offset, t, w_k, s_k);
    const float yv = conv_silu_at<W>(xv, C, c, sq.offset, t, w_v, s_v);
    const float2 ss = block_sum2<D>(yq * yq, yk * yk, red);
    const size_t at = static_cast<size_t>(sq.offset + t) * C + c;
    q[at] = yq * (qscale / sqrtf(ss.x + 1e-6f));
    k[at] = yk * (1.0f / sqrtf(ss.y + 1e-6f));
    v[at] = yv;
  }
  if (blockIdx.x == 0) {
    // New state = the last P inputs of [old state, x] (old values are in registers).
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int tau = sq.n - P + j;
      const size_t at = static_cast<size_t>(sq.offset + tau) * C + c;
      const size_t sa = static_cast<size_t>(c) * P + j;
      if constexpr (P > 0) {
        sq.conv_q[sa] = tau < 0 ? pick(s_q, P + tau) : xq[at];
        sq.conv_k[sa] = tau < 0 ? pick(s_k, P + tau) : xk[at];
        sq.conv_v[sa] = tau < 0 ? pick(s_v, P + tau) : xv[at];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// kda_gates: elementwise over N*C decays, then N*H betas (one grid-stride loop over both).

__global__ void kda_gates_kernel(long long NC, long long NH, int H, int D, float* __restrict__ g,
                                 const float* __restrict__ dt_bias, const float* __restrict__ A_log, bool bounded,
                                 float lower_bound, float* __restrict__ beta) {
  const long long C = static_cast<long long>(H) * D;
  for (long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x; i < NC + NH;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    if (i < NC) {
      const int c = static_cast<int>(i % C);
      const float a = expf(A_log[c / D]);
      g[i] = gate_value(g[i] + dt_bias[c], a, bounded, lower_bound);
    } else {
      beta[i - NC] = sigmoid(beta[i - NC]);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// kda_output_gate: block of D threads per (row, head).

template <int D>
__global__ void __launch_bounds__(D)
    kda_output_gate_kernel(int H, float* __restrict__ o, const float* __restrict__ norm_w, float eps,
                           const float* __restrict__ gate) {
  __shared__ float2 red[D / 32];
  const size_t at = static_cast<size_t>(blockIdx.x) * D + threadIdx.x;  // blockIdx.x = row * H + head
  const float x = o[at];
  const float ss = block_sum2<D>(x * x, 0.f, red).x;
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  o[at] = x * inv * norm_w[threadIdx.x] * sigmoid(gate[at]);
}

// ---------------------------------------------------------------------------------------------------
// kda_decode_fused: grid (n_seqs, H), D*SPLIT threads. Threads tid < D do channel h*D + tid (conv, norms,
// gates); for the recurrence and the output norm thread tid is part tid % SPLIT of value column tid / SPLIT.

template <int D, int W>
__global__ void __launch_bounds__(D * kSplit<D>)
    kda_decode_fused_kernel(const KdaSeq* __restrict__ seqs, int H, const float* __restrict__ xq,
                            const float* __restrict__ xk, const float* __restrict__ xv,
                            const float* __restrict__ wq, const float* __restrict__ wk,
                            const float* __restrict__ wv, const float* __restrict__ graw,
                            const float* __restrict__ dt_bias, const float* __restrict__ A_log, bool bounded,
                            float lower_bound, const float* __restrict__ braw, const float* __restrict__ gate,
                            const float* __restrict__ norm_w, float eps, float* __restrict__ o) {
  constexpr int SPLIT = kSplit<D>;
  constexpr int NT = D * SPLIT;
  constexpr int P = W - 1;
  constexpr int PS = P > 0 ? P : 1;
  __shared__ float2 red[NT / 32];
  __shared__ __align__(16) float ks[D], qs[D], es[D], vs[D];
  const KdaSeq sq = seqs[blockIdx.x];
  if (sq.n < 1) return;  // contract: n == 1; a sequence without a token has nothing to do
  const int h = blockIdx.y, tid = threadIdx.x, C = H * D;
  const size_t row = static_cast<size_t>(sq.offset);

  // Conv + SiLU of the one new token; the new conv state drops the oldest input.
  float yq = 0.f, yk = 0.f, yv = 0.f;
  if (tid < D) {
    const int c = h * D + tid;
    const size_t at = row * C + c;
    float w_q[W], w_k[W], w_v[W], s_q[PS] = {}, s_k[PS] = {}, s_v[PS] = {};
#pragma unroll
    for (int j = 0; j < W; ++j) {
      w_q[j] = wq[static_cast<size_t>(c) * W + j];
      w_k[j] = wk[static_cast<size_t>(c) * W + j];
      w_v[j] = wv[static_cast<size_t>(c) * W + j];
    }
#pragma unroll
    for (int j = 0; j < P; ++j) {
      s_q[j] = sq.conv_q[static_cast<size_t>(c) * P + j];
      s_k[j] = sq.conv_k[static_cast<size_t>(c) * P + j];
      s_v[j] = sq.conv_v[static_cast<size_t>(c) * P + j];
    }
    yq = conv_silu_at<W>(xq, C, c, sq.offset, 0, w_q, s_q);
    yk = conv_silu_at<W>(xk, C, c, sq.offset, 0, w_k, s_k);
    yv = conv_silu_at<W>(xv, C, c, sq.offset, 0, w_v, s_v);
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const size_t sa = static_cast<size_t>(c) * P + j;
      sq.conv_q[sa] = j + 1 < P ? s_q[j + 1 < P ? j + 1 : 0] : xq[at];
      sq.conv_k[sa] = j + 1 < P ? s_k[j + 1 < P ? j + 1 : 0] : xk[at];
      sq.conv_v[sa] = j + 1 < P ? s_v[j + 1 < P ? j + 1 : 0] : xv[at];
    }
  }
  const float2 ss = block_sum2<NT>(yq * yq, yk * yk, red);  // threads >= D add zeros
  if (tid < D) {
    const int c = h * D + tid;
    const size_t at = row * C + c;
    qs[tid] = yq * ((1.0f / sqrtf(static_cast<float>(D))) / sqrtf(ss.x + 1e-6f));
    ks[tid] = yk * (1.0f / sqrtf(ss.y + 1e-6f));
    es[tid] = expf(gate_value(graw[at] + dt_bias[c], expf(A_log[h]), bounded, lower_bound));
    vs[tid] = yv;
  }
  const float bt = sigmoid(braw[row * H + h]);
  __syncthreads();

  const int dv = tid / SPLIT, p = tid % SPLIT;
  float* S = sq.S + static_cast<size_t>(h) * D * D;
  float s[D / SPLIT];
  load_column<D, SPLIT>(s, S, dv, p);
  const float ot = delta_step<D, SPLIT>(s, ks, qs, es, vs[dv], bt, p);
  store_column<D, SPLIT>(s, S, dv, p);

  const float on = block_sum2<NT>(p == 0 ? ot * ot : 0.f, 0.f, red).x;
  const float inv = 1.0f / sqrtf(on / static_cast<float>(D) + eps);
  const size_t at = row * C + static_cast<size_t>(h) * D + dv;
  if (p == 0) o[at] = ot * inv * norm_w[dv] * sigmoid(gate[at]);
}

// ---------------------------------------------------------------------------------------------------
// Host-side dispatch.

bool supported_d(int D) { return D == 32 || D == 64 || D == 128; }

template <int D>
cudaError_t launch_recurrent(const KdaSeq* seqs, int n_seqs, int H, const float* q, const float* k,
                             const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  kda_recurrent_kernel<D><<<dim3(n_seqs, H, D * kSplit<D> / 32), 32, 0, stream>>>(seqs, H, q, k, v, g, beta, o);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_chunked(const KdaSeq* seqs, int n_seqs, int H, int L, const float* q, const float* k,
                           const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  const size_t smem = chunked_smem_bytes(D, L);
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kda_chunked_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  kda_chunked_kernel<D><<<dim3(n_seqs, H), D, smem, stream>>>(seqs, H, L, q, k, v, g, beta, o);
  return cudaGetLastError();
}

template <int D, int W>
cudaError_t launch_conv(const KdaSeq* seqs, int n_seqs, int N, int H, const float* xq, const float* xk,
                        const float* xv, const float* wq, const float* wk, const float* wv, float* q, float* k,
                        float* v, cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((N + kConvTile - 1) / kConvTile);
  kda_conv_l2norm_kernel<D, W><<<dim3(tiles, H, n_seqs), D, 0, stream>>>(seqs, H, xq, xk, xv, wq, wk, wv, q, k, v);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_conv_d(int W, const KdaSeq* seqs, int n_seqs, int N, int H, const float* xq, const float* xk,
                          const float* xv, const float* wq, const float* wk, const float* wv, float* q, float* k,
                          float* v, cudaStream_t stream) {
  switch (W) {
    case 1: return launch_conv<D, 1>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 2: return launch_conv<D, 2>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 3: return launch_conv<D, 3>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 4: return launch_conv<D, 4>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <int D>
cudaError_t launch_output_gate(int N, int H, float* o, const float* norm_w, float eps, const float* gate,
                               cudaStream_t stream) {
  kda_output_gate_kernel<D><<<static_cast<unsigned>(static_cast<long long>(N) * H), D, 0, stream>>>(H, o, norm_w,
                                                                                                     eps, gate);
  return cudaGetLastError();
}

template <int D, int W>
cudaError_t launch_fused(const KdaSeq* seqs, int n_seqs, int H, const float* xq, const float* xk, const float* xv,
                         const float* wq, const float* wk, const float* wv, const float* graw, const float* dt_bias,
                         const float* A_log, bool bounded, float lower_bound, const float* braw, const float* gate,
                         const float* norm_w, float eps, float* o, cudaStream_t stream) {
  kda_decode_fused_kernel<D, W><<<dim3(n_seqs, H), D * kSplit<D>, 0, stream>>>(seqs, H, xq, xk, xv, wq, wk, wv, graw, dt_bias,
                                                                    A_log, bounded, lower_bound, braw, gate, norm_w,
                                                                    eps, o);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_fused_d(int W, const KdaSeq* seqs, int n_seqs, int H, const float* xq, const float* xk,
                           const float* xv, const float* wq, const float* wk, const float* wv, const float* graw,
                           const float* dt_bias, const float* A_log, bool bounded, float lower_bound,
                           const float* braw, const float* gate, const float* norm_w, float eps, float* o,
                           cudaStream_t stream) {
  switch (W) {
#define K3_FUSED_CASE(WW)                                                                                        \
  case WW:                                                                                                       \
    return launch_fused<D, WW>(seqs, n_seqs, H, xq, xk, xv, wq, wk, wv, graw, dt_bias, A_log, bounded,         \
                               lower_bound, braw, gate, norm_w, eps, o, stream);
    K3_FUSED_CASE(1)
    K3_FUSED_CASE(2)
    K3_FUSED_CASE(3)
    K3_FUSED_CASE(4)
#undef K3_FUSED_CASE
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t kda_conv_l2norm(const KdaSeq* seqs, int n_seqs, int N, int H, int D, int W, const float* xq,
                            const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                            float* q, float* k, float* v, cudaStream_t stream) {
  static_assert(kConvTile >= kMaxConvW - 1, "tile 0 must hold every token that reads the old conv state");
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0 || n_seqs > 65535 || N < 0 || W < 1 || W > kMaxConvW)
    return cudaErrorInvalidValue;
  if (n_seqs == 0 || N == 0) return cudaSuccess;
  switch (D) {
    case 32: return launch_conv_d<32>(W, seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 64: return launch_conv_d<64>(W, seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    default: return launch_conv_d<128>(W, seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
  }
}

cudaError_t kda_gates(int N, int H, int D, float* g, const float* dt_bias, const float* A_log, bool bounded,
                      float lower_bound, float* beta, cudaStream_t stream) {
  if (N < 0 || H <= 0 || D <= 0) return cudaErrorInvalidValue;
  const long long NC = static_cast<long long>(N) * H * D, NH = static_cast<long long>(N) * H;
  if (NC == 0) return cudaSuccess;
  const long long total = NC + NH;
  const int threads = 256;
  const long long blocks = (total + threads - 1) / threads;
  kda_gates_kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), threads, 0, stream>>>(
      NC, NH, H, D, g, dt_bias, A_log, bounded, lower_bound, beta);
  return cudaGetLastError();
}

cudaError_t kda_recurrent(const KdaSeq* seqs, int n_seqs, int H, int D, const float* q, const float* k,
                          const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0) return cudaErrorInvalidValue;
  if (n_seqs == 0) return cudaSuccess;
  switch (D) {
    case 32: return launch_recurrent<32>(seqs, n_seqs, H, q, k, v, g, beta, o, stream);
    case 64: return launch_recurrent<64>(seqs, n_seqs, H, q, k, v, g, beta, o, stream);
    default: return launch_recurrent<128>(seqs, n_seqs, H, q, k, v, g, beta, o, stream);
  }
}

cudaError_t kda_chunked(const KdaSeq* seqs, int n_seqs, int H, int D, int chunk, const float* q, const float* k,
                        const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0 || (chunk != 16 && chunk != 32 && chunk != 64))
    return cudaErrorInvalidValue;
  if (n_seqs == 0) return cudaSuccess;
  switch (D) {
    case 32: return launch_chunked<32>(seqs, n_seqs, H, chunk, q, k, v, g, beta, o, stream);
    case 64: return launch_chunked<64>(seqs, n_seqs, H, chunk, q, k, v, g, beta, o, stream);
    default: return launch_chunked<128>(seqs, n_seqs, H, chunk, q, k, v, g, beta, o, stream);
  }
}

cudaError_t kda_output_gate(int N, int H, int D, float* o, const float* norm_w, float eps, const float* gate,
                            cudaStream_t stream) {
  if (!supported_d(D) || H <= 0 || N < 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  switch (D) {
    case 32: return launch_output_gate<32>(N, H, o, norm_w, eps, gate, stream);
    case 64: return launch_output_gate<64>(N, H, o, norm_w, eps, gate, stream);
    default: return launch_output_gate<128>(N, H, o, norm_w, eps, gate, stream);
  }
}

cudaError_t kda_decode_fused(const KdaSeq* seqs, int n_seqs, int H, int D, int W, const float* xq, const float* xk,
                             const float* xv, const float* wq, const float* wk, const float* wv, const float* graw,
                             const float* dt_bias, const float* A_log, bool bounded, float lower_bound,
                             const float* braw, const float* gate, const float* norm_w, float eps, float* o,
                             cudaStream_t stream) {
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0 || W < 1 || W > kMaxConvW) return cudaErrorInvalidValue;
  if (n_seqs == 0) return cudaSuccess;
  switch (D) {
    case 32:
      return launch_fused_d<32>(W, seqs, n_seqs, H, xq, xk, xv, wq, wk, wv, graw, dt_bias, A_log, bounded,
                                lower_bound, braw, gate, norm_w, eps, o, stream);
    case 64:
      return launch_fused_d<64>(W, seqs, n_seqs, H, xq, xk, xv, wq, wk, wv, graw, dt_bias, A_log, bounded,
                                lower_bound, braw, gate, norm_w, eps, o, stream);
    default:
      return launch_fused_d<128>(W, seqs, n_seqs, H, xq, xk, xv, wq, wk, wv, graw, dt_bias, A_log, bounded,
                                 lower_bound, braw, gate, norm_w, eps, o, stream);
  }
}

}  // namespace k3::cuda
