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
//   warp's consecutive dv are coalesced. The recurrent and decode kernels give each column to D/32
//   adjacent lanes (32 state values each, log2(D/32) shuffles per dot product, kSplit below): a whole
//   column per thread needed > 255 registers and spilled, and 64 values per thread (two lanes, until
//   session 40) left the decode kernel at one block of 142 registers a thread per SM. The chunked kernel
//   keeps one thread per column (207 registers, no spill).
// - kda_recurrent: one warp per (seq, head, 32/kSplit dv columns), so even a decode batch of 1 spreads
//   over H * D*kSplit/32 blocks. Token data is double-buffered in shared memory (one __syncwarp per
//   token) and the next token's inputs are prefetched into registers while the current one is computed.
// - kda_chunked (parallel over chunks, FLA chunk_kda's structure; fp32 FMA, no tensor cores). Three
//   kernels and a workspace of per-row planes (so the workspace needs no per-chunk slot table):
//   1. kda_chunk_table_kernel (1 block): exclusive prefix of the per-sequence chunk counts.
//   2. kda_chunk_intra_kernel, grid (chunk-count bound, H), 256 threads per (chunk, head): stages q, k, g,
//      scans G = cumulative log decay; A_kk / A_qk from one (i, j) pair per thread with exp(G_i - G_j)
//      (every exponent <= 0, nothing overflows whatever the decays); forward substitution
//      X_i = beta_i (B_i - sum_{j<i} A_kk[i][j] X_j) with one W or U column per thread held in registers
//      (fully unrolled, L floats); writes W, U, Q exp(G), exp(G_last - G) k and A_qk rows. The decayed-k
//      plane holds exp(G_last) in each chunk's last row (there the decayed k is k itself).
//   3. kda_chunk_state_kernel, grid (seq, H, D/32), 256 threads per 32-column value tile: walks the chunks
//      in order with the state tile in registers (+ a shared copy): V~ = U - W S, O = Q exp(G) S + A_qk V~
//      (the output is fused here, so the per-chunk states are never stored), S = exp(G_last) S + Kd^T V~.
//      Register tiles of 2 rows x 4 columns (outputs) and 4 rows x 4 columns (state); W / Q rows padded
//      to D+4 floats so a warp's 8 rows hit distinct banks. The next chunk's operands stream in with
//      cp.async into each shared buffer as soon as the step that reads it is done.
//   For 1 x 4096 tokens, H = 32, D = 128 that is 2048 intra blocks and 128 state blocks of 64 chunks.
//   (The first, serial one-block-per-(seq, head) kernel and the overload without a workspace are gone: the
//   model always passes a workspace and 16-byte-aligned rows.)
// - kda_conv_l2norm: a warp per (tile of 16 tokens, head, seq), D / 32 channels a lane, the last W - 1 inputs
//   in registers as it walks the tile (token tiles run in parallel: a tile's first W - 1 inputs are read again);
//   only tile 0 touches the state (it alone reads it, as 16 >= W-1), writing the new state after it has read the
//   old one into registers. The per-head L2 norm is a warp sum per token.
// - kda_decode_fused: a thread-block cluster of D/32 blocks of D threads per (seq, head); block z owns value
//   columns [32 z, 32 z + 32) of the state (16 KB) and thread d is channel d for the conv, norms and gates
//   (every block computes them for all D channels: the k.s and q.s dot products need the whole of q and k).
//   The output norm spans the head's D columns: each block's partial sum of squares goes to the others
//   through distributed shared memory. Why: with one block of 256 threads per (seq, head) the state's
//   64 KB moved at 1.8 TB/s at batch 256 (one block per SM, its load -> reduce -> compute -> store chain
//   exposed); four blocks of 128 threads, 32 state registers each, keep several per SM in flight. It uses
//   the same device helpers as the unfused kernels (the same delta step), so the state matches them bit
//   for bit and the outputs to rounding.
#include "k3/backend/cuda/kda_kernels.h"

#include "k3/backend/cuda/cache_dtype.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)
#include "k3/backend/cuda/smem_ptx.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstddef>
#include <climits>
#include <cstdint>
#include <type_traits>

namespace k3::cuda {
namespace {

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

// How many threads share one value column in the recurrent / decode kernels: D/32, so that every thread
// holds 32 state values whatever D (one thread with all 128 needed more than 255 registers and spilled; two
// lanes of 64 each held the fused decode kernel to one block per SM). The lanes split the key dimension
// and combine dot products with log2(SPLIT) shuffles. Lane p of a group owns the float4 groups
// i4 = SPLIT*m + p, so the group reads adjacent 16-byte words (different banks) of the staged k/q/exp(g) rows.
template <int D>
constexpr int kSplit = D / 32;

// How the recurrent / decode kernels keep the state (--mamba-ssm-cache-dtype): StateT = float, or
// uint16_t holding bf16 bits (widened on load, rounded to nearest even after every token, as stored: the
// token-by-token form then gives the same state however a sequence's tokens are split into calls, which
// keeps batching and prefix caching exact; the arithmetic in between is fp32 and identical for both).
__device__ __forceinline__ float state_load(const float* p) { return *p; }
__device__ __forceinline__ void state_store(float* p, float v) { *p = v; }
__device__ __forceinline__ float state_load(const uint16_t* p) { return bf16_bits_to_f32(*p); }
__device__ __forceinline__ void state_store(uint16_t* p, float v) { *p = f32_to_bf16_bits(v); }

// The state after a token, as a StateT cache would hold it.
template <class StateT, int N>
__device__ __forceinline__ void round_state(float (&s)[N]) {
  if constexpr (!std::is_same_v<StateT, float>) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = bf16_bits_to_f32(f32_to_bf16_bits(s[i]));
  }
}

// Register slot 4m + r of part p holds key index dk = 4 (SPLIT m + p) + r.
template <int D, int SPLIT, class StateT>
__device__ __forceinline__ void load_column(float (&s)[D / SPLIT], const StateT* S, int dv, int p) {
#pragma unroll
  for (int m = 0; m < D / (4 * SPLIT); ++m)
#pragma unroll
    for (int r = 0; r < 4; ++r) s[4 * m + r] = state_load(S + (4 * (SPLIT * m + p) + r) * D + dv);
}
template <int D, int SPLIT, class StateT>
__device__ __forceinline__ void store_column(const float (&s)[D / SPLIT], StateT* S, int dv, int p) {
#pragma unroll
  for (int m = 0; m < D / (4 * SPLIT); ++m)
#pragma unroll
    for (int r = 0; r < 4; ++r) state_store(S + (4 * (SPLIT * m + p) + r) * D + dv, s[4 * m + r]);
}

// Sum over the SPLIT lanes that share a column (adjacent lanes; all 32 lanes of the warp must call).
template <int SPLIT>
__device__ __forceinline__ float pair_sum(float a) {
  static_assert(SPLIT == 1 || SPLIT == 2 || SPLIT == 4, "lanes per column");
  if constexpr (SPLIT >= 2) a += __shfl_xor_sync(0xffffffffu, a, 1);
  if constexpr (SPLIT == 4) a += __shfl_xor_sync(0xffffffffu, a, 2);  // (l0 + l1) + (l2 + l3) in every lane
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

template <int D, class StateT>
__global__ void __launch_bounds__(32)
    kda_recurrent_kernel(const KdaSeq* __restrict__ seqs, int H, const float* __restrict__ q,
                         const float* __restrict__ k, const float* __restrict__ v, const float* __restrict__ g,
                         const float* __restrict__ beta, float* __restrict__ o) {
  pdl::launch_dependents();
  constexpr int SPLIT = kSplit<D>;
  constexpr int E = D / 32;  // elements of q/k/g each lane stages per token
  __shared__ __align__(16) float ks[2][D], qs[2][D], es[2][D];
  const KdaSeq sq = seqs[blockIdx.x];
  const int h = blockIdx.y, lane = threadIdx.x, p = lane % SPLIT;
  const int dv = blockIdx.z * (32 / SPLIT) + lane / SPLIT;
  const int C = H * D;
  StateT* S = reinterpret_cast<StateT*>(sq.S) + static_cast<size_t>(h) * D * D;
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
    round_state<StateT>(s);
    if (p == 0) o[static_cast<size_t>(sq.offset + t) * C + static_cast<size_t>(h) * D + dv] = ot;
  }
  store_column<D, SPLIT>(s, S, dv, p);
}

// ---------------------------------------------------------------------------------------------------
// Parallel chunked path (see the design comment at the top): chunk table, intra-chunk kernel, and the
// state + output kernel. Workspace planes, indexed by the token's row (so no per-chunk slot table):
//   Wp, Up, Qp, Kp: [N][C]  W = T exp(G) k,  U = T v,  Q exp(G),  exp(G_last - G) k -- except that the
//                           last row of each chunk holds exp(G_last) in Kp (its decayed k is k itself)
//   Ap: [N][H][L]           A_qk row i of the chunk (zero for j > i)
//   base: [n_seqs + 1]      exclusive prefix of the per-sequence chunk counts

constexpr int kChunkThreads = 256;  // threads of the intra and state kernels
constexpr int kStateBV = 32;        // value columns per state block

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;

__device__ __forceinline__ int n_chunks(int n, int L) { return n > 0 ? (n + L - 1) / L : 0; }

// One block of 1024 threads: base[s] = sum_{s' < s} ceil(n_s' / L), base[n_seqs] = total.
__global__ void __launch_bounds__(1024)
    kda_chunk_table_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, int L, int* __restrict__ base) {
  pdl::launch_dependents();
  __shared__ int part[1024];
  const int tid = threadIdx.x, per = (n_seqs + 1023) / 1024;
  const int s0 = min(n_seqs, tid * per), s1 = min(n_seqs, s0 + per);
  int sum = 0;
  for (int s = s0; s < s1; ++s) sum += n_chunks(seqs[s].n, L);
  part[tid] = sum;
  __syncthreads();
  for (int off = 1; off < 1024; off <<= 1) {
    const int add = tid >= off ? part[tid - off] : 0;
    __syncthreads();
    part[tid] += add;
    __syncthreads();
  }
  int run = part[tid] - sum;
  for (int s = s0; s < s1; ++s) {
    base[s] = run;
    run += n_chunks(seqs[s].n, L);
  }
  if (tid == 1023) base[n_seqs] = part[1023];
}

// Intra-chunk kernel: grid (chunk-count bound, H), kChunkThreads threads; block = one (chunk, head).
// Shared memory (floats): Qs, Ks, Gs [L][D]; Akk [L][L]; bs [L].
constexpr size_t intra_smem_bytes(int D, int L) {
  return (3 * static_cast<size_t>(L) * D + static_cast<size_t>(L) * L + L) * sizeof(float);
}

template <int D, int L>
__global__ void __launch_bounds__(kChunkThreads, 1)
    kda_chunk_intra_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, const int* __restrict__ base, int H,
                           const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ g, const float* __restrict__ beta, float* __restrict__ Wp,
                           float* __restrict__ Up, float* __restrict__ Qp, float* __restrict__ Kp,
                           float* __restrict__ Ap) {
  pdl::launch_dependents();
  constexpr int NT = kChunkThreads, D4 = D / 4;
  static_assert(2 * D <= NT, "forward substitution maps one thread per W / U column");
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + L * D;
  float* Gs = Ks + L * D;
  float* Akk = Gs + L * D;  // strictly lower, without beta; zero elsewhere
  float* bs = Akk + L * L;  // beta, zero past the chunk's end

  const int b = blockIdx.x;
  if (b >= base[n_seqs]) return;  // the grid is an upper bound on the chunk count
  int lo = 0, hi = n_seqs - 1;    // last s with base[s] <= b (sequences without chunks are skipped)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (base[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  const KdaSeq sq = seqs[lo];
  const int t0 = (b - base[lo]) * L, Lc = min(L, sq.n - t0);
  const int h = blockIdx.y, tid = threadIdx.x, C = H * D;
  const size_t hcol = static_cast<size_t>(h) * D, row0 = static_cast<size_t>(sq.offset + t0);

  // Phase 1: stage q, k, g (zero past Lc), beta; clear Akk; cumulative log decay per column.
  for (int e = tid; e < L * D4; e += NT) {
    const int i = e / D4, d4 = e % D4;
    float4 qq = make_float4(0.f, 0.f, 0.f, 0.f), kk = qq, gg = qq;
    if (i < Lc) {
      const size_t at = (row0 + i) * C + hcol + 4 * d4;
      qq = *reinterpret_cast<const float4*>(q + at);
      kk = *reinterpret_cast<const float4*>(k + at);
      gg = *reinterpret_cast<const float4*>(g + at);
    }
    reinterpret_cast<float4*>(Qs)[e] = qq;
    reinterpret_cast<float4*>(Ks)[e] = kk;
    reinterpret_cast<float4*>(Gs)[e] = gg;
  }
  for (int e = tid; e < L * L; e += NT) Akk[e] = 0.f;
  for (int i = tid; i < L; i += NT) bs[i] = i < Lc ? beta[(row0 + i) * H + h] : 0.f;
  __syncthreads();
  for (int d = tid; d < D; d += NT) {
    float run = 0.f;
    for (int i = 0; i < Lc; ++i) {
      run += Gs[i * D + d];
      Gs[i * D + d] = run;
    }
  }
  __syncthreads();

  // Phase 2: A_kk[i][j] = sum_d k_i k_j exp(G_i - G_j) (j < i, to shared), A_qk[i][j] = same with q_i
  // (j <= i, straight to Ap). Every exponent is <= 0. One pair per thread; the float4 index is rotated by
  // the thread id so that lanes reading different rows hit different banks.
  {
    const int npairs = Lc * (Lc + 1) / 2;
    for (int p = tid; p < npairs; p += NT) {
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
      for (int d0 = 0; d0 < D4; ++d0) {
        const int d4 = (d0 + tid) & (D4 - 1);
        const float4 gi = Gi[d4], gj = Gj[d4], ki = Ki[d4], qi = Qi[d4], kj = Kj[d4];
        const float ex = kj.x * __expf(gi.x - gj.x), ey = kj.y * __expf(gi.y - gj.y);
        const float ez = kj.z * __expf(gi.z - gj.z), ew = kj.w * __expf(gi.w - gj.w);
        akk = fmaf(ki.x, ex, fmaf(ki.y, ey, fmaf(ki.z, ez, fmaf(ki.w, ew, akk))));
        aqk = fmaf(qi.x, ex, fmaf(qi.y, ey, fmaf(qi.z, ez, fmaf(qi.w, ew, aqk))));
      }
      if (j < i) Akk[i * L + j] = akk;
      Ap[((row0 + i) * H + h) * L + j] = aqk;
    }
  }
  __syncthreads();

  // Phase 3: forward substitution, one column per thread with the column in registers (loops fully
  // unrolled): X_i = beta_i (B_i - sum_{j<i} A_kk[i][j] X_j), B = exp(G) k for W (threads < D) and v for U.
  if (tid < 2 * D) {
    const bool isU = tid >= D;  // warp-uniform (D is a multiple of 32)
    const int col = isU ? tid - D : tid;
    float x[L];
#pragma unroll
    for (int i = 0; i < L; ++i) {
      float xi = 0.f;
      if (i < Lc) xi = isU ? v[(row0 + i) * C + hcol + col] : Ks[i * D + col] * expf(Gs[i * D + col]);
      x[i] = xi;
    }
    const float4* A4 = reinterpret_cast<const float4*>(Akk);
#pragma unroll
    for (int i = 0; i < L; ++i) {
      float a0 = x[i], a1 = 0.f;
#pragma unroll
      for (int j4 = 0; 4 * j4 < i; ++j4) {
        const float4 a = A4[(i * L) / 4 + j4];
        a0 = fmaf(-a.x, x[4 * j4], a0);
        if (4 * j4 + 1 < i) a1 = fmaf(-a.y, x[4 * j4 + 1], a1);
        if (4 * j4 + 2 < i) a0 = fmaf(-a.z, x[4 * j4 + 2], a0);
        if (4 * j4 + 3 < i) a1 = fmaf(-a.w, x[4 * j4 + 3], a1);
      }
      x[i] = bs[i] * (a0 + a1);
    }
    float* dst = isU ? Up : Wp;
#pragma unroll
    for (int i = 0; i < L; ++i)
      if (i < Lc) dst[(row0 + i) * C + hcol + col] = x[i];
  }

  // Phase 4 (no barrier needed: shared memory is only read): Q exp(G); exp(G_last - G) k, with exp(G_last)
  // in the chunk's last row instead; the zero upper triangle of A_qk.
  for (int e = tid; e < Lc * D; e += NT) {
    const int i = e / D, d = e % D;
    const float gi = Gs[e], gl = Gs[(Lc - 1) * D + d];
    const size_t at = (row0 + i) * C + hcol + d;
    Qp[at] = Qs[e] * expf(gi);
    Kp[at] = i == Lc - 1 ? expf(gl) : Ks[e] * expf(gl - gi);
  }
  for (int e = tid; e < Lc * L; e += NT) {
    const int i = e / L, j = e % L;
    if (j > i) Ap[((row0 + i) * H + h) * L + j] = 0.f;
  }
}

// State + output kernel: grid (n_seqs, H, D / kStateBV), kChunkThreads threads; walks the sequence's chunks
// in order with the state tile S[:, v0 : v0 + BV] in registers (and a copy in shared memory).
// Per chunk:  V~ = U - W S;  O = Q exp(G) S + A_qk V~;  S = exp(G_last) S + (exp(G_last - G) k)^T V~.
// Shared memory (floats): Ws, Qs [L][D+4] (padded: a warp reads 8 rows at one column), Ks [L][D],
// Us [L][BV], As [L][L+4], eL [D], Ss [D][BV], Vn [L][BV]. The next chunk's operands are fetched with
// cp.async into each buffer as soon as the step that reads it is done (three commit groups per chunk).
template <int D, int L>
struct StateCfg {
  static constexpr int BV = kStateBV, LDW = D + 4, LDA = L + 4;
  static constexpr int RO = L >= 32 ? L / 32 : 1;  // output rows per thread (rows rg*RO + r)
  static constexpr int RS = D / 32;                // state rows per thread (rows sg*RS + r)
  static constexpr size_t floats = 2 * static_cast<size_t>(L) * LDW + static_cast<size_t>(L) * D +
                                   static_cast<size_t>(L) * BV + static_cast<size_t>(L) * LDA + D +
                                   static_cast<size_t>(D) * BV + static_cast<size_t>(L) * BV;
  static constexpr size_t bytes = floats * sizeof(float);
};

template <int D, int L>
__global__ void __launch_bounds__(kChunkThreads)
    kda_chunk_state_kernel(const KdaSeq* __restrict__ seqs, int H, const float* __restrict__ k,
                           float* __restrict__ o, const float* __restrict__ Wp, const float* __restrict__ Up,
                           const float* __restrict__ Qp, const float* __restrict__ Kp,
                           const float* __restrict__ Ap) {
  pdl::launch_dependents();
  using Cfg = StateCfg<D, L>;
  constexpr int NT = kChunkThreads, BV = Cfg::BV, LDW = Cfg::LDW, LDA = Cfg::LDA, RO = Cfg::RO, RS = Cfg::RS;
  constexpr int D4 = D / 4, BV4 = BV / 4, L4 = L / 4;
  static_assert(BV4 * (D / RS) == NT, "state tile mapping");
  static_assert(RS == 1 || RS == 2 || RS == 4, "state rows per thread");
  extern __shared__ float4 smem4[];
  float* Ws = reinterpret_cast<float*>(smem4);
  float* Qs = Ws + L * LDW;
  float* Ks = Qs + L * LDW;
  float* Us = Ks + L * D;
  float* As = Us + L * BV;
  float* eL = As + L * LDA;
  float* Ss = eL + D;
  float* Vn = Ss + D * BV;

  const KdaSeq sq = seqs[blockIdx.x];
  if (sq.n <= 0) return;
  const int h = blockIdx.y, v0 = blockIdx.z * BV, tid = threadIdx.x, C = H * D;
  const size_t hcol = static_cast<size_t>(h) * D;
  const int nch = n_chunks(sq.n, L);
  const int c4 = tid % BV4;       // value columns v0 + 4 c4 .. + 3 (both mappings)
  const int sg = tid / BV4;       // state rows sg*RS .. + RS-1
  const int rg = tid / BV4;       // output rows rg*RO .. + RO-1
  const bool out_active = rg * RO < L;

  float* Sg = sq.S + hcol * D;
  float s[RS][4];
#pragma unroll
  for (int r = 0; r < RS; ++r) {
    const int dk = sg * RS + r;
    const float4 x = *reinterpret_cast<const float4*>(Sg + static_cast<size_t>(dk) * D + v0 + 4 * c4);
    s[r][0] = x.x;
    s[r][1] = x.y;
    s[r][2] = x.z;
    s[r][3] = x.w;
    *reinterpret_cast<float4*>(Ss + dk * BV + 4 * c4) = x;
  }

  auto rows = [&](int c, int& Lc) {
    Lc = min(L, sq.n - c * L);
    return static_cast<size_t>(sq.offset + c * L);
  };
  auto load_wqu = [&](int c) {
    if (c < nch) {
      int Lc;
      const size_t r0 = rows(c, Lc);
      for (int e = tid; e < L * D4; e += NT) {
        const int i = e / D4, d4 = e % D4;
        const size_t at = (r0 + min(i, Lc - 1)) * C + hcol + 4 * d4;
        cp_async16(Ws + i * LDW + 4 * d4, Wp + at, i < Lc);
        cp_async16(Qs + i * LDW + 4 * d4, Qp + at, i < Lc);
      }
      for (int e = tid; e < L * BV4; e += NT) {
        const int i = e / BV4, j4 = e % BV4;
        cp_async16(Us + i * BV + 4 * j4, Up + (r0 + min(i, Lc - 1)) * C + hcol + v0 + 4 * j4, i < Lc);
      }
    }
    cp_async_commit();
  };
  auto load_a = [&](int c) {
    if (c < nch) {
      int Lc;
      const size_t r0 = rows(c, Lc);
      for (int e = tid; e < L * L4; e += NT) {
        const int i = e / L4, j4 = e % L4;
        cp_async16(As + i * LDA + 4 * j4, Ap + ((r0 + min(i, Lc - 1)) * H + h) * L + 4 * j4, i < Lc);
      }
    }
    cp_async_commit();
  };
  auto load_k = [&](int c) {
    if (c < nch) {
      int Lc;
      const size_t r0 = rows(c, Lc);
      for (int e = tid; e < L * D4; e += NT) {
        const int i = e / D4, d4 = e % D4;
        const size_t at = (r0 + min(i, Lc - 1)) * C + hcol + 4 * d4;
        cp_async16(Ks + i * D + 4 * d4, (i == Lc - 1 ? k : Kp) + at, i < Lc);  // last row: k itself
      }
      for (int e = tid; e < D4; e += NT) cp_async16(eL + 4 * e, Kp + (r0 + Lc - 1) * C + hcol + 4 * e, true);
    }
    cp_async_commit();
  };

  load_wqu(0);
  load_a(0);
  load_k(0);
  for (int c = 0; c < nch; ++c) {
    int Lc;
    const size_t r0 = rows(c, Lc);
    cp_async_wait<2>();  // this chunk's W, Q, U
    __syncthreads();     // ... every thread's copies, and Ss from the previous chunk

    // Step 1: V~ = U - W S and P = Q exp(G) S for rows rg*RO + r, columns 4 c4 .. + 3.
    float aw[RO][4], aq[RO][4];
#pragma unroll
    for (int r = 0; r < RO; ++r)
#pragma unroll
      for (int m = 0; m < 4; ++m) aw[r][m] = aq[r][m] = 0.f;
    if (out_active) {
#pragma unroll 2
      for (int k4 = 0; k4 < D4; ++k4) {
        float4 sv[4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) sv[kk] = *reinterpret_cast<const float4*>(Ss + (4 * k4 + kk) * BV + 4 * c4);
#pragma unroll
        for (int r = 0; r < RO; ++r) {
          const int i = rg * RO + r;
          const float4 w = *reinterpret_cast<const float4*>(Ws + i * LDW + 4 * k4);
          const float4 qe = *reinterpret_cast<const float4*>(Qs + i * LDW + 4 * k4);
          const float wa[4] = {w.x, w.y, w.z, w.w}, qa[4] = {qe.x, qe.y, qe.z, qe.w};
#pragma unroll
          for (int kk = 0; kk < 4; ++kk) {
            const float sa[4] = {sv[kk].x, sv[kk].y, sv[kk].z, sv[kk].w};
#pragma unroll
            for (int m = 0; m < 4; ++m) {
              aw[r][m] = fmaf(wa[kk], sa[m], aw[r][m]);
              aq[r][m] = fmaf(qa[kk], sa[m], aq[r][m]);
            }
          }
        }
      }
#pragma unroll
      for (int r = 0; r < RO; ++r) {
        const int i = rg * RO + r;
        const float4 u = *reinterpret_cast<const float4*>(Us + i * BV + 4 * c4);
        *reinterpret_cast<float4*>(Vn + i * BV + 4 * c4) =
            make_float4(u.x - aw[r][0], u.y - aw[r][1], u.z - aw[r][2], u.w - aw[r][3]);
      }
    }
    __syncthreads();  // Ws, Qs, Us consumed; Vn complete
    load_wqu(c + 1);
    cp_async_wait<2>();  // this chunk's A_qk
    __syncthreads();

    // Step 2: O = P + A_qk V~ (A_qk is zero above the diagonal: stop at the thread's last row).
    if (out_active) {
      const int jend = (rg * RO + RO - 1) / 4;
      for (int j4 = 0; j4 <= jend; ++j4) {
        float4 vv[4];
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) vv[jj] = *reinterpret_cast<const float4*>(Vn + (4 * j4 + jj) * BV + 4 * c4);
#pragma unroll
        for (int r = 0; r < RO; ++r) {
          const float4 a = *reinterpret_cast<const float4*>(As + (rg * RO + r) * LDA + 4 * j4);
          const float aa[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
          for (int jj = 0; jj < 4; ++jj) {
            aq[r][0] = fmaf(aa[jj], vv[jj].x, aq[r][0]);
            aq[r][1] = fmaf(aa[jj], vv[jj].y, aq[r][1]);
            aq[r][2] = fmaf(aa[jj], vv[jj].z, aq[r][2]);
            aq[r][3] = fmaf(aa[jj], vv[jj].w, aq[r][3]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < RO; ++r) {
        const int i = rg * RO + r;
        if (i < Lc)
          *reinterpret_cast<float4*>(o + (r0 + i) * C + hcol + v0 + 4 * c4) =
              make_float4(aq[r][0], aq[r][1], aq[r][2], aq[r][3]);
      }
    }
    __syncthreads();  // As consumed
    load_a(c + 1);
    cp_async_wait<2>();  // this chunk's decayed k and exp(G_last)
    __syncthreads();

    // Step 3: S = exp(G_last) S + sum_i (exp(G_last - G_i) k_i) V~_i on the thread's RS x 4 tile.
    {
#pragma unroll
      for (int r = 0; r < RS; ++r) {
        const float e = eL[sg * RS + r];
#pragma unroll
        for (int m = 0; m < 4; ++m) s[r][m] *= e;
      }
      for (int i = 0; i < Lc; ++i) {
        const float4 vv = *reinterpret_cast<const float4*>(Vn + i * BV + 4 * c4);
        float kd[RS];
        if constexpr (RS == 4) {
          const float4 x = *reinterpret_cast<const float4*>(Ks + i * D + 4 * sg);
          kd[0] = x.x;
          kd[1] = x.y;
          kd[2] = x.z;
          kd[3] = x.w;
        } else if constexpr (RS == 2) {
          const float2 x = *reinterpret_cast<const float2*>(Ks + i * D + 2 * sg);
          kd[0] = x.x;
          kd[1] = x.y;
        } else {
          kd[0] = Ks[i * D + sg];
        }
#pragma unroll
        for (int r = 0; r < RS; ++r) {
          s[r][0] = fmaf(kd[r], vv.x, s[r][0]);
          s[r][1] = fmaf(kd[r], vv.y, s[r][1]);
          s[r][2] = fmaf(kd[r], vv.z, s[r][2]);
          s[r][3] = fmaf(kd[r], vv.w, s[r][3]);
        }
      }
#pragma unroll
      for (int r = 0; r < RS; ++r)
        *reinterpret_cast<float4*>(Ss + (sg * RS + r) * BV + 4 * c4) = make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
    }
    __syncthreads();  // Ks, eL, Vn consumed; Ss complete
    load_k(c + 1);
  }
#pragma unroll
  for (int r = 0; r < RS; ++r)
    *reinterpret_cast<float4*>(Sg + static_cast<size_t>(sg * RS + r) * D + v0 + 4 * c4) =
        make_float4(s[r][0], s[r][1], s[r][2], s[r][3]);
}

// Workspace layout (256-byte aligned planes).
struct ChunkWs {
  float *W, *U, *Q, *K, *A;
  int* base;
};

inline size_t align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

inline size_t chunk_ws_layout(size_t N, int n_seqs, int H, int D, int L, char* p, ChunkWs* ws) {
  const size_t plane = align256(N * H * D * sizeof(float));
  const size_t aplane = align256(N * H * L * sizeof(float));
  const size_t tab = align256((static_cast<size_t>(n_seqs) + 1) * sizeof(int));
  if (ws) {
    ws->W = reinterpret_cast<float*>(p);
    ws->U = reinterpret_cast<float*>(p + plane);
    ws->Q = reinterpret_cast<float*>(p + 2 * plane);
    ws->K = reinterpret_cast<float*>(p + 3 * plane);
    ws->A = reinterpret_cast<float*>(p + 4 * plane);
    ws->base = reinterpret_cast<int*>(p + 4 * plane + aplane);
  }
  return 4 * plane + aplane + tab;
}

// ---------------------------------------------------------------------------------------------------
// The prefill's elementwise kernels: a warp per (row or token tile, head), V = D / 32 consecutive channels a lane
// (one float4 at D = 128), the per-head sums by shuffles. Session 58 measured the block-per-(row, head) forms they
// replace at 1.2-1.9 TB/s (1 x 4096 tokens x 96 heads: conv 0.585 ms, gates 0.262, output gate 0.475): blocks of
// 128 threads with two block reductions a token, a 64-bit modulo per decay.

// V consecutive floats (16-byte, 8-byte or 4-byte aligned as V is 4, 2, 1).
template <int V>
__device__ __forceinline__ void load_v(const float* __restrict__ p, float (&x)[V]) {
  if constexpr (V == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
  } else if constexpr (V == 2) {
    const float2 t = *reinterpret_cast<const float2*>(p);
    x[0] = t.x, x[1] = t.y;
  } else {
    x[0] = *p;
  }
}
template <int V>
__device__ __forceinline__ void store_v(float* p, const float (&x)[V]) {
  if constexpr (V == 4) *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  else if constexpr (V == 2) *reinterpret_cast<float2*>(p) = make_float2(x[0], x[1]);
  else *p = x[0];
}
// The conv's Out = uint16_t: bf16 bits rounded to nearest even (the tensor-core prefill's inputs: the same bits
// kda_chunked_tc makes of fp32 inputs, at half the bytes written and read).
template <int V>
__device__ __forceinline__ void store_v(uint16_t* p, const float (&x)[V]) {
  if constexpr (V == 4) {
    *reinterpret_cast<uint2*>(p) = make_uint2(f32_to_bf16_bits(x[0]) | (static_cast<uint32_t>(f32_to_bf16_bits(x[1])) << 16),
                                              f32_to_bf16_bits(x[2]) | (static_cast<uint32_t>(f32_to_bf16_bits(x[3])) << 16));
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) p[i] = f32_to_bf16_bits(x[i]);
  }
}

constexpr int kConvWarpTile = 16;  // tokens a warp walks (>= W - 1: only tile 0 reads the old conv state)
constexpr int kEwWarps = 4;        // warps (heads) a block of the conv / output-gate kernels

// kda_conv_l2norm: grid (token tiles, ceil(3 H / 4), n_seqs), 4 warps; warp item = 3 head + tensor (q, k or v) of
// that head, lane = channels [lane V, lane V + V): ~60 registers (a warp per head for all three, ~130 registers and 3
// blocks an SM, measured 3-11% slower in call s58-4). The warp walks its tile's tokens with the last W - 1 inputs of
// each channel in registers (one read of every input row, W - 1 more at the tile's start; the next token's row loaded
// before the current one is computed); the L2 norm is a warp sum. Tile 0 alone reads the old conv state and writes
// the new one (the last W - 1 inputs of [old state, x]) -- written first, from registers and x, which nothing in this
// call writes.
template <int D, int W, class Out>
__global__ void __launch_bounds__(32 * kEwWarps)
    kda_conv_l2norm_kernel(const KdaSeq* __restrict__ seqs, int H, const float* __restrict__ xq,
                           const float* __restrict__ xk, const float* __restrict__ xv,
                           const float* __restrict__ wq, const float* __restrict__ wk,
                           const float* __restrict__ wv, Out* __restrict__ q, Out* __restrict__ k,
                           Out* __restrict__ v) {
  pdl::launch_dependents();
  constexpr int P = W - 1, PS = P > 0 ? P : 1, V = D / 32;
  const KdaSeq sq = seqs[blockIdx.z];
  const int item = blockIdx.y * kEwWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = item / 3, tensor = item % 3;  // tensor 0: q (scaled L2 norm), 1: k (L2 norm), 2: v (as is)
  const int t_begin = blockIdx.x * kConvWarpTile;
  if (h >= H || t_begin >= sq.n) return;  // no block-wide barrier below
  const int t_end = min(sq.n, t_begin + kConvWarpTile);
  const int C = H * D, c0 = h * D + lane * V;
  // the tensor's pointers by selects (an array indexed by the run-time tensor would live in local memory)
  auto sel = [tensor](auto a, auto b, auto c) { return tensor == 0 ? a : tensor == 1 ? b : c; };
  const float* x = sel(xq, xk, xv);
  const float* wt = sel(wq, wk, wv);
  float* cs = sel(sq.conv_q, sq.conv_k, sq.conv_v);
  Out* out = sel(q, k, v);
  float w[V][W], win[V][PS];  // taps; the last P inputs, oldest first
#pragma unroll
  for (int e = 0; e < V; ++e)
#pragma unroll
    for (int j = 0; j < W; ++j) w[e][j] = wt[static_cast<size_t>(c0 + e) * W + j];
#pragma unroll
  for (int j = 0; j < P; ++j) {  // inputs t_begin - P + j: the old state where that is before the sequence
    const int tau = t_begin - P + j;
    float r[V];
    if (tau < 0) {
#pragma unroll
      for (int e = 0; e < V; ++e) r[e] = cs[static_cast<size_t>(c0 + e) * P + P + tau];
    } else {
      load_v<V>(x + static_cast<size_t>(sq.offset + tau) * C + c0, r);
    }
#pragma unroll
    for (int e = 0; e < V; ++e) win[e][j < P ? j : 0] = r[e];
  }
  if (blockIdx.x == 0) {  // the new state: inputs n - P .. n - 1 of [old state, x] (old values are in win)
#pragma unroll
    for (int j = 0; j < P; ++j) {
      const int tau = sq.n - P + j;
      float r[V];
      if (tau < 0) {
#pragma unroll
        for (int e = 0; e < V; ++e) r[e] = pick(win[e], P + tau);
      } else {
        load_v<V>(x + static_cast<size_t>(sq.offset + tau) * C + c0, r);
      }
#pragma unroll
      for (int e = 0; e < V; ++e) cs[static_cast<size_t>(c0 + e) * P + j] = r[e];
    }
  }
  const float scale = tensor == 0 ? 1.0f / sqrtf(static_cast<float>(D)) : 1.0f;
  float cur[V];  // token t's inputs; token t + 1's are loaded before t is computed (two rows in flight a warp)
  load_v<V>(x + static_cast<size_t>(sq.offset + t_begin) * C + c0, cur);
  for (int t = t_begin; t < t_end; ++t) {
    const size_t at = static_cast<size_t>(sq.offset + t) * C + c0;
    float nxt[V];
    if (t + 1 < t_end) load_v<V>(x + at + C, nxt);
    float y[V], ss = 0.f;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float acc = 0.f;  // taps in cpu::short_conv_silu's order: oldest input first
#pragma unroll
      for (int j = 0; j < P; ++j) acc += w[e][j] * win[e][j];
      acc += w[e][P] * cur[e];
      y[e] = silu(acc);
      ss += y[e] * y[e];
#pragma unroll
      for (int j = 0; j + 1 < P; ++j) win[e][j] = win[e][j + 1];
      if constexpr (P > 0) win[e][P - 1] = cur[e];
    }
    if (tensor < 2) {  // warp-uniform: the whole warp is one tensor
      const float inv = scale / sqrtf(warp_sum(ss) + 1e-6f);
#pragma unroll
      for (int e = 0; e < V; ++e) y[e] *= inv;
    }
    store_v<V>(out + at, y);
#pragma unroll
    for (int e = 0; e < V; ++e) cur[e] = nxt[e];
  }
}

// ---------------------------------------------------------------------------------------------------
// kda_gates: a block per row (grid-stride over rows), a thread per 4 consecutive decays (C is a multiple of 32), then
// the row's H betas.

__global__ void kda_gates_kernel(int N, int H, int D, float* __restrict__ g, const float* __restrict__ dt_bias,
                                 const float* __restrict__ A_log, bool bounded, float lower_bound,
                                 float* __restrict__ beta, uint16_t* __restrict__ g_bf16) {
  pdl::launch_dependents();
  const int C = H * D;
  for (int r = blockIdx.x; r < N; r += gridDim.x) {
    float* gr = g + static_cast<size_t>(r) * C;
    for (int c = 4 * threadIdx.x; c < C; c += 4 * blockDim.x) {
      float x[4], b[4];
      load_v<4>(gr + c, x);
#pragma unroll
      for (int e = 0; e < 4; ++e) b[e] = dt_bias[c + e];  // a weight slice: no alignment promised
      const float a = expf(A_log[c / D]);  // D is a multiple of 4: the 4 decays share a head
#pragma unroll
      for (int e = 0; e < 4; ++e) x[e] = gate_value(x[e] + b[e], a, bounded, lower_bound);
      store_v<4>(gr + c, x);
      if (g_bf16) store_v<4>(g_bf16 + static_cast<size_t>(r) * C + c, x);
    }
    for (int hh = threadIdx.x; hh < H; hh += blockDim.x) {
      float* bp = beta + static_cast<size_t>(r) * H + hh;
      *bp = sigmoid(*bp);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// kda_output_gate: a warp per (row, head), 4 of them a block.

template <int D>
__global__ void __launch_bounds__(32 * kEwWarps)
    kda_output_gate_kernel(long long items, float* __restrict__ o, const float* __restrict__ norm_w, float eps,
                           const float* __restrict__ gate) {
  pdl::launch_dependents();
  constexpr int V = D / 32;
  const long long item = static_cast<long long>(blockIdx.x) * kEwWarps + threadIdx.x / 32;  // row * H + head
  if (item >= items) return;
  const int lane = threadIdx.x % 32;
  const size_t at = static_cast<size_t>(item) * D + lane * V;
  float x[V], gt[V], nw[V];
  load_v<V>(o + at, x);
  load_v<V>(gate + at, gt);
#pragma unroll
  for (int e = 0; e < V; ++e) nw[e] = norm_w[lane * V + e];  // a weight: no alignment promised
  float ss = 0.f;
#pragma unroll
  for (int e = 0; e < V; ++e) ss += x[e] * x[e];
  const float inv = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(D) + eps);
#pragma unroll
  for (int e = 0; e < V; ++e) x[e] = x[e] * inv * nw[e] * sigmoid(gt[e]);
  store_v<V>(o + at, x);
}

// ---------------------------------------------------------------------------------------------------
// kda_decode_fused / kda_verify_fused: grid (n_seqs, H, D/32), clusters of the D/32 blocks of one (seq, head),
// D threads a block. Thread tid is channel h*D + tid for the conv, norms and gates; for the recurrence and the
// output norm thread tid is part tid % SPLIT of value column 32 z + tid / SPLIT (z = blockIdx.z). Both run
// fused_token per token, so a verification's n tokens equal n decode steps.
template <int D>
constexpr int kFusedBlocks = D / 32;  // blocks (and cluster size) per (seq, head): 32 value columns each

// One (sequence, head)'s registers across its tokens: the conv taps and tails of channel tid, the state
// column part.
template <int D, int W>
struct FusedRegs {
  static constexpr int P = W - 1, PS = P > 0 ? P : 1;
  float w[3][W], tail[3][PS];  // q, k, v
  float s[D / kSplit<D>];

  __device__ __forceinline__ void load_conv(const KdaFusedIn& in, const KdaSeq& sq, int c) {
    const float* taps[3] = {in.wq, in.wk, in.wv};
    const float* tails[3] = {sq.conv_q, sq.conv_k, sq.conv_v};
#pragma unroll
    for (int m = 0; m < 3; ++m) {
#pragma unroll
      for (int j = 0; j < W; ++j) w[m][j] = taps[m][static_cast<size_t>(c) * W + j];
#pragma unroll
      for (int j = 0; j < PS; ++j) tail[m][j] = j < P ? tails[m][static_cast<size_t>(c) * P + j] : 0.f;
    }
  }
  // Every block of the cluster holds the same new tails; block z writes channels [32 z, 32 z + 32) of them.
  // Its peers have all read the old tails by then: this follows the token's cluster barrier (fused_token).
  __device__ __forceinline__ void store_conv(const KdaSeq& dst, int c) const {
    if (static_cast<int>(threadIdx.x) / 32 != static_cast<int>(blockIdx.z)) return;
    float* tails[3] = {dst.conv_q, dst.conv_k, dst.conv_v};
#pragma unroll
    for (int m = 0; m < 3; ++m)
#pragma unroll
      for (int j = 0; j < P; ++j) tails[m][static_cast<size_t>(c) * P + j] = tail[m][j];
  }
};

// The sum of the cluster's Z blocks' values (v of thread 0 in each), in block-rank order, so every block
// gets the same bits. `slot` is this block's shared word for this token; the caller alternates two, and the
// barrier of the next token keeps a peer from overwriting one still being read. Cluster barriers order the
// accesses around them (arrive releases, wait acquires).
template <int Z>
__device__ __forceinline__ float cluster_sum(float v, float* slot) {
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) *slot = v;
  cl.sync();
  float s = 0.f;
#pragma unroll
  for (int r = 0; r < Z; ++r) s += *cl.map_shared_rank(slot, r);
  return s;
}

// One token (row `row`) of kda_decode_fused for head h: conv + SiLU over the tails (which then drop their
// oldest input and take this one), L2 norms, gates, one delta-rule step on this block's columns (rounded as
// a StateT cache would hold it), and the gated output norm (over the head's D columns: `slot`, see
// cluster_sum) into o. Ends after a cluster barrier: the shared operands are free and every peer has read
// its old conv tails.
template <int D, int W, class StateT>
__device__ __forceinline__ void fused_token(const KdaFusedIn& in, int H, int h, size_t row, FusedRegs<D, W>& r,
                                            float2* red, float* ks, float* qs, float* es, float* vs, float* slot,
                                            float* o) {
  constexpr int SPLIT = kSplit<D>, Z = kFusedBlocks<D>, P = W - 1;
  const int tid = threadIdx.x, C = H * D;
  float y[3];
  {
    const int c = h * D + tid;
    const float* xs[3] = {in.xq, in.xk, in.xv};
#pragma unroll
    for (int m = 0; m < 3; ++m) {
      y[m] = conv_silu_at<W>(xs[m], C, c, static_cast<int>(row), 0, r.w[m], r.tail[m]);
      if constexpr (P > 0) {
#pragma unroll
        for (int j = 0; j + 1 < P; ++j) r.tail[m][j] = r.tail[m][j + 1];
        r.tail[m][P - 1] = xs[m][row * C + c];
      }
    }
  }
  const float2 ss = block_sum2<D>(y[0] * y[0], y[1] * y[1], red);
  {
    const int c = h * D + tid;
    const size_t at = row * C + c;
    qs[tid] = y[0] * ((1.0f / sqrtf(static_cast<float>(D))) / sqrtf(ss.x + 1e-6f));
    ks[tid] = y[1] * (1.0f / sqrtf(ss.y + 1e-6f));
    es[tid] = expf(gate_value(in.graw[at] + in.dt_bias[c], expf(in.A_log[h]), in.bounded, in.lower_bound));
    vs[tid] = y[2];
  }
  const float bt = sigmoid(in.braw[row * H + h]);
  __syncthreads();
  const int dv = static_cast<int>(blockIdx.z) * 32 + tid / SPLIT, p = tid % SPLIT;
  const float ot = delta_step<D, SPLIT>(r.s, ks, qs, es, vs[dv], bt, p);
  round_state<StateT>(r.s);
  float on = block_sum2<D>(p == 0 ? ot * ot : 0.f, 0.f, red).x;  // this block's 32 columns; frees ks .. vs
  if constexpr (Z > 1) on = cluster_sum<Z>(on, slot);
  const float inv = 1.0f / sqrtf(on / static_cast<float>(D) + in.eps);
  const size_t at = row * C + static_cast<size_t>(h) * D + dv;
  if (p == 0) o[at] = ot * inv * in.norm_w[dv] * sigmoid(in.gate[at]);
}

// Before a block leaves: no peer may still read its shared partial sums.
template <int Z>
__device__ __forceinline__ void cluster_done() {
  if constexpr (Z > 1) cooperative_groups::this_cluster().sync();
}

// pdl-launched (session 46): the sequence table, the conv taps and tails and the state column are loaded before the wait
// -- none is written by the kernel before it (the projections): the table is the step's upload, the taps weights, the
// tails and the state this kernel's own writes of an earlier step (complete: pdl.cuh's transitivity) -- so the ~2 MB a
// layer of state reads overlap the projections' tail instead of starting after it.
template <int D, int W, class StateT>
__global__ void __launch_bounds__(D)
    kda_decode_fused_kernel(const KdaSeq* __restrict__ seqs, int H, const KdaFusedIn in, float* __restrict__ o) {
  constexpr int SPLIT = kSplit<D>;
  __shared__ float2 red[D / 32];
  __shared__ __align__(16) float ks[D], qs[D], es[D], vs[D];
  __shared__ float slot[1];
  const KdaSeq sq = seqs[blockIdx.x];
  if (sq.n < 1) return;  // contract: n == 1; a sequence without a token has nothing to do (its whole cluster)
  const int h = blockIdx.y, tid = threadIdx.x, dv = static_cast<int>(blockIdx.z) * 32 + tid / SPLIT, p = tid % SPLIT;
  FusedRegs<D, W> r;
  r.load_conv(in, sq, h * D + tid);
  StateT* S = reinterpret_cast<StateT*>(sq.S) + static_cast<size_t>(h) * D * D;
  load_column<D, SPLIT>(r.s, S, dv, p);
  pdl::begin();
  fused_token<D, W, StateT>(in, H, h, static_cast<size_t>(sq.offset), r, red, ks, qs, es, vs, slot, o);
  store_column<D, SPLIT>(r.s, S, dv, p);
  r.store_conv(sq, h * D + tid);
  cluster_done<kFusedBlocks<D>>();
}

// The sequence's n tokens in order; after the first `after + j` of them (j < n_snap) the column and the
// tails also go to snapshot view snaps[first + j].
template <int D, int W, class StateT>
__global__ void __launch_bounds__(D)
    kda_verify_fused_kernel(const KdaSnapSeq* __restrict__ seqs, const KdaSeq* __restrict__ snaps, int H,
                            const KdaFusedIn in, float* __restrict__ o) {
  pdl::launch_dependents();
  constexpr int SPLIT = kSplit<D>;
  __shared__ float2 red[D / 32];
  __shared__ __align__(16) float ks[D], qs[D], es[D], vs[D];
  __shared__ float slot[2];  // alternating per token (cluster_sum)
  const KdaSnapSeq ss = seqs[blockIdx.x];
  const KdaSeq& sq = ss.seq;
  if (sq.n < 1) return;
  const int h = blockIdx.y, tid = threadIdx.x, dv = static_cast<int>(blockIdx.z) * 32 + tid / SPLIT, p = tid % SPLIT;
  FusedRegs<D, W> r;
  r.load_conv(in, sq, h * D + tid);
  const size_t head = static_cast<size_t>(h) * D * D;
  load_column<D, SPLIT>(r.s, reinterpret_cast<const StateT*>(sq.S) + head, dv, p);
  for (int t = 0; t < sq.n; ++t) {
    fused_token<D, W, StateT>(in, H, h, static_cast<size_t>(sq.offset + t), r, red, ks, qs, es, vs, slot + (t & 1), o);
    const int j = t + 1 - ss.after;
    if (j >= 0 && j < ss.n_snap) {
      const KdaSeq snap = snaps[ss.first + j];
      store_column<D, SPLIT>(r.s, reinterpret_cast<StateT*>(snap.S) + head, dv, p);
      r.store_conv(snap, h * D + tid);
    }
  }
  store_column<D, SPLIT>(r.s, reinterpret_cast<StateT*>(sq.S) + head, dv, p);
  r.store_conv(sq, h * D + tid);
  cluster_done<kFusedBlocks<D>>();
}

// ---------------------------------------------------------------------------------------------------
// Host-side dispatch.

bool supported_d(int D) { return D == 32 || D == 64 || D == 128; }

template <int D, class StateT>
cudaError_t launch_recurrent(const KdaSeq* seqs, int n_seqs, int H, const float* q, const float* k,
                             const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  kda_recurrent_kernel<D, StateT><<<dim3(n_seqs, H, D * kSplit<D> / 32), 32, 0, stream>>>(seqs, H, q, k, v, g, beta, o);
  return cudaGetLastError();
}

template <int D, int L>
cudaError_t launch_chunked_parallel_l(const KdaSeq* seqs, int n_seqs, int N, int H, const float* q, const float* k,
                                      const float* v, const float* g, const float* beta, float* o, const ChunkWs& ws,
                                      cudaStream_t stream) {
  constexpr size_t intra = intra_smem_bytes(D, L), state = StateCfg<D, L>::bytes;
  cudaError_t e = cudaFuncSetAttribute(kda_chunk_intra_kernel<D, L>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(intra));
  if (e != cudaSuccess) return e;
  e = cudaFuncSetAttribute(kda_chunk_state_kernel<D, L>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(state));
  if (e != cudaSuccess) return e;
  kda_chunk_table_kernel<<<1, 1024, 0, stream>>>(seqs, n_seqs, L, ws.base);
  const long long bound = (static_cast<long long>(N) + L - 1) / L + n_seqs;  // >= the total chunk count
  kda_chunk_intra_kernel<D, L><<<dim3(static_cast<unsigned>(bound), H), kChunkThreads, intra, stream>>>(
      seqs, n_seqs, ws.base, H, q, k, v, g, beta, ws.W, ws.U, ws.Q, ws.K, ws.A);
  kda_chunk_state_kernel<D, L><<<dim3(n_seqs, H, D / kStateBV), kChunkThreads, state, stream>>>(
      seqs, H, k, o, ws.W, ws.U, ws.Q, ws.K, ws.A);
  return cudaGetLastError();
}

template <int D>
cudaError_t launch_chunked_parallel(const KdaSeq* seqs, int n_seqs, int N, int H, int L, const float* q,
                                    const float* k, const float* v, const float* g, const float* beta, float* o,
                                    const ChunkWs& ws, cudaStream_t stream) {
  switch (L) {
    case 16: return launch_chunked_parallel_l<D, 16>(seqs, n_seqs, N, H, q, k, v, g, beta, o, ws, stream);
    case 32: return launch_chunked_parallel_l<D, 32>(seqs, n_seqs, N, H, q, k, v, g, beta, o, ws, stream);
    default: return launch_chunked_parallel_l<D, 64>(seqs, n_seqs, N, H, q, k, v, g, beta, o, ws, stream);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int D, int W, class Out>
cudaError_t launch_conv(const KdaSeq* seqs, int n_seqs, int N, int H, const float* xq, const float* xk,
                        const float* xv, const float* wq, const float* wk, const float* wv, Out* q, Out* k,
                        Out* v, cudaStream_t stream) {
  const unsigned tiles = static_cast<unsigned>((N + kConvWarpTile - 1) / kConvWarpTile);
  const dim3 grid(tiles, static_cast<unsigned>((3 * H + kEwWarps - 1) / kEwWarps), n_seqs);
  kda_conv_l2norm_kernel<D, W, Out><<<grid, 32 * kEwWarps, 0, stream>>>(seqs, H, xq, xk, xv, wq, wk, wv, q, k, v);
  return cudaGetLastError();
}

template <int D, class Out>
cudaError_t launch_conv_d(int W, const KdaSeq* seqs, int n_seqs, int N, int H, const float* xq, const float* xk,
                          const float* xv, const float* wq, const float* wk, const float* wv, Out* q, Out* k,
                          Out* v, cudaStream_t stream) {
  switch (W) {
    case 1: return launch_conv<D, 1>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 2: return launch_conv<D, 2>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 3: return launch_conv<D, 3>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 4: return launch_conv<D, 4>(seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <class Out>
cudaError_t conv_l2norm_typed(const KdaSeq* seqs, int n_seqs, int N, int H, int D, int W, const float* xq,
                              const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                              Out* q, Out* k, Out* v, cudaStream_t stream) {
  static_assert(kConvWarpTile >= kMaxConvW - 1, "tile 0 must hold every token that reads the old conv state");
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0 || n_seqs > 65535 || N < 0 || W < 1 || W > kMaxConvW)
    return cudaErrorInvalidValue;
  if (n_seqs == 0 || N == 0) return cudaSuccess;
  switch (D) {
    case 32: return launch_conv_d<32>(W, seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    case 64: return launch_conv_d<64>(W, seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
    default: return launch_conv_d<128>(W, seqs, n_seqs, N, H, xq, xk, xv, wq, wk, wv, q, k, v, stream);
  }
}

template <int D>
cudaError_t launch_output_gate(int N, int H, float* o, const float* norm_w, float eps, const float* gate,
                               cudaStream_t stream) {
  const long long items = static_cast<long long>(N) * H, blocks = (items + kEwWarps - 1) / kEwWarps;
  if (blocks > 0x7fffffffLL) return cudaErrorInvalidValue;
  kda_output_gate_kernel<D><<<static_cast<unsigned>(blocks), 32 * kEwWarps, 0, stream>>>(items, o, norm_w, eps, gate);
  return cudaGetLastError();
}

// One launch of the fused decode kernel (vseqs null) or the verification kernel over (D, W, StateT).
template <int D, int W, class StateT>
cudaError_t launch_fused(const KdaSeq* seqs, const KdaSnapSeq* vseqs, const KdaSeq* snaps, int n_seqs, int H,
                         const KdaFusedIn& in, float* o, cudaStream_t stream) {
  constexpr unsigned Z = kFusedBlocks<D>;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(n_seqs), static_cast<unsigned>(H), Z);
  cfg.blockDim = dim3(D);
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = 1;
  attrs[0].val.clusterDim.y = 1;
  attrs[0].val.clusterDim.z = Z;  // the blocks of one (seq, head)
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // the decode kernel's state loads before its wait
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = !vseqs && pdl::enabled() ? 2 : 1;
  if (vseqs) return cudaLaunchKernelEx(&cfg, kda_verify_fused_kernel<D, W, StateT>, vseqs, snaps, H, in, o);
  return cudaLaunchKernelEx(&cfg, kda_decode_fused_kernel<D, W, StateT>, seqs, H, in, o);
}

template <int D, class StateT>
cudaError_t launch_fused_w(int W, const KdaSeq* seqs, const KdaSnapSeq* vseqs, const KdaSeq* snaps, int n_seqs, int H,
                           const KdaFusedIn& in, float* o, cudaStream_t stream) {
  switch (W) {
    case 1: return launch_fused<D, 1, StateT>(seqs, vseqs, snaps, n_seqs, H, in, o, stream);
    case 2: return launch_fused<D, 2, StateT>(seqs, vseqs, snaps, n_seqs, H, in, o, stream);
    case 3: return launch_fused<D, 3, StateT>(seqs, vseqs, snaps, n_seqs, H, in, o, stream);
    case 4: return launch_fused<D, 4, StateT>(seqs, vseqs, snaps, n_seqs, H, in, o, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <class StateT>
cudaError_t launch_fused_dw(int D, int W, const KdaSeq* seqs, const KdaSnapSeq* vseqs, const KdaSeq* snaps, int n_seqs,
                            int H, const KdaFusedIn& in, float* o, cudaStream_t stream) {
  switch (D) {
    case 32: return launch_fused_w<32, StateT>(W, seqs, vseqs, snaps, n_seqs, H, in, o, stream);
    case 64: return launch_fused_w<64, StateT>(W, seqs, vseqs, snaps, n_seqs, H, in, o, stream);
    default: return launch_fused_w<128, StateT>(W, seqs, vseqs, snaps, n_seqs, H, in, o, stream);
  }
}

cudaError_t launch_fused_any(int D, int W, const KdaSeq* seqs, const KdaSnapSeq* vseqs, const KdaSeq* snaps, int n_seqs,
                             int H, const KdaFusedIn& in, float* o, CacheDType state_dtype, cudaStream_t stream) {
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0 || W < 1 || W > kMaxConvW) return cudaErrorInvalidValue;
  if (state_dtype != CacheDType::F32 && state_dtype != CacheDType::BF16) return cudaErrorInvalidValue;
  if (n_seqs == 0) return cudaSuccess;
  if (state_dtype == CacheDType::BF16)
    return launch_fused_dw<uint16_t>(D, W, seqs, vseqs, snaps, n_seqs, H, in, o, stream);
  return launch_fused_dw<float>(D, W, seqs, vseqs, snaps, n_seqs, H, in, o, stream);
}

}  // namespace

cudaError_t kda_conv_l2norm(const KdaSeq* seqs, int n_seqs, int N, int H, int D, int W, const float* xq,
                            const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                            float* q, float* k, float* v, cudaStream_t stream) {
  return conv_l2norm_typed(seqs, n_seqs, N, H, D, W, xq, xk, xv, wq, wk, wv, q, k, v, stream);
}

cudaError_t kda_conv_l2norm_bf16(const KdaSeq* seqs, int n_seqs, int N, int H, int D, int W, const float* xq,
                                 const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                                 uint16_t* q, uint16_t* k, uint16_t* v, cudaStream_t stream) {
  return conv_l2norm_typed(seqs, n_seqs, N, H, D, W, xq, xk, xv, wq, wk, wv, q, k, v, stream);
}

cudaError_t kda_gates(int N, int H, int D, float* g, const float* dt_bias, const float* A_log, bool bounded,
                      float lower_bound, float* beta, cudaStream_t stream, uint16_t* g_bf16) {
  if (N < 0 || H <= 0 || D <= 0 || D % 4 != 0 || static_cast<long long>(H) * D > INT_MAX) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  const int C = H * D;
  const int threads = std::min(256, std::max(32, (C / 4 + 31) / 32 * 32));
  kda_gates_kernel<<<static_cast<unsigned>(std::min(N, 65535)), threads, 0, stream>>>(N, H, D, g, dt_bias, A_log, bounded,
                                                                                       lower_bound, beta, g_bf16);
  return cudaGetLastError();
}

namespace {

template <class StateT>
cudaError_t recurrent_state_t(const KdaSeq* seqs, int n_seqs, int H, int D, const float* q, const float* k,
                              const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  switch (D) {
    case 32: return launch_recurrent<32, StateT>(seqs, n_seqs, H, q, k, v, g, beta, o, stream);
    case 64: return launch_recurrent<64, StateT>(seqs, n_seqs, H, q, k, v, g, beta, o, stream);
    default: return launch_recurrent<128, StateT>(seqs, n_seqs, H, q, k, v, g, beta, o, stream);
  }
}

}  // namespace

cudaError_t kda_recurrent_typed(const KdaSeq* seqs, int n_seqs, int H, int D, const float* q, const float* k,
                                const float* v, const float* g, const float* beta, float* o, CacheDType state_dtype,
                                cudaStream_t stream) {
  if (!supported_d(D) || H <= 0 || H > 65535 || n_seqs < 0) return cudaErrorInvalidValue;
  if (state_dtype != CacheDType::F32 && state_dtype != CacheDType::BF16) return cudaErrorInvalidValue;
  if (n_seqs == 0) return cudaSuccess;
  if (state_dtype == CacheDType::BF16) return recurrent_state_t<uint16_t>(seqs, n_seqs, H, D, q, k, v, g, beta, o, stream);
  return recurrent_state_t<float>(seqs, n_seqs, H, D, q, k, v, g, beta, o, stream);
}

cudaError_t kda_recurrent(const KdaSeq* seqs, int n_seqs, int H, int D, const float* q, const float* k,
                          const float* v, const float* g, const float* beta, float* o, cudaStream_t stream) {
  return kda_recurrent_typed(seqs, n_seqs, H, D, q, k, v, g, beta, o, CacheDType::F32, stream);
}

namespace {

bool chunk_args_ok(int n_seqs, int H, int D, int chunk) {
  return supported_d(D) && H > 0 && H <= 65535 && n_seqs >= 0 && n_seqs <= 65535 &&
         (chunk == 16 || chunk == 32 || chunk == 64);
}

}  // namespace

size_t kda_chunked_workspace_bytes(int n_total_tokens, int n_seqs, int H, int D, int chunk) {
  if (n_total_tokens < 0 || n_seqs < 0 || H <= 0 || D <= 0 || chunk <= 0) return 0;
  return chunk_ws_layout(static_cast<size_t>(n_total_tokens), n_seqs, H, D, chunk, nullptr, nullptr);
}

cudaError_t kda_chunked(const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H, int D, int chunk, const float* q,
                        const float* k, const float* v, const float* g, const float* beta, float* o, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream) {
  if (!chunk_args_ok(n_seqs, H, D, chunk) || n_total_tokens < 0) return cudaErrorInvalidValue;
  if (n_seqs == 0 || n_total_tokens == 0) return cudaSuccess;
  ChunkWs ws{};
  const size_t need = chunk_ws_layout(static_cast<size_t>(n_total_tokens), n_seqs, H, D, chunk,
                                      static_cast<char*>(workspace), &ws);
  if (workspace == nullptr || workspace_bytes < need || !aligned16(workspace)) return cudaErrorInvalidValue;
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(g) || !aligned16(o))
    return cudaErrorInvalidValue;  // float4 / cp.async need 16-byte rows
  switch (D) {
    case 32: return launch_chunked_parallel<32>(seqs, n_seqs, n_total_tokens, H, chunk, q, k, v, g, beta, o, ws, stream);
    case 64: return launch_chunked_parallel<64>(seqs, n_seqs, n_total_tokens, H, chunk, q, k, v, g, beta, o, ws, stream);
    default: return launch_chunked_parallel<128>(seqs, n_seqs, n_total_tokens, H, chunk, q, k, v, g, beta, o, ws, stream);
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

cudaError_t kda_decode_fused_typed(const KdaSeq* seqs, int n_seqs, int H, int D, int W, const float* xq,
                                   const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                                   const float* graw, const float* dt_bias, const float* A_log, bool bounded,
                                   float lower_bound, const float* braw, const float* gate, const float* norm_w,
                                   float eps, float* o, CacheDType state_dtype, cudaStream_t stream) {
  const KdaFusedIn in{xq, xk, xv, wq, wk, wv, graw, dt_bias, A_log, bounded, lower_bound, braw, gate, norm_w, eps};
  return launch_fused_any(D, W, seqs, nullptr, nullptr, n_seqs, H, in, o, state_dtype, stream);
}

cudaError_t kda_verify_fused(const KdaSnapSeq* seqs, int n_seqs, const KdaSeq* snaps, int H, int D, int W,
                             const KdaFusedIn& in, float* o, CacheDType state_dtype, cudaStream_t stream) {
  if (!seqs && n_seqs > 0) return cudaErrorInvalidValue;
  return launch_fused_any(D, W, nullptr, seqs, snaps, n_seqs, H, in, o, state_dtype, stream);
}

cudaError_t kda_decode_fused(const KdaSeq* seqs, int n_seqs, int H, int D, int W, const float* xq, const float* xk,
                             const float* xv, const float* wq, const float* wk, const float* wv, const float* graw,
                             const float* dt_bias, const float* A_log, bool bounded, float lower_bound,
                             const float* braw, const float* gate, const float* norm_w, float eps, float* o,
                             cudaStream_t stream) {
  return kda_decode_fused_typed(seqs, n_seqs, H, D, W, xq, xk, xv, wq, wk, wv, graw, dt_bias, A_log, bounded,
                                lower_bound, braw, gate, norm_w, eps, o, CacheDType::F32, stream);
}

}  // namespace k3::cuda
