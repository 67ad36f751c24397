// Chunked KDA prefill on tensor cores (see kda_chunked_tc.h). The algorithm is kda_chunked's (WY / UT
// transform of the gated delta rule per chunk of L tokens, FLA chunk_kda's structure); what changes is
// where the arithmetic runs:
//
// 1. kda_tc_intra_kernel (v1), one block of L/16 warps per (chunk, head), warp w = sub-chunk rows [16w, 16w+16)
//    (chunk 32 runs kda_tc_intra2_kernel by default: the same outputs from 8 warps, see its comment; and
//    kda_tc_intra3_kernel, KdaTcTuning::intra = 4: v2 made persistent, the next work item's loads in flight
//    during the current one's compute, bit-identical outputs):
//    - G = cumulative log decay (fp32, shared), q / k / v staged as bf16.
//    - A_kk and A_qk on tensor cores: exp(G_i - G_j) is split around the first row r of the row's
//      sub-chunk, (k_i exp(G_i - G_r)) . (k_j exp(G_r - G_j)). For j in an earlier sub-chunk both
//      factors are <= 1; inside the sub-chunk the right factor is at most exp(15 * max|g|), in range
//      for g >= -5.5 (the header's precondition; the exponent is clamped at 88 so nothing overflows).
//    - T = (I + diag(beta) A_kk)^-1 diag(beta) by forward substitution on the small L x L matrix (fp32,
//      one column per thread), then W = T (exp(G) k) and U = T v on tensor cores (rows of T past the
//      warp's sub-chunk are zero: only the k-steps kk <= w run).
//    - writes W, U, Q exp(G), exp(G_last - G) k (bf16 planes [N][C]), A_qk (bf16 [N][H][L]) and
//      exp(G_last) (fp32, per chunk and head).
// 2. kda_tc_state_kernel, one block of 4 warps (8 at BV = 128) per (sequence, head, BV value columns), walking
//    the chunks:
//      V~ = U - W S;  O = (Q exp(G)) S + A_qk V~;  S = exp(G_last) S + (exp(G_last - G) k)^T V~
//    S lives in fp32 mma accumulators (warp w owns key rows [32w, 32w+32), [16w, 16w+16) with 8 warps); a
//    bf16 copy in shared memory is the B operand of the next chunk's W S and Q S. The output is fused (no
//    per-chunk state is stored unless asked for). Operands stream in with cp.async: with one buffer into
//    each piece as soon as the step that reads it is done (two commit groups per chunk), with a ring of
//    NBUF buffers NBUF - 1 chunks ahead.
//    KdaTcTuning::overlap (run_tc_overlap): the state kernel v2 runs concurrently with intra v3, per (chunk, head)
//    ready flags in the workspace.
//    At chunk 32 the state step runs kda_tc_state2_kernel by default (kda_tc_state2.cu; KdaTcTuning::state /
//    K3_KDA_TC_STATE=v1 for the kernel above): warps split the value columns and hold S^T, so a chunk step needs
//    no cross-warp exchange.
// 3. KdaTcTuning::fused / K3_KDA_TC_FUSED (opt-in): both steps in ONE warp-specialised kernel per (sequence, head),
//    kda_tc_fused.cu; the intra outputs stay in shared memory.
// Fragment layouts are PTX's m16n8k16 ones; ldmatrix (.trans for operands stored k-major) loads them.
#include "k3/backend/cuda/kda_chunked_tc.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <utility>
#include <type_traits>

#include "k3/backend/cuda/kda_tc_common.cuh"
#include "k3/backend/cuda/kda_tc_intra2.cuh"
#include "k3/backend/cuda/kda_tc_fused.h"
#include "k3/backend/cuda/kda_tc_state2.h"

namespace k3::cuda {
namespace {

// base[s] = chunks of the sequences before s; base[n_seqs] = all. Serial: n_seqs is small next to the
// work of one chunk.
__global__ void kda_tc_table_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, int L, int* __restrict__ base) {
  if (threadIdx.x != 0) return;
  int run = 0;
  for (int s = 0; s < n_seqs; ++s) {
    base[s] = run;
    run += n_chunks(seqs[s].n, L);
  }
  base[n_seqs] = run;
}

// The overlapped launch's table kernel: the table as above (block 0, thread 0) and every ready flag of the call's
// item bound cleared, so the flags start at 0 on every call, including every replay of a captured graph (a
// per-call epoch passed as an argument would be frozen into the graph, and a replay would take the previous
// replay's flags for its own). The intra kernel runs after this kernel on the same stream; the state kernel after
// the intra kernel's blocks have started: both see the cleared flags and the table.
__global__ void kda_tc_table_flags_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, int L, int* __restrict__ base,
                                          uint32_t* __restrict__ flags, size_t n_flags) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    int run = 0;
    for (int s = 0; s < n_seqs; ++s) {
      base[s] = run;
      run += n_chunks(seqs[s].n, L);
    }
    base[n_seqs] = run;
  }
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n_flags;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    flags[i] = 0;
}

// ---------------------------------------------------------------------------------------------------
// Intra-chunk kernel. Shared memory: Gs float [L][LDG] (later A_kk, float [L][LDK]), Qs bf16 [L][LDB]
// (later T, bf16 [L][LDT]), Ks, Vs, KE (= exp(G) k) bf16 [L][LDB], bs float [L]. Row pads keep ldmatrix
// and the fragment loads free of bank conflicts.
template <int L>
struct IntraCfg {
  static constexpr int NW = L / 16, NT = 32 * NW;
  static constexpr int LDG = kD + 8, LDB = kD + 8, LDT = L + 8, LDK = L + 4;
  static constexpr size_t g_bytes = static_cast<size_t>(L) * LDG * sizeof(float);
  static constexpr size_t b_bytes = static_cast<size_t>(L) * LDB * sizeof(bf16);
  static constexpr size_t bytes = g_bytes + 4 * b_bytes + L * sizeof(float);
  static_assert(static_cast<size_t>(L) * LDK * sizeof(float) <= g_bytes, "A_kk fits in G's space");
  static_assert(static_cast<size_t>(L) * LDT * sizeof(bf16) <= b_bytes, "T fits in q's space");
};

// Stage q, k, v (bf16) and g (fp32) of rows [0, Lc), zeros past them, and beta.
template <int L, class T>
__device__ __forceinline__ void intra_stage(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                            const T* __restrict__ g, const float* __restrict__ beta, size_t row0,
                                            int Lc, int C, int H, int h, float* Gs, bf16* Qs, bf16* Ks, bf16* Vs,
                                            float* bs) {
  using Cfg = IntraCfg<L>;
  constexpr int D4 = kD / 4;
  for (int e = threadIdx.x; e < L * D4; e += Cfg::NT) {
    const int i = e / D4, d = 4 * (e % D4);
    float4 qq = make_float4(0.f, 0.f, 0.f, 0.f), kk = qq, vv = qq, gg = qq;
    if (i < Lc) {
      const size_t at = (row0 + i) * C + static_cast<size_t>(h) * kD + d;
      qq = load4(q + at);
      kk = load4(k + at);
      vv = load4(v + at);
      gg = load4(g + at);
    }
    *reinterpret_cast<uint2*>(Qs + i * Cfg::LDB + d) = make_uint2(pack2(qq.x, qq.y), pack2(qq.z, qq.w));
    *reinterpret_cast<uint2*>(Ks + i * Cfg::LDB + d) = make_uint2(pack2(kk.x, kk.y), pack2(kk.z, kk.w));
    *reinterpret_cast<uint2*>(Vs + i * Cfg::LDB + d) = make_uint2(pack2(vv.x, vv.y), pack2(vv.z, vv.w));
    *reinterpret_cast<float4*>(Gs + i * Cfg::LDG + d) = gg;
  }
  for (int i = threadIdx.x; i < L; i += Cfg::NT) bs[i] = i < Lc ? beta[(row0 + i) * H + h] : 0.f;
}

// A_kk (strictly lower, times beta_i, fp32 into Ak after a barrier) and A_qk (lower with the diagonal,
// bf16 to Ap) for the warp's 16 rows [r, r + 16).
template <int L>
__device__ __forceinline__ void intra_products(const float* Gs, const bf16* Qs, const bf16* Ks, const float* bs,
                                               float* Ak, bf16* __restrict__ Ap, size_t row0, int Lc, int H,
                                               int h) {
  using Cfg = IntraCfg<L>;
  constexpr int NJ = L / 8;  // n-tiles of 8 key rows
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4, r = 16 * w;
  float accK[NJ][4], accQ[NJ][4];
#pragma unroll
  for (int jt = 0; jt < NJ; ++jt)
#pragma unroll
    for (int m = 0; m < 4; ++m) accK[jt][m] = accQ[jt][m] = 0.f;

#pragma unroll 2
  for (int kk = 0; kk < kD / 16; ++kk) {
    const int d0 = 16 * kk + 2 * tq;
    float2 gref[2];
    gref[0] = *reinterpret_cast<const float2*>(Gs + r * Cfg::LDG + d0);
    gref[1] = *reinterpret_cast<const float2*>(Gs + r * Cfg::LDG + d0 + 8);
    uint32_t ak[4], aq[4];
#pragma unroll
    for (int f = 0; f < 4; ++f) {  // a[f]: row gq + 8 (f & 1), column d0 + 8 (f >> 1)
      const int row = r + gq + 8 * (f & 1), col = d0 + 8 * (f >> 1);
      const float2 G = *reinterpret_cast<const float2*>(Gs + row * Cfg::LDG + col);
      const float ex = __expf(G.x - gref[f >> 1].x), ey = __expf(G.y - gref[f >> 1].y);
      const float2 kv = unpack2(lds32(Ks + row * Cfg::LDB + col)), qv = unpack2(lds32(Qs + row * Cfg::LDB + col));
      ak[f] = pack2(kv.x * ex, kv.y * ey);
      aq[f] = pack2(qv.x * ex, qv.y * ey);
    }
#pragma unroll
    for (int jt = 0; jt < NJ; ++jt) {
      if (jt < 2 * w + 2) {  // key rows j < r + 16 (warp-uniform)
        const int j = 8 * jt + gq;
        uint32_t b[2];
#pragma unroll
        for (int f = 0; f < 2; ++f) {  // b[f]: column d0 + 8 f
          const float2 G = *reinterpret_cast<const float2*>(Gs + j * Cfg::LDG + d0 + 8 * f);
          const float ex = __expf(fminf(gref[f].x - G.x, 88.f)), ey = __expf(fminf(gref[f].y - G.y, 88.f));
          const float2 kv = unpack2(lds32(Ks + j * Cfg::LDB + d0 + 8 * f));
          b[f] = pack2(kv.x * ex, kv.y * ey);
        }
        mma(accK[jt], ak, b[0], b[1]);
        mma(accQ[jt], aq, b[0], b[1]);
      }
    }
  }
  __syncthreads();  // Gs is read by every warp above; Ak overwrites it
#pragma unroll
  for (int jt = 0; jt < NJ; ++jt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = r + gq + 8 * half, j = 8 * jt + 2 * tq;
      const float bi = bs[i];
      const float k0 = j < i ? bi * accK[jt][2 * half] : 0.f, k1 = j + 1 < i ? bi * accK[jt][2 * half + 1] : 0.f;
      *reinterpret_cast<float2*>(Ak + i * Cfg::LDK + j) = make_float2(k0, k1);
      if (i < Lc) {
        const float q0 = j <= i ? accQ[jt][2 * half] : 0.f, q1 = j + 1 <= i ? accQ[jt][2 * half + 1] : 0.f;
        *reinterpret_cast<uint32_t*>(Ap + ((row0 + i) * H + h) * L + j) = pack2(q0, q1);
      }
    }
}

// T = (I + N)^-1 diag(beta), N = Ak (= diag(beta) A_kk, strictly lower): thread c < L solves column c
// by forward substitution in registers, fp32; T to Ts as bf16.
template <int L>
__device__ __forceinline__ void intra_inverse(const float* Ak, const float* bs, bf16* Ts) {
  using Cfg = IntraCfg<L>;
  const int c = threadIdx.x;
  if (c >= L) return;
  float m[L];
#pragma unroll
  for (int i = 0; i < L; ++i) {
    float a0 = i == c ? 1.f : 0.f, a1 = 0.f;
#pragma unroll
    for (int j4 = 0; 4 * j4 < i; ++j4) {
      const float4 a = *reinterpret_cast<const float4*>(Ak + i * Cfg::LDK + 4 * j4);
      a0 = fmaf(-a.x, m[4 * j4], a0);
      if (4 * j4 + 1 < i) a1 = fmaf(-a.y, m[4 * j4 + 1], a1);
      if (4 * j4 + 2 < i) a0 = fmaf(-a.z, m[4 * j4 + 2], a0);
      if (4 * j4 + 3 < i) a1 = fmaf(-a.w, m[4 * j4 + 3], a1);
    }
    m[i] = a0 + a1;
  }
  const float bc = bs[c];
#pragma unroll
  for (int i = 0; i < L; ++i) Ts[i * Cfg::LDT + c] = __float2bfloat16_rn(m[i] * bc);
}

// dst rows [r, r + 16) of T B (B = KE or Vs, [L][kD]), bf16 to the [N][C] plane.
template <int L>
__device__ __forceinline__ void intra_apply_t(const bf16* Ts, const bf16* B, bf16* __restrict__ dst, size_t row0,
                                              int Lc, int C, int h) {
  using Cfg = IntraCfg<L>;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, gq = lane / 4, tq = lane % 4, r = 16 * w;
  float acc[kD / 8][4];
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt)
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[nt][m] = 0.f;
#pragma unroll
  for (int kk = 0; kk < L / 16; ++kk) {
    if (kk <= w) {
      uint32_t a[4];
      ldsm_x4(a, Ts + (r + (lane & 15)) * Cfg::LDT + 16 * kk + 8 * (lane >> 4));
#pragma unroll
      for (int p = 0; p < kD / 16; ++p) {
        uint32_t b[4];
        ldsm_x4_t(b, B + (16 * kk + (lane & 15)) * Cfg::LDB + 16 * p + 8 * (lane >> 4));
        mma(acc[2 * p], a, b[0], b[1]);
        mma(acc[2 * p + 1], a, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = r + gq + 8 * half;
    if (i < Lc) {
      bf16* row = dst + (row0 + i) * C + static_cast<size_t>(h) * kD + 2 * tq;
#pragma unroll
      for (int nt = 0; nt < kD / 8; ++nt)
        *reinterpret_cast<uint32_t*>(row + 8 * nt) = pack2(acc[nt][2 * half], acc[nt][2 * half + 1]);
    }
  }
}

template <int L, class T>
__global__ void __launch_bounds__(IntraCfg<L>::NT)
    kda_tc_intra_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, const int* __restrict__ base, int H,
                        const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                        const T* __restrict__ g, const float* __restrict__ beta, TcWs ws) {
  using Cfg = IntraCfg<L>;
  extern __shared__ float4 smem4[];
  char* sp = reinterpret_cast<char*>(smem4);
  float* Gs = reinterpret_cast<float*>(sp);
  bf16* Qs = reinterpret_cast<bf16*>(sp + Cfg::g_bytes);
  bf16* Ks = Qs + L * Cfg::LDB;
  bf16* Vs = Ks + L * Cfg::LDB;
  bf16* KE = Vs + L * Cfg::LDB;
  float* bs = reinterpret_cast<float*>(KE + L * Cfg::LDB);
  float* Ak = Gs;  // after intra_products' barrier
  bf16* Ts = Qs;   // after the barrier that follows A_kk

  const int b = blockIdx.x;
  if (b >= base[n_seqs]) return;  // the grid is an upper bound on the chunk count
  const int s = seq_of_chunk(base, n_seqs, b);
  const KdaSeq sq = seqs[s];
  const int t0 = (b - base[s]) * L, Lc = min(L, sq.n - t0);
  const int h = blockIdx.y, C = H * kD, tid = threadIdx.x;
  const size_t row0 = static_cast<size_t>(sq.offset + t0), hcol = static_cast<size_t>(h) * kD;

  intra_stage<L>(q, k, v, g, beta, row0, Lc, C, H, h, Gs, Qs, Ks, Vs, bs);
  __syncthreads();
  for (int d = tid; d < kD; d += Cfg::NT) {  // cumulative log decay (padded rows add 0)
    float run = 0.f;
    for (int i = 0; i < L; ++i) {
      run += Gs[i * Cfg::LDG + d];
      Gs[i * Cfg::LDG + d] = run;
    }
  }
  __syncthreads();

  // Elementwise operands: Q exp(G), exp(G_last - G) k (to the workspace), exp(G) k (shared), exp(G_last).
  for (int e = tid; e < L * (kD / 2); e += Cfg::NT) {
    const int i = e / (kD / 2), d = 2 * (e % (kD / 2));
    const float2 G = *reinterpret_cast<const float2*>(Gs + i * Cfg::LDG + d);
    const float2 Gl = *reinterpret_cast<const float2*>(Gs + (Lc - 1) * Cfg::LDG + d);
    const float2 kv = unpack2(lds32(Ks + i * Cfg::LDB + d));
    const float ex = __expf(G.x), ey = __expf(G.y);
    sts32(KE + i * Cfg::LDB + d, pack2(kv.x * ex, kv.y * ey));
    if (i < Lc) {
      const float2 qv = unpack2(lds32(Qs + i * Cfg::LDB + d));
      const size_t at = (row0 + i) * C + hcol + d;
      *reinterpret_cast<uint32_t*>(ws.Q + at) = pack2(qv.x * ex, qv.y * ey);
      *reinterpret_cast<uint32_t*>(ws.K + at) = pack2(kv.x * __expf(Gl.x - G.x), kv.y * __expf(Gl.y - G.y));
    }
  }
  for (int d = tid; d < kD; d += Cfg::NT) ws.eL[(static_cast<size_t>(b) * H + h) * kD + d] = __expf(Gs[(Lc - 1) * Cfg::LDG + d]);

  intra_products<L>(Gs, Qs, Ks, bs, Ak, ws.A, row0, Lc, H, h);
  __syncthreads();  // Ak complete; Qs free for T
  intra_inverse<L>(Ak, bs, Ts);
  __syncthreads();
  intra_apply_t<L>(Ts, KE, ws.W, row0, Lc, C, h);
  intra_apply_t<L>(Ts, Vs, ws.U, row0, Lc, C, h);
}

__device__ __forceinline__ void pack4(uint32_t (&dst)[2], float4 x) {
  dst[0] = pack2(x.x, x.y);
  dst[1] = pack2(x.z, x.w);
}

// The thread's raw input data of one (chunk, head): 4 rows x 4 columns of g, q, k, v as loaded (bf16: 8 bytes a
// row, fp32: 16), zeros for rows >= Lc. v2 loads it from global memory and converts it right away (intra2_load);
// v3 reads it from its prefetch stage in shared memory (intra3_read).
template <class T>
struct Intra2Raw {
  using Vec = std::conditional_t<std::is_same_v<T, float>, float4, uint2>;
  Vec g[4], q[4], k[4], v[4];
};

template <class T>
__device__ __forceinline__ typename Intra2Raw<T>::Vec raw_load(const T* p) {
  return *reinterpret_cast<const typename Intra2Raw<T>::Vec*>(p);
}
template <class T>
__device__ __forceinline__ typename Intra2Raw<T>::Vec raw_zero() {
  if constexpr (std::is_same_v<T, float>) return make_float4(0.f, 0.f, 0.f, 0.f);
  else return make_uint2(0u, 0u);
}

// All 16 global loads (nothing in between depends on them). Rows >= Lc: zeros (no load).
template <class T>
__device__ __forceinline__ void intra2_issue(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                             const T* __restrict__ g, size_t at0, int r0, int Lc, int C,
                                             Intra2Raw<T>& raw) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    raw.g[u] = raw.q[u] = raw.k[u] = raw.v[u] = raw_zero<T>();
    if (r0 + u < Lc) {
      const size_t at = at0 + static_cast<size_t>(r0 + u) * C;
      raw.g[u] = raw_load(g + at);
      raw.q[u] = raw_load(q + at);
      raw.k[u] = raw_load(k + at);
      raw.v[u] = raw_load(v + at);
    }
  }
}

// The conversions: g to fp32 G, q, k, v rounded to bf16 (as v1 stages them).
template <class T>
__device__ __forceinline__ void intra2_convert(const Intra2Raw<T>& raw, Intra2Tile& t) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float4 gr = raw_to4(raw.g[u]), qr = raw_to4(raw.q[u]), kr = raw_to4(raw.k[u]), vr = raw_to4(raw.v[u]);
    t.G[u][0] = gr.x;
    t.G[u][1] = gr.y;
    t.G[u][2] = gr.z;
    t.G[u][3] = gr.w;
    pack4(t.q[u], qr);
    pack4(t.k[u], kr);
    pack4(t.v[u], vr);
  }
}

// v2: all 16 global loads first, then the conversions.
template <class T>
__device__ __forceinline__ void intra2_load(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                            const T* __restrict__ g, size_t at0, int r0, int Lc, int C,
                                            Intra2Tile& t) {
  Intra2Raw<T> raw;
  intra2_issue<T>(q, k, v, g, at0, r0, Lc, C, raw);
  intra2_convert<T>(raw, t);
}

// intra2_elementwise_to (kda_tc_intra2.cuh) with Q exp(G) and exp(G_last - G) k going to the workspace (rows < Lc),
// every exponential __expf.
template <bool CS = false, bool kExact = false>
__device__ __forceinline__ void intra2_elementwise(const Intra2Tile& t, const Intra2Refs& rf, int r0, int d, int Lc,
                                                   char* sp, bf16* __restrict__ gQ, bf16* __restrict__ gK,
                                                   size_t at0, int C) {
  intra2_elementwise_to<ExpFast, ExpFast, kExact>(t, rf, r0, d, sp, reinterpret_cast<bf16*>(sp + Intra2Cfg::off_ke),
                                          reinterpret_cast<bf16*>(sp + Intra2Cfg::off_v), [=](int i, uint2 qg, uint2 kd) {
                                            if (i < Lc) {
                                              const size_t at = at0 + static_cast<size_t>(i) * C;
                                              st_out<CS>(gQ + at, qg);
                                              st_out<CS>(gK + at, kd);
                                            }
                                          });
}

// intra2_products_to (kda_tc_intra2.cuh) with A_qk's rows < Lc going to the workspace plane [N][H][L].
template <bool CS = false, bool kExact = false>
__device__ __forceinline__ void intra2_products(const char* sp, float* Ak, bf16* __restrict__ Ap, size_t row0,
                                                int Lc, int H, int h, int tid = threadIdx.x) {
  constexpr int L = Intra2Cfg::L;
  intra2_products_to<kExact>(sp, Ak, [&](int i, int j, float x0, float x1, bool zero_block) {
    if (i < Lc) {
      bf16* arow = Ap + ((row0 + i) * H + h) * L;
      st_out<CS>(arow + j, pack2(j <= i ? x0 : 0.f, j + 1 <= i ? x1 : 0.f));
      if (zero_block) st_out<CS>(arow + j + 16, 0u);
    }
  }, tid);
}

// intra2_apply_to (kda_tc_intra2.cuh) with W / U's rows < Lc going to the [N][C] planes.
template <bool CS = false, int NP = 1>
__device__ __forceinline__ void intra2_apply(const char* sp, const bf16* Ts, const TcWs& ws, size_t row0, int Lc,
                                             int C, int h, int tid = threadIdx.x) {
  intra2_apply_to<NP>(
      sp, Ts, ws.W, ws.U, [&](int i) { return i < Lc; },
      [&](bf16* dst, int i) { return dst + (row0 + i) * C + static_cast<size_t>(h) * kD; },
      [](bf16* p, uint32_t v) { st_out<CS>(p, v); }, tid);
}

// MINB: blocks per SM the registers must allow (3: 80 registers, no spills, the default; 4: 64 registers,
// ~200 bytes of spills, one more block of latency hiding: an A/B variant, KdaTcTuning::intra = 3).
// kExact (KdaDecays::Any): the diagonal blocks summed exactly (kda_tc_intra2.cuh, IntraExactCfg): shared memory
// IntraExactCfg::bytes (70 KB, still 3 blocks per SM), one more barrier.
template <class T, int MINB, bool kExact = false>
__global__ void __launch_bounds__(Intra2Cfg::NT, MINB)
    kda_tc_intra2_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, const int* __restrict__ base, int H,
                         const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                         const T* __restrict__ g, const float* __restrict__ beta, TcWs ws) {
  using Cfg = Intra2Cfg;
  constexpr int L = Cfg::L;
  extern __shared__ float4 smem4[];
  char* sp = reinterpret_cast<char*>(smem4);
  float* Ak = reinterpret_cast<float*>(sp + Cfg::off_ak);
  float* bs = reinterpret_cast<float*>(sp + Cfg::off_bs);
  float* Mi = reinterpret_cast<float*>(sp + Cfg::off_mi);
  float* Xs = reinterpret_cast<float*>(sp + Cfg::off_xs);
  bf16* Ts = reinterpret_cast<bf16*>(sp + Cfg::off_ts);

  const int b = blockIdx.x;
  if (b >= base[n_seqs]) return;  // the grid is an upper bound on the chunk count
  const int s = seq_of_chunk(base, n_seqs, b);
  const KdaSeq sq = seqs[s];
  const int t0 = (b - base[s]) * L, Lc = min(L, sq.n - t0);
  const int h = blockIdx.y, C = H * kD, tid = threadIdx.x;
  const size_t row0 = static_cast<size_t>(sq.offset + t0);
  const int lane = tid % 32, seg = lane >> 2, cg = lane & 3, r0 = 4 * seg, d = 16 * (tid / 32) + 4 * cg;
  const size_t at0 = row0 * C + static_cast<size_t>(h) * kD + d;  // row 0 of the chunk, the thread's columns

  if (tid < L) bs[tid] = tid < Lc ? beta[(row0 + tid) * H + h] : 0.f;
  Intra2Tile t;
  intra2_load<T>(q, k, v, g, at0, r0, Lc, C, t);
  intra2_scan(t.G, lane);
  const Intra2Refs rf = intra2_refs(t.G, cg);
  intra2_elementwise<false, kExact>(t, rf, r0, d, Lc, sp, ws.Q, ws.K, at0, C);
  if (seg == 7)
    *reinterpret_cast<float4*>(ws.eL + (static_cast<size_t>(b) * H + h) * kD + d) =
        make_float4(__expf(rf.gl[0]), __expf(rf.gl[1]), __expf(rf.gl[2]), __expf(rf.gl[3]));
  __syncthreads();  // operands and beta complete
  if constexpr (kExact) {
    intra2_exact_diag(sp, Ak, tid);
    __syncthreads();  // the exact diagonal blocks in Ak and the A_qk plane
  }
  intra2_products<false, kExact>(sp, Ak, ws.A, row0, Lc, H, h);
  __syncthreads();  // Ak complete; Ql, Kl free for the inverse's scratch
  intra2_diag_inverse(Ak, Mi);
  __syncthreads();
  intra2_offdiag_x(Ak, Mi, Xs);
  __syncthreads();
  intra2_write_t(Mi, Xs, bs, Ts);
  __syncthreads();
  intra2_apply(sp, Ts, ws, row0, Lc, C, h);
}

// ---------------------------------------------------------------------------------------------------
// Intra-chunk kernel v3 (chunk 32, bf16 inputs; KdaTcTuning::intra = 4, 5 = with streaming stores): v2 made
// persistent, with the next work item's inputs streaming into shared memory while the current one computes. v2's
// profile (call s25-1, 1 x 8192 x 96: 0.80 ms against a ~0.38 ms byte floor) was a block life of load -> compute
// -> store with the loads' whole DRAM latency exposed (long_sb 32% of the stall samples, on the first uses of the
// bf16 loads) and 3 blocks per SM too few to cover it (0.88 eligible warps per scheduler).
//    - grid = resident blocks (SMs x blocks per SM from the occupancy calculator, at most the work item count);
//      block x takes items x, x + grid, x + 2 grid, ... Item it = (chunk it / H, head it % H): heads fastest, so
//      the items in flight together cover whole rows of q, k, v, g (v2's grid went chunk-fastest within a head:
//      256-byte pieces strided by the row). exp(G_last) goes to (chunk H + head) kD = it kD as before.
//    - the prefetch: cp.async 16-byte copies (zero-filled past the chunk's valid rows, as v2's loads are) of the
//      next item's g, k and beta into a stage of their own (16.1 KB after v2's 52.6 KB), issued at the top of the
//      item (covering all of its compute), and of q and v into v2's Kl / Kr planes (16 KB of their 21.3), dead
//      from the end of the products until the next item's elementwise phase, issued after the products (covering
//      the inverse, W / U and their stores). Shared memory 67.5 KB: still 3 blocks (24 warps) per SM. A full
//      32 KB stage of its own would make 84.7 KB a block, 2 blocks per SM; a register prefetch (the 16 loads a
//      thread issues in v2 held across the compute: 32 registers) was tried first and spilled ~370 bytes at v2's
//      80-register cap (3 blocks per SM: the elementwise phase is at the cap already), spills that stall on the
//      loads they save. The stage rows are 256 bytes with the 16-byte chunks XOR-swizzled by bits 2-3 of the row
//      (intra3_stage_off), so the tile reads (a warp: 8 rows 4 apart x 32 bytes) take 2 wavefronts, not 8.
//    - fp32 inputs would need a 64 KB stage (1-2 blocks per SM): intra 4 / 5 with fp32 inputs run v2.
//    - the arithmetic is v2's: the same device functions on the same values (the tile read from the stage goes
//      through intra2_convert, load4's conversion), so W, U, Q exp(G), exp(G_last - G) k, A_qk and exp(G_last) are
//      bit-identical to v2's (tested). Only the load schedule, the loop, two barriers at the top of an item and
//      W / U in two passes of 32 columns (the same mma sequence per element; 16 fewer live registers) differ.
//    - CS: streaming stores (st.global.cs) for the outputs, an A/B knob (the state kernel reads them once).
//    - kFlags (the overlapped launch, run_tc_overlap): each block first executes griddepcontrol.launch_dependents
//      (the state kernel, launched next with programmatic serialization, may begin once every intra block has done
//      so, i.e. is resident), and publishes each item's flag (ws.flags[it], tc_flag_publish) after the barrier that
//      follows all of the item's stores: the next item's first barrier, or one after the loop for the last item.
//      The kernel itself never waits on anything. Arithmetic and stores unchanged.
// Estimate before measurement: with the loads hidden the block is issue-bound (v2: ~1.7 K warp instructions per
// warp and item at IPC 1.77, a third of the stall samples on DRAM; v3 adds ~15% integer / address instructions):
// 0.80 -> ~0.52 ms at 1 x 8192 x 96 (~1.4x the byte floor), 0.26 -> ~0.18 ms at 32 heads.
struct Intra3Cfg {
  static constexpr int L = Intra2Cfg::L, NT = Intra2Cfg::NT;
  static constexpr size_t plane = static_cast<size_t>(L) * kD * sizeof(bf16);  // 8 KB, rows of 256 bytes
  static constexpr size_t off_g = Intra2Cfg::bytes, off_k = off_g + plane, off_b = off_k + plane;
  static constexpr size_t bytes = off_b + L * sizeof(float);
  static constexpr size_t off_q = Intra2Cfg::off_kl, off_v = off_q + plane;  // the late planes, in Kl / Kr
  static_assert(off_v + plane <= Intra2Cfg::off_ak, "q and v fit in Kl and Kr");
  static_assert(Intra2Cfg::off_ts + static_cast<size_t>(L) * Intra2Cfg::LDT * sizeof(bf16) <= off_q,
                "the inverse's scratch stays clear of the late planes");
  static_assert(off_g % 16 == 0 && off_q % 16 == 0 && off_b % 16 == 0, "cp.async alignment");
};

struct Intra3Item {
  int b, h, Lc;  // chunk (global index), head, valid rows
  size_t row0;   // the chunk's first token row
};

// Item (chunk b, head h) = it = b H + h.
__device__ __forceinline__ Intra3Item intra3_item(const KdaSeq* __restrict__ seqs, int n_seqs,
                                                  const int* __restrict__ base, int b, int h) {
  Intra3Item r;
  r.b = b;
  r.h = h;
  const int s = seq_of_chunk(base, n_seqs, r.b);
  const KdaSeq sq = seqs[s];
  const int t0 = (r.b - base[s]) * Intra3Cfg::L;
  r.Lc = min(Intra3Cfg::L, sq.n - t0);
  r.row0 = static_cast<size_t>(sq.offset + t0);
  return r;
}

// One plane of an item into a stage (intra3_copy_rows from the chunk's first row, the head's first column).
__device__ __forceinline__ void intra3_copy_plane(char* dst, const bf16* __restrict__ src, const Intra3Item& w,
                                                  int C, int tid) {
  intra3_copy_rows(dst, src + w.row0 * C + static_cast<size_t>(w.h) * kD, w.Lc, C, tid);
}

// The early group: g, k and beta (4-byte copies: beta is [N][H], strided by H).
__device__ __forceinline__ void intra3_issue_early(char* sp, const bf16* __restrict__ k, const bf16* __restrict__ g,
                                                   const float* __restrict__ beta, const Intra3Item& w, int H, int C,
                                                   int tid) {
  intra3_copy_plane(sp + Intra3Cfg::off_g, g, w, C, tid);
  intra3_copy_plane(sp + Intra3Cfg::off_k, k, w, C, tid);
  if (tid < Intra3Cfg::L) {
    const bool ok = tid < w.Lc;
    cp_async4(sp + Intra3Cfg::off_b + 4 * tid, beta + (w.row0 + (ok ? tid : 0)) * H + w.h, ok);
  }
  cp_async_commit();
}

// The late group: q and v (into Kl / Kr: only once the products are done with them).
__device__ __forceinline__ void intra3_issue_late(char* sp, const bf16* __restrict__ q, const bf16* __restrict__ v,
                                                  const Intra3Item& w, int C, int tid) {
  intra3_copy_plane(sp + Intra3Cfg::off_q, q, w, C, tid);
  intra3_copy_plane(sp + Intra3Cfg::off_v, v, w, C, tid);
  cp_async_commit();
}

// The thread's tile (rows r0 + u, columns [d, d + 4)) from the stage, as intra2_issue would have loaded it.
__device__ __forceinline__ void intra3_read(const char* sp, int r0, int d, Intra2Raw<bf16>& raw) {
  const int c = d >> 3, o = 2 * (d & 7);  // chunk, byte offset in it (0 or 8)
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int at = intra3_stage_off(r0 + u, c) + o;
    raw.g[u] = *reinterpret_cast<const uint2*>(sp + Intra3Cfg::off_g + at);
    raw.q[u] = *reinterpret_cast<const uint2*>(sp + Intra3Cfg::off_q + at);
    raw.k[u] = *reinterpret_cast<const uint2*>(sp + Intra3Cfg::off_k + at);
    raw.v[u] = *reinterpret_cast<const uint2*>(sp + Intra3Cfg::off_v + at);
  }
}

template <bool CS, bool kFlags = false>
__global__ void __launch_bounds__(Intra2Cfg::NT, 3)
    kda_tc_intra3_kernel(const KdaSeq* __restrict__ seqs, int n_seqs, const int* __restrict__ base, int H,
                         const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                         const bf16* __restrict__ g, const float* __restrict__ beta, TcWs ws) {
  using Cfg = Intra2Cfg;
  extern __shared__ float4 smem4[];
  char* sp = reinterpret_cast<char*>(smem4);
  float* Ak = reinterpret_cast<float*>(sp + Cfg::off_ak);
  float* bs = reinterpret_cast<float*>(sp + Cfg::off_bs);
  float* Mi = reinterpret_cast<float*>(sp + Cfg::off_mi);
  float* Xs = reinterpret_cast<float*>(sp + Cfg::off_xs);
  bf16* Ts = reinterpret_cast<bf16*>(sp + Cfg::off_ts);
  const float* bstage = reinterpret_cast<const float*>(sp + Intra3Cfg::off_b);
  if constexpr (kFlags) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  const int n_items = base[n_seqs] * H;  // the grid is at most the upper bound on the item count
  int it = blockIdx.x;
  if (it >= n_items) return;
  const int C = H * kD;

  // the item stride gridDim.x as (chunks, heads), so the loop needs no division
  const int step_b = static_cast<int>(gridDim.x) / H, step_h = static_cast<int>(gridDim.x) - step_b * H;
  auto next_item = [&](const Intra3Item& c) {  // item it + gridDim.x, evaluated where used (no live registers)
    const int hh = c.h + step_h, wrap = hh >= H ? 1 : 0;
    return intra3_item(seqs, n_seqs, base, c.b + step_b + wrap, hh - wrap * H);
  };
  Intra3Item cur = intra3_item(seqs, n_seqs, base, it / H, it % H);
  intra3_issue_early(sp, k, g, beta, cur, H, C, tid_fresh());
  intra3_issue_late(sp, q, v, cur, C, tid_fresh());
  for (;;) {
    const int nx = it + static_cast<int>(gridDim.x);
    const bool more = nx < n_items;
    const int tid = tid_fresh();
    const int lane = tid % 32, seg = lane >> 2, cg = lane & 3, r0 = 4 * seg, d = 16 * (tid / 32) + 4 * cg;
    cp_async_wait<0>();
    __syncthreads();  // this item's stage complete; the previous item's W / U done with the shared planes
    if constexpr (kFlags) {  // ... and stored: the previous item (it - gridDim.x, if any) is ready
      if (tid == 0 && it >= static_cast<int>(gridDim.x)) tc_flag_publish(ws.flags + (it - static_cast<int>(gridDim.x)));
    }
    Intra2Tile t;
    {
      Intra2Raw<bf16> raw;
      intra3_read(sp, r0, d, raw);
      intra2_convert<bf16>(raw, t);
    }
    const float bcur = tid < Cfg::L ? bstage[tid] : 0.f;
    __syncthreads();  // the stage is read: the early group may refill it, elementwise may overwrite Kl / Kr
    if (more) intra3_issue_early(sp, k, g, beta, next_item(cur), H, C, tid);
    if (tid < Cfg::L) bs[tid] = bcur;
    const size_t at0 = cur.row0 * C + static_cast<size_t>(cur.h) * kD + d;
    intra2_scan(t.G, lane);
    const Intra2Refs rf = intra2_refs(t.G, cg);
    intra2_elementwise<CS>(t, rf, r0, d, cur.Lc, sp, ws.Q, ws.K, at0, C);
    if (seg == 7)
      st_out<CS>(ws.eL + (static_cast<size_t>(cur.b) * H + cur.h) * kD + d,
                 make_float4(__expf(rf.gl[0]), __expf(rf.gl[1]), __expf(rf.gl[2]), __expf(rf.gl[3])));
    __syncthreads();  // operands and beta complete
    intra2_products<CS>(sp, Ak, ws.A, cur.row0, cur.Lc, H, cur.h, tid_fresh());
    __syncthreads();  // Ak complete; Ql, Kl free for the inverse's scratch, Kl / Kr for the late group
    Intra3Item nxt = cur;
    if (more) {  // the table lookups again (L1 hits): cheaper than 5 registers live through elementwise
      nxt = next_item(cur);
      intra3_issue_late(sp, q, v, nxt, C, tid_fresh());
    }
    intra2_diag_inverse(Ak, Mi, tid_fresh());
    __syncthreads();
    intra2_offdiag_x(Ak, Mi, Xs, tid_fresh());
    __syncthreads();
    intra2_write_t(Mi, Xs, bs, Ts, tid_fresh());
    __syncthreads();
    intra2_apply<CS, 2>(sp, Ts, ws, cur.row0, cur.Lc, C, cur.h, tid_fresh());
    if (!more) break;
    it = nx;
    cur = nxt;
  }
  if constexpr (kFlags) {
    __syncthreads();  // every thread's stores of the last item done
    if (tid_fresh() == 0) tc_flag_publish(ws.flags + it);
  }
}

// ---------------------------------------------------------------------------------------------------
// State + output kernel: grid (n_seqs, H, kD / BV), NW warps (4; 8 for BV = 128). Steps A/B: warp = (row tile
// rt of 16 chunk rows, value slice of NTW n-tiles); step C: warp w = key rows [16 MT w, 16 MT (w + 1)), all BV
// columns. BV = 128 (chunk 32 only): one block per (sequence, head), so W, Q, Kd are read once per head
// instead of once per value tile, with 8 warps (2 per scheduler) to carry the 4x larger step.
template <int L, int BV, int NBUF>
struct StateTcCfg {
  static constexpr int NW = BV == 128 ? 8 : 4;
  static constexpr int CHUNK = L, NT = 32 * NW, RT = L / 16, NSPLIT = NW / RT, NTW = BV / 8 / NSPLIT, NTC = BV / 8,
                       MT = kD / 16 / NW;
  static constexpr int LDB = kD + 8, LDA = L + 8, LDV = BV + 8;
  static_assert(RT * NSPLIT == NW && NTW >= 2 && NTW % 2 == 0 && MT * 16 * NW == kD, "warp mapping");
  // one buffer of chunk operands: W, Q, Kd [L][LDB], A_qk [L][LDA], U [L][LDV] (bf16), exp(G_last) [kD] fp32
  static constexpr size_t buf_bytes =
      (3 * static_cast<size_t>(L) * LDB + static_cast<size_t>(L) * LDA + static_cast<size_t>(L) * LDV) * sizeof(bf16) +
      kD * sizeof(float);
  static constexpr size_t bytes =
      NBUF * buf_bytes + (static_cast<size_t>(L) * LDV + static_cast<size_t>(kD) * LDV) * sizeof(bf16);
};

// Shared-memory views of one operand buffer.
struct StateOps {
  bf16 *W, *Q, *K, *A, *U;
  float* eL;
};

// Lane roles in the state kernel: rows [16 rt, 16 rt + 16) and n-tiles [nt0, nt0 + NTW) in steps A / B, key
// rows [mrow0, mrow0 + 32) in step C.
struct StateLane {
  int lane, gq, tq, rt, nt0, mrow0;
};

// Step A: W S and Q S (Q S into aq); V~ = U - W S to Vn as bf16.
template <class Cfg>
__device__ __forceinline__ void state_step_a(const StateOps& b, const bf16* Ss, bf16* Vn, const StateLane& ln,
                                             float (&aq)[Cfg::NTW][4]) {
  constexpr int LDB = Cfg::LDB, LDV = Cfg::LDV, NTW = Cfg::NTW;
  const int lane = ln.lane, gq = ln.gq, tq = ln.tq, rt = ln.rt, nt0 = ln.nt0;
  float aw[NTW][4];
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
    for (int m = 0; m < 4; ++m) aw[nt][m] = aq[nt][m] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t wa[4], qa[4];
    ldsm_x4(wa, b.W + (16 * rt + (lane & 15)) * LDB + 16 * kk + 8 * (lane >> 4));
    ldsm_x4(qa, b.Q + (16 * rt + (lane & 15)) * LDB + 16 * kk + 8 * (lane >> 4));
#pragma unroll
    for (int p = 0; p < NTW / 2; ++p) {
      uint32_t f[4];
      ldsm_x4_t(f, Ss + (16 * kk + (lane & 15)) * LDV + 8 * (nt0 + 2 * p) + 8 * (lane >> 4));
      mma(aw[2 * p], wa, f[0], f[1]);
      mma(aw[2 * p + 1], wa, f[2], f[3]);
      mma(aq[2 * p], qa, f[0], f[1]);
      mma(aq[2 * p + 1], qa, f[2], f[3]);
    }
  }
#pragma unroll
  for (int nt = 0; nt < NTW; ++nt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = 16 * rt + gq + 8 * half, col = 8 * (nt0 + nt) + 2 * tq;
      const float2 u = unpack2(lds32(b.U + row * LDV + col));
      sts32(Vn + row * LDV + col, pack2(u.x - aw[nt][2 * half], u.y - aw[nt][2 * half + 1]));
    }
}

// Step B: O = Q S + A_qk V~ (A_qk is zero above the diagonal: k-steps kk <= rt); rows < Lc to o_tile
// (= o at the chunk's first row, the head's and the block's first value column).
template <class Cfg>
__device__ __forceinline__ void state_step_b(const StateOps& b, const bf16* Vn, const StateLane& ln, int Lc,
                                             float* __restrict__ o_tile, int C, float (&aq)[Cfg::NTW][4]) {
  constexpr int LDA = Cfg::LDA, LDV = Cfg::LDV, NTW = Cfg::NTW;
  const int lane = ln.lane, gq = ln.gq, tq = ln.tq, rt = ln.rt, nt0 = ln.nt0;
#pragma unroll
  for (int kk = 0; kk < Cfg::RT; ++kk) {
    if (kk <= rt) {
      uint32_t a[4];
      ldsm_x4(a, b.A + (16 * rt + (lane & 15)) * LDA + 16 * kk + 8 * (lane >> 4));
#pragma unroll
      for (int p = 0; p < NTW / 2; ++p) {
        uint32_t f[4];
        ldsm_x4_t(f, Vn + (16 * kk + (lane & 15)) * LDV + 8 * (nt0 + 2 * p) + 8 * (lane >> 4));
        mma(aq[2 * p], a, f[0], f[1]);
        mma(aq[2 * p + 1], a, f[2], f[3]);
      }
    }
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = 16 * rt + gq + 8 * half;
    if (row < Lc) {
      float* orow = o_tile + static_cast<size_t>(row) * C + 2 * tq;
#pragma unroll
      for (int nt = 0; nt < NTW; ++nt)
        *reinterpret_cast<float2*>(orow + 8 * (nt0 + nt)) = make_float2(aq[nt][2 * half], aq[nt][2 * half + 1]);
    }
  }
}

// Step C: S = exp(G_last) S + Kd^T V~ on key rows [mrow0, mrow0 + 32); the bf16 copy to Ss and, if cs_tile
// (the chunk's state at the block's first value column), the fp32 state.
template <class Cfg>
__device__ __forceinline__ void state_step_c(const StateOps& b, const bf16* Vn, bf16* Ss, const StateLane& ln,
                                             float (&s)[Cfg::MT][Cfg::NTC][4], float* __restrict__ cs_tile) {
  constexpr int L = Cfg::CHUNK, LDB = Cfg::LDB, LDV = Cfg::LDV, NTC = Cfg::NTC, MT = Cfg::MT;
  const int lane = ln.lane, gq = ln.gq, tq = ln.tq, mrow0 = ln.mrow0;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float e = b.eL[mrow0 + 16 * mt + gq + 8 * half];
#pragma unroll
      for (int nt = 0; nt < NTC; ++nt) {
        s[mt][nt][2 * half] *= e;
        s[mt][nt][2 * half + 1] *= e;
      }
    }
#pragma unroll
  for (int kk = 0; kk < L / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldsm_x4_t(a[mt], b.K + (16 * kk + (lane & 7) + 8 * (lane >> 4)) * LDB + mrow0 + 16 * mt + 8 * ((lane >> 3) & 1));
#pragma unroll
    for (int p = 0; p < NTC / 2; ++p) {
      uint32_t f[4];
      ldsm_x4_t(f, Vn + (16 * kk + (lane & 15)) * LDV + 16 * p + 8 * (lane >> 4));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(s[mt][2 * p], a[mt], f[0], f[1]);
        mma(s[mt][2 * p + 1], a[mt], f[2], f[3]);
      }
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int dk = mrow0 + 16 * mt + gq + 8 * half, col = 8 * nt + 2 * tq;
        sts32(Ss + dk * LDV + col, pack2(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        if (cs_tile)
          *reinterpret_cast<float2*>(cs_tile + static_cast<size_t>(dk) * kD + col) =
              make_float2(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
      }
}

// NBUF = 1: one operand buffer, refilled piecewise as soon as each piece is consumed (two commit groups per
// chunk). NBUF >= 2: a ring of NBUF buffers, chunk c + NBUF - 1's operands requested when chunk c starts
// (NBUF - 1 chunk steps for them to arrive, at the cost of shared memory / resident blocks). NBUF = 3 (chunk
// 32 only: 108 KB at BV 32) tests whether a lone block per SM (few heads) waits on memory at every step.
template <int L, int BV, int NBUF>
__global__ void __launch_bounds__(StateTcCfg<L, BV, NBUF>::NT)
    kda_tc_state_kernel(const KdaSeq* __restrict__ seqs, int H, const int* __restrict__ base, TcWs ws,
                        float* __restrict__ o, float* __restrict__ chunk_states) {
  using Cfg = StateTcCfg<L, BV, NBUF>;
  constexpr int LDB = Cfg::LDB, LDA = Cfg::LDA, LDV = Cfg::LDV, NTW = Cfg::NTW, NTC = Cfg::NTC, MT = Cfg::MT;
  extern __shared__ float4 smem4[];
  char* sp = reinterpret_cast<char*>(smem4);
  auto ops = [&](int c) {
    char* b = sp + (c % NBUF) * Cfg::buf_bytes;
    StateOps r;
    r.W = reinterpret_cast<bf16*>(b);
    r.Q = r.W + L * LDB;
    r.K = r.Q + L * LDB;
    r.A = r.K + L * LDB;
    r.U = r.A + L * LDA;
    r.eL = reinterpret_cast<float*>(r.U + L * LDV);
    return r;
  };
  bf16* Vn = reinterpret_cast<bf16*>(sp + NBUF * Cfg::buf_bytes);
  bf16* Ss = Vn + L * LDV;

  const KdaSeq sq = seqs[blockIdx.x];
  if (sq.n <= 0) return;
  const int h = blockIdx.y, v0 = blockIdx.z * BV, tid = threadIdx.x, C = H * kD, cb = base[blockIdx.x];
  const int warp = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const StateLane ln{lane, gq, tq, warp % Cfg::RT, (warp / Cfg::RT) * NTW, 16 * MT * warp};
  const int mrow0 = ln.mrow0;
  const size_t hcol = static_cast<size_t>(h) * kD;
  const int nch = n_chunks(sq.n, L);

  float* Sg = sq.S + hcol * kD;
  float s[MT][NTC][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int dk = mrow0 + 16 * mt + gq + 8 * half, col = 8 * nt + 2 * tq;
        const float2 x = *reinterpret_cast<const float2*>(Sg + static_cast<size_t>(dk) * kD + v0 + col);
        s[mt][nt][2 * half] = x.x;
        s[mt][nt][2 * half + 1] = x.y;
        sts32(Ss + dk * LDV + col, pack2(x.x, x.y));
      }

  auto rows = [&](int c, int& Lc) {
    Lc = min(L, sq.n - c * L);
    return static_cast<size_t>(sq.offset + c * L);
  };
  auto load_wqu = [&](int c) {
    if (c < nch) {
      const StateOps b = ops(c);
      int Lc;
      const size_t r0 = rows(c, Lc);
      for (int e = tid; e < L * (kD / 8); e += Cfg::NT) {
        const int i = e / (kD / 8), d = 8 * (e % (kD / 8));
        const size_t at = (r0 + min(i, Lc - 1)) * C + hcol + d;
        cp_async16(b.W + i * LDB + d, ws.W + at, i < Lc);
        cp_async16(b.Q + i * LDB + d, ws.Q + at, i < Lc);
      }
      for (int e = tid; e < L * (BV / 8); e += Cfg::NT) {
        const int i = e / (BV / 8), j = 8 * (e % (BV / 8));
        cp_async16(b.U + i * LDV + j, ws.U + (r0 + min(i, Lc - 1)) * C + hcol + v0 + j, i < Lc);
      }
    }
    cp_async_commit();
  };
  auto load_ak = [&](int c) {
    if (c < nch) {
      const StateOps b = ops(c);
      int Lc;
      const size_t r0 = rows(c, Lc);
      for (int e = tid; e < L * (kD / 8); e += Cfg::NT) {
        const int i = e / (kD / 8), d = 8 * (e % (kD / 8));
        cp_async16(b.K + i * LDB + d, ws.K + (r0 + min(i, Lc - 1)) * C + hcol + d, i < Lc);
      }
      for (int e = tid; e < L * (L / 8); e += Cfg::NT) {
        const int i = e / (L / 8), j = 8 * (e % (L / 8));
        cp_async16(b.A + i * LDA + j, ws.A + ((r0 + min(i, Lc - 1)) * H + h) * L + j, i < Lc);
      }
      for (int e = tid; e < kD / 4; e += Cfg::NT)
        cp_async16(b.eL + 4 * e, ws.eL + (static_cast<size_t>(cb + c) * H + h) * kD + 4 * e, true);
    }
    cp_async_commit();
  };

  for (int c = 0; c < (NBUF == 1 ? 1 : NBUF - 1); ++c) {  // two commit groups per chunk, empty past the last
    load_wqu(c);
    load_ak(c);
  }
  for (int c = 0; c < nch; ++c) {
    int Lc;
    const size_t r0 = rows(c, Lc);
    const StateOps b = ops(c);
    if constexpr (NBUF >= 2) {  // buffer (c - 1) % NBUF was last read in chunk c - 1, before its closing barrier
      load_wqu(c + NBUF - 1);
      load_ak(c + NBUF - 1);
      cp_async_wait<2 * (NBUF - 1)>();  // the 2 (NBUF - 1) newest groups may pend: this chunk's two are done
    } else {
      cp_async_wait<1>();  // this chunk's W, Q, U
    }
    __syncthreads();  // ... every thread's copies, and Ss of the previous chunk

    float aq[NTW][4];
    state_step_a<Cfg>(b, Ss, Vn, ln, aq);
    __syncthreads();  // Vn complete; W, Q, U and Ss consumed
    if constexpr (NBUF == 1) {
      load_wqu(c + 1);
      cp_async_wait<1>();  // this chunk's exp(G_last - G) k, A_qk, exp(G_last)
      __syncthreads();
    }

    state_step_b<Cfg>(b, Vn, ln, Lc, o + r0 * C + hcol + v0, C, aq);
    float* cs = chunk_states ? chunk_states + (static_cast<size_t>(cb + c) * H + h) * kD * kD + v0 : nullptr;
    state_step_c<Cfg>(b, Vn, Ss, ln, s, cs);
    __syncthreads();  // Kd, A_qk, exp(G_last), Vn consumed; Ss complete
    if constexpr (NBUF == 1) load_ak(c + 1);
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTC; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int dk = mrow0 + 16 * mt + gq + 8 * half, col = 8 * nt + 2 * tq;
        *reinterpret_cast<float2*>(Sg + static_cast<size_t>(dk) * kD + v0 + col) =
            make_float2(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]);
      }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <int L, class T>
cudaError_t launch_intra(const KdaSeq* seqs, int n_seqs, int N, int H, const T* q, const T* k, const T* v,
                         const T* g, const float* beta, const TcWs& ws, cudaStream_t stream) {
  constexpr size_t smem = IntraCfg<L>::bytes;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kda_tc_intra_kernel<L, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(N / L + n_seqs), static_cast<unsigned>(H));
  kda_tc_intra_kernel<L, T><<<grid, IntraCfg<L>::NT, smem, stream>>>(seqs, n_seqs, ws.base, H, q, k, v, g, beta, ws);
  return cudaGetLastError();
}

template <class T, int MINB, bool kExact = false>
cudaError_t launch_intra2(const KdaSeq* seqs, int n_seqs, int N, int H, const T* q, const T* k, const T* v,
                          const T* g, const float* beta, const TcWs& ws, cudaStream_t stream) {
  constexpr size_t smem = kExact ? IntraExactCfg::bytes : Intra2Cfg::bytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kda_tc_intra2_kernel<T, MINB, kExact>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(N / Intra2Cfg::L + n_seqs), static_cast<unsigned>(H));
  kda_tc_intra2_kernel<T, MINB, kExact>
      <<<grid, Intra2Cfg::NT, smem, stream>>>(seqs, n_seqs, ws.base, H, q, k, v, g, beta, ws);
  return cudaGetLastError();
}

// v3's shared memory attributes (set once per instantiation, before any occupancy query: without the dynamic size
// the calculator answers 0 blocks), then the SMs and v3's blocks per SM alone (occupancy calculator), asked once per
// device and instantiation. The kFlags build also asks for the largest shared memory carveout, so an SM
// configured for the intra blocks can take state blocks beside them.
template <bool CS, bool kFlags>
cudaError_t intra3_occupancy(int* sms, int* per_sm) {
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(kda_tc_intra3_kernel<CS, kFlags>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(Intra3Cfg::bytes));
    if (e == cudaSuccess && kFlags)
      e = cudaFuncSetAttribute(kda_tc_intra3_kernel<CS, kFlags>, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  constexpr int kMaxDev = 64;
  static std::atomic<int> packed[kMaxDev] = {};  // sms * 256 + per_sm; 0 = not asked yet
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  int pk = dev < kMaxDev ? packed[dev].load(std::memory_order_relaxed) : 0;
  if (pk <= 0) {
    int n = 0, per = 0;
    e = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return e;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kda_tc_intra3_kernel<CS, kFlags>, Intra2Cfg::NT,
                                                      Intra3Cfg::bytes);
    if (e != cudaSuccess) return e;
    pk = n * 256 + (per > 0 ? per : 1);
    if (dev < kMaxDev) packed[dev].store(pk, std::memory_order_relaxed);
  }
  *sms = pk / 256;
  *per_sm = pk % 256;
  return cudaSuccess;
}

// v3's grid: the blocks that fit at once (SMs x blocks per SM), at most the items' upper bound (chunks N / L +
// n_seqs times H); blocks past the real item count return at once. per_sm_cap > 0 (the overlapped launch): at most
// that many blocks per SM, leaving room for the state kernel's blocks; the grid is still all resident at once.
template <bool CS, bool kFlags = false>
cudaError_t launch_intra3(const KdaSeq* seqs, int n_seqs, int N, int H, const bf16* q, const bf16* k,
                          const bf16* v, const bf16* g, const float* beta, const TcWs& ws, cudaStream_t stream,
                          int per_sm_cap = 0) {
  constexpr size_t smem = Intra3Cfg::bytes;
  int sms = 0, per_sm = 0;
  const cudaError_t e = intra3_occupancy<CS, kFlags>(&sms, &per_sm);
  if (e != cudaSuccess) return e;
  if (per_sm_cap > 0 && per_sm_cap < per_sm) per_sm = per_sm_cap;
  const long long blocks = static_cast<long long>(sms) * per_sm;
  const long long items_ub = (static_cast<long long>(N) / Intra2Cfg::L + n_seqs) * H;
  const unsigned grid = static_cast<unsigned>(items_ub < blocks ? items_ub : blocks);
  kda_tc_intra3_kernel<CS, kFlags>
      <<<grid, Intra2Cfg::NT, smem, stream>>>(seqs, n_seqs, ws.base, H, q, k, v, g, beta, ws);
  return cudaGetLastError();
}

// intra: 1 = v1, 2 = v2, 3 = v2 at 4 blocks per SM, 4 = v3 (persistent, register prefetch), 5 = v3 with
// streaming stores. v2 and v3 exist for chunk 32 only (chunk 64 always takes v1); v3 for bf16 inputs only (fp32
// inputs take v2: see kda_tc_intra3_kernel).
// kIntraExactDiag: the any-decay kernel (v2 with the exact diagonal blocks; chunk 32) -- internal, never a tuning value
// (KdaTcTuning::intra < 0 is rejected, 0 there means the default).
constexpr int kIntraExactDiag = -1;
template <int L, class T>
cudaError_t launch_intra_any(int intra, const KdaSeq* seqs, int n_seqs, int N, int H, const void* q, const void* k,
                             const void* v, const void* g, const float* beta, const TcWs& ws, cudaStream_t stream) {
  const T *tq = static_cast<const T*>(q), *tk = static_cast<const T*>(k), *tv = static_cast<const T*>(v),
          *tg = static_cast<const T*>(g);
  if (L == 32 && intra == kIntraExactDiag) return launch_intra2<T, 3, true>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream);
  if (L == 32 && intra == 2) return launch_intra2<T, 3>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream);
  if (L == 32 && intra == 3) return launch_intra2<T, 4>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream);
  if (L == 32 && (intra == 4 || intra == 5)) {
    if constexpr (std::is_same_v<T, bf16>) {
      return intra == 4 ? launch_intra3<false>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream)
                        : launch_intra3<true>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream);
    } else {
      return launch_intra2<T, 3>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream);
    }
  }
  return launch_intra<L, T>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream);
}

template <int L, int BV, int NBUF>
cudaError_t launch_state(const KdaSeq* seqs, int n_seqs, int H, const TcWs& ws, float* o, float* chunk_states,
                         cudaStream_t stream) {
  constexpr size_t smem = StateTcCfg<L, BV, NBUF>::bytes;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kda_tc_state_kernel<L, BV, NBUF>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(n_seqs), static_cast<unsigned>(H), kD / BV);
  kda_tc_state_kernel<L, BV, NBUF>
      <<<grid, StateTcCfg<L, BV, NBUF>::NT, smem, stream>>>(seqs, H, ws.base, ws, o, chunk_states);
  return cudaGetLastError();
}

// Value tile bv (32, 64; 128 at chunk 32) at NBUF buffers.
template <int L, int NBUF>
cudaError_t launch_state_bv(int bv, const KdaSeq* seqs, int n_seqs, int H, const TcWs& ws, float* o,
                            float* chunk_states, cudaStream_t stream) {
  if constexpr (L == 32) {
    if (bv == 128) return launch_state<L, 128, NBUF>(seqs, n_seqs, H, ws, o, chunk_states, stream);
  }
  return bv == 64 ? launch_state<L, 64, NBUF>(seqs, n_seqs, H, ws, o, chunk_states, stream)
                  : launch_state<L, 32, NBUF>(seqs, n_seqs, H, ws, o, chunk_states, stream);
}

// state: 1 = kda_tc_state_kernel (bv, nbuf apply), 2 / 3 = state v2 (kda_tc_state2.cu) at 8 / 4 warps per
// block (chunk 32 only; chunk 64 always runs v1).
template <int L>
cudaError_t run_tc(const KdaSeq* seqs, int n_seqs, int N, int H, KdaInType in_type, const void* q, const void* k,
                   const void* v, const void* g, const float* beta, float* o, float* chunk_states, int bv,
                   int nbuf, int intra, int state, const TcWs& ws, void* workspace, cudaStream_t stream) {
  kda_tc_table_kernel<<<1, 32, 0, stream>>>(seqs, n_seqs, L, ws.base);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = in_type == KdaInType::BF16
          ? launch_intra_any<L, bf16>(intra, seqs, n_seqs, N, H, q, k, v, g, beta, ws, stream)
          : launch_intra_any<L, float>(intra, seqs, n_seqs, N, H, q, k, v, g, beta, ws, stream);
  if (e != cudaSuccess) return e;
  if constexpr (L == 32) {
    if (state == 2 || state == 3)
      return kda_tc_state2_launch(state == 2 ? 8 : 4, seqs, n_seqs, N, H, workspace, o, chunk_states, stream);
  }
  if constexpr (L == 32) {  // three buffers of chunk 64 would not fit in shared memory
    if (nbuf == 3) return launch_state_bv<L, 3>(bv, seqs, n_seqs, H, ws, o, chunk_states, stream);
  }
  if (nbuf == 2) return launch_state_bv<L, 2>(bv, seqs, n_seqs, H, ws, o, chunk_states, stream);
  return launch_state_bv<L, 1>(bv, seqs, n_seqs, H, ws, o, chunk_states, stream);
}

// K3_KDA_TC_OVERLAP_INTRA_PER_SM=1..8: the overlapped launch's intra blocks per SM (A/B runs); unset: 0, the rule
// in overlap_intra_per_sm.
int overlap_per_sm_env() {
  static const int v = [] {
    const char* e = std::getenv("K3_KDA_TC_OVERLAP_INTRA_PER_SM");
    const int n = e != nullptr ? std::atoi(e) : 0;
    return n >= 1 && n <= 8 ? n : 0;
  }();
  return v;
}

// Intra blocks per SM in the overlapped launch: the most (at least 1, at most the intra kernel's occupancy alone)
// such that they plus ceil(state blocks / SMs) state blocks fit one SM's registers, shared memory (with the
// per-block reserve) and threads, so that both grids can be resident together; 1 where nothing fits (then not
// every state block is resident at once: the late ones start as early ones finish their sequences, a serial
// tail). H200 (64 K registers, 228 KB per SM), 1 x 8192 x 96 (per the ptxas counts of CUDA 13; intra 80
// registers = 20.5 K and 67.5 KB a block): 8 warps: 96 state blocks of 32.8 K registers and 74 KB, 1 per SM ->
// 1 intra block per SM; 4 warps: 192 state blocks of 23.6 K registers and 66 KB, 2 per SM on 60 SMs -> nothing
// fits (1 intra + 2 state blocks = 67584 registers > 65536): 1, with that tail.
cudaError_t overlap_intra_per_sm(int sms, int occ, int state_warps, long long state_blocks, int* per_sm) {
  if (overlap_per_sm_env() != 0) {
    *per_sm = overlap_per_sm_env();
    return cudaSuccess;
  }
  int dev = 0, regs_sm = 0, smem_sm = 0, reserve = 0, threads_sm = 0, s_regs = 0, s_smem = 0, s_threads = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&regs_sm, cudaDevAttrMaxRegistersPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&reserve, cudaDevAttrReservedSharedMemoryPerBlock, dev);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&threads_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev);
  if (e == cudaSuccess) e = kda_tc_state2_overlap_cost(state_warps, &s_regs, &s_smem, &s_threads);
  cudaFuncAttributes fa{};
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&fa, kda_tc_intra3_kernel<true, true>);  // CS: same registers
  if (e != cudaSuccess) return e;
  const long long i_regs = ((fa.numRegs * 32 + 255) / 256) * 256 * (Intra2Cfg::NT / 32);
  const long long i_smem = static_cast<long long>(Intra3Cfg::bytes) + fa.sharedSizeBytes + reserve;
  const long long m = (state_blocks + sms - 1) / sms;  // state blocks per SM
  int k = occ;
  for (; k > 1; --k)
    if (k * i_regs + m * s_regs <= regs_sm && k * i_smem + m * (s_smem + reserve) <= smem_sm &&
        k * Intra2Cfg::NT + m * s_threads <= threads_sm)
      break;
  *per_sm = k;
  return cudaSuccess;
}

// The overlapped launch (KdaTcTuning::overlap; chunk 32, bf16 inputs, intra v3 / v3cs, state v2): the state
// kernel runs WHILE the intra kernel produces, consuming each (chunk, head) item once its flag says it is stored.
// One stream: table + flag clear, intra (kFlags, persistent grid capped at per_sm blocks per SM), state (kWait,
// programmatic stream serialization). Outputs: bit-identical to run_tc's with the same intra / state (the same
// device functions on the same values; only when the loads happen changes).
// Deadlock freedom: the intra kernel waits on nothing, and its grid is at most what fits on the GPU at once. The
// state kernel is launched as its programmatic dependent, and each intra block executes
// griddepcontrol.launch_dependents first thing: the state grid may be scheduled only once EVERY intra block has
// executed it or exited, i.e. once every intra block holds its SM resources (or is done). From then on no state
// block can take an intra block's place, so every intra block runs to its end and every item is published; state
// blocks wait only on items. (Two streams forked by an event before the intra launch would make both kernels
// ready at the same moment, the table kernel's end, with no order between their blocks: state blocks could fill
// the SMs first and spin on items of intra blocks that never get an SM.) If programmatic launch is unavailable or
// serialised (a profiler replaying kernels, CUDA_LAUNCH_BLOCKING), the state kernel starts after the intra kernel
// ends: all flags set, no waits.
// Graph capture: all three launches are ordinary stream work (cudaLaunchKernelEx with the programmatic attribute is
// captured as a programmatic dependency edge, CUDA >= 12.3); the flags are cleared by the table kernel inside
// the graph, so every replay starts from zero.
cudaError_t run_tc_overlap(const KdaSeq* seqs, int n_seqs, int N, int H, const void* q, const void* k, const void* v,
                           const void* g, const float* beta, float* o, float* chunk_states, int intra, int state,
                           const TcWs& ws, void* workspace, cudaStream_t stream) {
  constexpr int L = 32;
  const size_t n_flags = (static_cast<size_t>(N) / L + n_seqs) * H;  // tc_ws_layout's flag count
  const unsigned tb = static_cast<unsigned>(std::min<size_t>((n_flags + 255) / 256, 1024));
  kda_tc_table_flags_kernel<<<tb, 256, 0, stream>>>(seqs, n_seqs, L, ws.base, ws.flags, n_flags);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int warps = state == 2 ? 8 : 4;
  int sms = 0, occ = 0, per_sm = 0;
  e = intra == 4 ? intra3_occupancy<false, true>(&sms, &occ) : intra3_occupancy<true, true>(&sms, &occ);
  if (e == cudaSuccess)
    e = overlap_intra_per_sm(sms, occ, warps, static_cast<long long>(n_seqs) * H * (warps == 4 ? 2 : 1), &per_sm);
  if (e != cudaSuccess) return e;
  const bf16 *tq = static_cast<const bf16*>(q), *tk = static_cast<const bf16*>(k), *tv = static_cast<const bf16*>(v),
             *tg = static_cast<const bf16*>(g);
  e = intra == 4 ? launch_intra3<false, true>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream, per_sm)
                 : launch_intra3<true, true>(seqs, n_seqs, N, H, tq, tk, tv, tg, beta, ws, stream, per_sm);
  if (e != cudaSuccess) return e;
  return kda_tc_state2_launch_overlap(warps, seqs, n_seqs, N, H, workspace, o, chunk_states, stream);
}

}  // namespace

size_t kda_chunked_tc_workspace_bytes(int n_total_tokens, int n_seqs, int H, int D, int chunk) {
  if (n_total_tokens < 0 || n_seqs < 0 || H <= 0 || D <= 0 || chunk <= 0) return 0;
  return tc_ws_layout(static_cast<size_t>(n_total_tokens), n_seqs, H, D, chunk, nullptr, nullptr);
}

namespace {
std::atomic<unsigned long long> g_tc_calls{0};

// The value `name` maps to in the environment (an A/B switch read once per variable), `fallback` when it is unset or
// not one of `choices`.
int env_choice(const char* name, std::initializer_list<std::pair<const char*, int>> choices, int fallback) {
  const char* e = std::getenv(name);
  if (e != nullptr)
    for (const auto& [key, value] : choices)
      if (std::strcmp(e, key) == 0) return value;
  return fallback;
}

// K3_KDA_TC_INTRA=v1 | v2 | v2x4 | v3 | v3cs (KdaTcTuning::intra 1 | 2 | 3 | 4 | 5) for A/B runs; unset or
// anything else: v3cs, bit-identical to v2 and 4-6% faster at every shape measured (call s26-1: 1 x 8192 x 96
// 1.300 -> 1.224 ms with the state kernel v2 at 4 warps; docs/perf/cuda.md, session 26).
int intra_default() {
  static const int v = env_choice("K3_KDA_TC_INTRA", {{"v1", 1}, {"v2", 2}, {"v2x4", 3}, {"v3", 4}, {"v3cs", 5}}, 5);
  return v;
}

// K3_KDA_TC_STATE=v1 | v2 | v2x4 (KdaTcTuning::state 1 | 2 | 3) for A/B runs; unset or anything else: 0, the
// rule in kda_chunked_tc.
int state_env() {
  static const int v = env_choice("K3_KDA_TC_STATE", {{"v1", 1}, {"v2", 2}, {"v2x4", 3}}, 0);
  return v;
}

// K3_KDA_TC_OVERLAP=1 (KdaTcTuning::overlap 0): the overlapped launch where it applies; unset or anything else: off.
bool overlap_env() {
  static const bool v = env_choice("K3_KDA_TC_OVERLAP", {{"1", 1}}, 0) == 1;
  return v;
}

// K3_KDA_TC_FUSED=off | 0 (KdaTcTuning::fused 1: the two-kernel path), 1 | 2 | 3 | 4 | 5 (fused 2 | 2 | 3 | 4 | 5: the
// fused kernel's variants, see kda_chunked_tc.h); unset or anything else: 0, the shape rule below.
int fused_env() {
  static const int v =
      env_choice("K3_KDA_TC_FUSED", {{"off", 1}, {"0", 1}, {"1", 2}, {"2", 2}, {"3", 3}, {"4", 4}, {"5", 5}}, 0);
  return v;
}

// The fused kernel by shape: one 16-warp block per (sequence, head), so it needs enough of them to fill the GPU.
// Call s28-1 (H200, 132 SMs, one process, docs/perf/cuda.md session 28): with sequences x heads >= 96 variant 5 beat
// the two kernels at every shape measured (1 x 8192 x 96 0.903 vs 1.230 ms, 2 x 4096 x 48 0.461 vs 0.641,
// 8 x 1024 x 32 0.250 vs 0.451, 16 x 512 x 96 0.741 vs 1.187, 1 x 1024 x 96 0.128 vs 0.188); at 64 and below it lost
// at every shape (1 x 8192 x 64 0.924 vs 0.826, x 32 0.904 vs 0.604, x 16 0.902 vs 0.485). Variant 5 over 2: ~10%
// faster everywhere, the same error against the fp32 recurrence.
int fused_rule(int n_seqs, int H) { return static_cast<long long>(n_seqs) * H >= 96 ? 5 : 1; }

// The state kernel by shape: v2 at chunk 32 (faster than v1 at every measured shape, same outputs: call s25-6,
// docs/perf/cuda.md session 25), 8 warps (one block per sequence and head) when that still gives two blocks
// per SM of an H200 (n_seqs x H >= 264; 8 x 1024 x 96: 1.25 ms vs 1.38 at 4 warps), else 4 warps (two blocks
// per head; 1 x 8192 x 96: 1.36 vs 1.39, x 32 heads: 0.62 vs 0.85).
int state_rule(int n_seqs, int H, int chunk) {
  if (chunk != 32) return 1;
  return n_seqs * H >= 264 ? 2 : 3;
}
}  // namespace

unsigned long long kda_chunked_tc_calls() { return g_tc_calls.load(); }

cudaError_t kda_chunked_tc(const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H, int D, int chunk,
                           KdaInType in_type, const void* q, const void* k, const void* v, const void* g,
                           const float* beta, float* o, float* chunk_states, KdaTcTuning tuning, void* workspace,
                           size_t workspace_bytes, cudaStream_t stream, KdaDecays decays) {
  const bool any_decay = decays == KdaDecays::Any;
  if (any_decay && chunk != 32) return cudaErrorInvalidValue;
  if (D != kD || (chunk != 32 && chunk != 64) || H <= 0 || n_seqs < 0 || n_total_tokens < 0 ||
      (tuning.value_tile != 0 && tuning.value_tile != 32 && tuning.value_tile != 64 &&
       !(tuning.value_tile == 128 && chunk == 32)) ||
      tuning.buffers < 0 ||
      tuning.buffers > (chunk == 32 ? 3 : 2) || tuning.intra < 0 || tuning.intra > 5)
    return cudaErrorInvalidValue;
  if (tuning.state < 0 || tuning.state > 3 || tuning.overlap < 0 || tuning.overlap > 2 || tuning.fused < 0 ||
      tuning.fused > 5)
    return cudaErrorInvalidValue;
  if (n_seqs == 0 || n_total_tokens == 0) return cudaSuccess;
  if (!workspace || workspace_bytes < kda_chunked_tc_workspace_bytes(n_total_tokens, n_seqs, H, D, chunk))
    return cudaErrorInvalidValue;
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(g) || !aligned16(o) || !aligned16(workspace) ||
      !aligned16(chunk_states))
    return cudaErrorInvalidValue;
  // Value tile: 64 halves the re-reads of the chunk operands, 32 doubles the blocks; take 32 while 64
  // would leave fewer than two blocks per multiprocessor (132 on an H200). This picked the faster tile at
  // each of 1 x 8192 / 8 x 1024 tokens x 32 / 96 heads (docs/perf/cuda.md, run kda-tc-2). One operand buffer:
  // two measured 1-10% slower everywhere (fewer resident blocks).
  const int bv = tuning.value_tile != 0 ? tuning.value_tile : (n_seqs * H * (kD / 64) >= 264 ? 64 : 32);
  const int nbuf = tuning.buffers != 0 ? tuning.buffers : 1;
  // Any decay: the exact-diagonal intra kernel (v2's form), whatever was asked.
  const int intra = any_decay ? kIntraExactDiag : tuning.intra != 0 ? tuning.intra : intra_default();
  // A caller that sets v1's value tile or buffers asks for v1 (the tests of its tiles, the bench rows).
  const bool v1_knobs = tuning.value_tile != 0 || tuning.buffers != 0;
  const int state = tuning.state != 0 ? tuning.state
                    : state_env() != 0 ? state_env()
                    : v1_knobs         ? 1
                                       : state_rule(n_seqs, H, chunk);
  // The overlapped launch where it exists (chunk 32, bf16 inputs, intra v3 / v3cs, state v2); anywhere else,
  // fp32 inputs included (their intra kernel is v2, not persistent), the request falls back to the sequential
  // launch, whose outputs are the same bits.
  const bool overlap = !any_decay && (tuning.overlap == 2 || (tuning.overlap == 0 && overlap_env())) && chunk == 32 &&
                       in_type == KdaInType::BF16 && (intra == 4 || intra == 5) && (state == 2 || state == 3);
  // The fused kernel where it exists (chunk 32, bf16 inputs); elsewhere the request runs the two-kernel path. A
  // caller that picks a two-kernel knob (intra, state, overlap, v1's tiles) asks for the two kernels (the tests
  // comparing those kernels bitwise); otherwise the environment, else the shape rule.
  const bool two_kernel_knobs = v1_knobs || tuning.intra != 0 || tuning.state != 0 || tuning.overlap != 0;
  const int fused = tuning.fused != 0    ? tuning.fused
                    : fused_env() != 0   ? fused_env()
                    : two_kernel_knobs   ? 1
                                         : fused_rule(n_seqs, H);
  if (fused >= 2 && chunk == 32 && in_type == KdaInType::BF16 && !any_decay) {
    g_tc_calls.fetch_add(1);
    return kda_tc_fused_launch(fused, seqs, n_seqs, H, q, k, v, g, beta, o, chunk_states, stream);
  }
  TcWs ws;
  tc_ws_layout(static_cast<size_t>(n_total_tokens), n_seqs, H, D, chunk, static_cast<char*>(workspace), &ws);
  g_tc_calls.fetch_add(1);
  const int N = n_total_tokens;
  if (overlap)
    return run_tc_overlap(seqs, n_seqs, N, H, q, k, v, g, beta, o, chunk_states, intra, state, ws, workspace, stream);
  return chunk == 64
             ? run_tc<64>(seqs, n_seqs, N, H, in_type, q, k, v, g, beta, o, chunk_states, bv, nbuf, intra, state, ws,
                          workspace, stream)
             : run_tc<32>(seqs, n_seqs, N, H, in_type, q, k, v, g, beta, o, chunk_states, bv, nbuf, intra, state, ws,
                          workspace, stream);
}

}  // namespace k3::cuda
