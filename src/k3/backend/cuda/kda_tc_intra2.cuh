// The intra-chunk helpers of the chunk-32 tensor-core KDA kernels (v2 / v3 in kda_chunked_tc.cu, the fused
// kernel's producer warps in kda_tc_fused.cu): the tile and shared-memory layout, the gate scan, the sub-chunk
// references, the blocked inverse (I + N)^-1 and the small store / copy helpers. One definition for both, so that
// the fused kernel's intra outputs are the two-kernel path's bits by construction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "k3/backend/cuda/kda_tc_common.cuh"

namespace k3::cuda {
namespace {

// ---------------------------------------------------------------------------------------------------
// Intra-chunk kernel v2 (chunk 32; chunk 64 keeps v1): 8 warps per (chunk, head), same outputs and numerics
// class as kda_tc_intra_kernel. v1 spent its time waiting: 2 warps per block issuing their global loads a
// few at a time, a serial per-column cumsum (L-deep shared read-modify-write chains) and a serial L-deep
// forward substitution. Here
//    - every thread issues all 16 of its global loads at once (4 rows x 4 columns of q, k, v, g), so a
//      block has its whole chunk (32-64 KB) in flight;
//    - G = cumsum(g) is a register prefix over the thread's 4 rows plus a 3-step shuffle scan across the
//      8 row groups of the warp (lanes 4 seg + cg), no shared memory;
//    - the operands of the products (q, k scaled around the sub-chunk reference rows 0 and 16) are formed
//      once, elementwise, instead of per mma fragment;
//    - T = (I + N)^-1 diag(beta) blockwise: the two 16 x 16 diagonal inverses by fp32 forward substitution
//      (one warp, a lane per column, 15-deep chains instead of 31), the off-diagonal block
//      M10 = -M11 (N10 M00) as two 16 x 16 x 16 fp32 products with a thread per element.
// Shared memory 52.6 KB, 80 registers (launch bounds: 3 blocks = 24 warps per SM; at 4 blocks the 64-register
// cap spills ~200 bytes in the elementwise phase: the MINB = 4 variant, for A/B).
// Why it should be faster (estimate before measurement): the block's chain is now ~3.5-5 us (prologue
// lookups, one load round trip, 4 shuffle steps, ~80 exponentials per thread, 8-deep mma chains, a 15-deep
// substitution, five barriers) and 3 blocks share an SM, against ~2 us of HBM time per (chunk, head) at an
// SM's share of bandwidth (66 KB moved with bf16 inputs): near the byte floor. v1 took ~26 us per block
// (0.40 ms over 15.5 waves of 4 two-warp blocks per SM at 1 x 8192 x 32).
struct Intra2Cfg {
  static constexpr int L = 32, NT = 256, LDB = kD + 8, LDK = L + 4, LDX = 17, LDT = L + 8;
  static constexpr size_t plane = static_cast<size_t>(L) * LDB * sizeof(bf16);
  // bf16 [rows][LDB]: KE = exp(G) k, Vb = v, Ql / Kl = q / k times exp(G_i - G_ref(i)) (ref = row 0 for rows
  // < 16, row 16 after), Kr = k_j exp(G_ref - G_j): rows [0, 16) for ref 0 (j < 16), rows [16, 48) for ref 16
  // (j < 32). Ak fp32 [L][LDK], beta fp32 [L].
  static constexpr size_t off_ke = 0, off_v = plane, off_ql = 2 * plane, off_kl = 3 * plane, off_kr = 4 * plane;
  static constexpr size_t off_ak = off_kr + static_cast<size_t>(48) * LDB * sizeof(bf16);
  static constexpr size_t off_bs = off_ak + static_cast<size_t>(L) * LDK * sizeof(float);
  static constexpr size_t bytes = off_bs + L * sizeof(float);
  // Once the products are done (Ql, Kl dead): diagonal inverses Mi fp32 [L][LDK], X = N10 M00 fp32 [16][LDX],
  // T bf16 [L][LDT].
  static constexpr size_t off_mi = off_ql, off_xs = off_mi + static_cast<size_t>(L) * LDK * sizeof(float);
  static constexpr size_t off_ts = off_xs + static_cast<size_t>(16) * LDX * sizeof(float);
  static_assert(off_ts + static_cast<size_t>(L) * LDT * sizeof(bf16) <= off_kr, "inverse scratch fits in Ql, Kl");
  static_assert(plane % 16 == 0 && off_ak % 16 == 0 && off_ts % 16 == 0, "ldmatrix / float4 alignment");
};

// The thread's 4 x 4 tile of the chunk: rows [r0, r0 + 4), head columns [d, d + 4); q, k, v rounded to bf16
// once (as v1 stages them), g in fp32 (G after intra2_scan). Rows >= Lc are zero (g = 0 adds nothing to G).
struct Intra2Tile {
  float G[4][4];
  uint32_t q[4][2], k[4][2], v[4][2];
};

// load4's conversion (kda_tc_common.cuh) applied to an already loaded vector: the same operations, so the tile
// is bit-identical whether the conversion follows the load at once (v2) or a work item later (v3).
__device__ __forceinline__ float4 raw_to4(float4 x) { return x; }

__device__ __forceinline__ float4 raw_to4(uint2 u) {
  const float2 a = unpack2(u.x), b = unpack2(u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

// G = inclusive cumsum over the chunk's rows: lane = 4 seg + cg holds rows [4 seg, 4 seg + 4) of the same 4
// columns as lanes cg, 4 + cg, ...; local prefix, then a Hillis-Steele scan of the row-group totals over
// seg (shuffle distances 4, 8, 16 lanes), then the exclusive part added back.
__device__ __forceinline__ void intra2_scan(float (&G)[4][4], int lane) {
#pragma unroll
  for (int u = 1; u < 4; ++u)
#pragma unroll
    for (int c = 0; c < 4; ++c) G[u][c] += G[u - 1][c];
  float incl[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) incl[c] = G[3][c];
#pragma unroll
  for (int off = 4; off < 32; off *= 2)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float y = __shfl_up_sync(0xffffffffu, incl[c], off);
      if (lane >= off) incl[c] += y;
    }
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float y = __shfl_up_sync(0xffffffffu, incl[c], 4);  // the previous row groups' total
    const float ex = lane >= 4 ? y : 0.f;
#pragma unroll
    for (int u = 0; u < 4; ++u) G[u][c] += ex;
  }
}

// x (4 bf16) times e, rounded to bf16 again (v1's double rounding: bf16 input, then the scaled operand).
__device__ __forceinline__ uint2 scale4(const uint32_t (&x)[2], const float (&e)[4]) {
  const float2 a = unpack2(x[0]), b = unpack2(x[1]);
  return make_uint2(pack2(a.x * e[0], a.y * e[1]), pack2(b.x * e[2], b.y * e[3]));
}

__device__ __forceinline__ void st8(bf16* p, uint2 v) { *reinterpret_cast<uint2*>(p) = v; }

// A store of a kernel output to the workspace: plain (CS = false: v2, v3's default) or streaming (st.global.cs,
// evict-first: the state kernel reads each output once, later; v3's A/B variant KdaTcTuning::intra = 5).
template <bool CS, class V>
__device__ __forceinline__ void st_out(void* p, V v) {
  if constexpr (CS) __stcs(reinterpret_cast<V*>(p), v);
  else *reinterpret_cast<V*>(p) = v;
}

// Reference values of G for the thread's columns: rows 0 and 16 (the sub-chunk references) and row L - 1
// (= row Lc - 1: padded rows add 0).
struct Intra2Refs {
  float g0[4], g16[4], gl[4];
};

__device__ __forceinline__ Intra2Refs intra2_refs(const float (&G)[4][4], int cg) {
  Intra2Refs r;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    r.g0[c] = __shfl_sync(0xffffffffu, G[0][c], cg);        // seg 0, its row 0
    r.g16[c] = __shfl_sync(0xffffffffu, G[0][c], 16 + cg);  // seg 4, its row 0
    r.gl[c] = __shfl_sync(0xffffffffu, G[3][c], 28 + cg);   // seg 7, its row 3
  }
  return r;
}

// Diagonal 16 x 16 blocks of (I + N)^-1, N = Ak strictly lower: warp 0, lane 16 blk + c solves column c of
// block blk by forward substitution (fp32, two partial sums per row to halve the chain), to Mi.
__device__ __forceinline__ void intra2_diag_inverse(const float* Ak, float* Mi, int tid = threadIdx.x) {
  using Cfg = Intra2Cfg;
  if (tid >= 32) return;
  const int lane = tid, c = lane & 15, o = 16 * (lane >> 4);
  float m[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    float a0 = i == c ? 1.f : 0.f, a1 = 0.f;
#pragma unroll
    for (int j4 = 0; 4 * j4 < i; ++j4) {
      const float4 a = *reinterpret_cast<const float4*>(Ak + (o + i) * Cfg::LDK + o + 4 * j4);
      a0 = fmaf(-a.x, m[4 * j4], a0);
      if (4 * j4 + 1 < i) a1 = fmaf(-a.y, m[4 * j4 + 1], a1);
      if (4 * j4 + 2 < i) a0 = fmaf(-a.z, m[4 * j4 + 2], a0);
      if (4 * j4 + 3 < i) a1 = fmaf(-a.w, m[4 * j4 + 3], a1);
    }
    m[i] = a0 + a1;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) Mi[(o + i) * Cfg::LDK + o + c] = m[i];
}

// X = N10 M00 (rows 16.., columns ..16 of N times the first diagonal inverse), thread = element (i, j).
__device__ __forceinline__ void intra2_offdiag_x(const float* Ak, const float* Mi, float* Xs, int tid = threadIdx.x) {
  using Cfg = Intra2Cfg;
  const int i = tid >> 4, j = tid & 15;
  float x = 0.f;
#pragma unroll
  for (int k = 0; k < 16; ++k) x = fmaf(Ak[(16 + i) * Cfg::LDK + k], Mi[k * Cfg::LDK + j], x);
  Xs[i * Cfg::LDX + j] = x;
}

// T = (I + N)^-1 diag(beta) to Ts (bf16), thread = (i, j) of each 16 x 16 block: M10 = -M11 X, the
// diagonal blocks from Mi, zeros above.
__device__ __forceinline__ void intra2_write_t(const float* Mi, const float* Xs, const float* bs, bf16* Ts,
                                               int tid = threadIdx.x) {
  using Cfg = Intra2Cfg;
  constexpr int LDK = Cfg::LDK, LDT = Cfg::LDT;
  const int i = tid >> 4, j = tid & 15;
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < 16; ++k) m = fmaf(Mi[(16 + i) * LDK + 16 + k], Xs[k * Cfg::LDX + j], m);
  Ts[(16 + i) * LDT + j] = __float2bfloat16_rn(-m * bs[j]);
  Ts[i * LDT + j] = __float2bfloat16_rn(Mi[i * LDK + j] * bs[j]);
  Ts[(16 + i) * LDT + 16 + j] = __float2bfloat16_rn(Mi[(16 + i) * LDK + 16 + j] * bs[16 + j]);
  Ts[i * LDT + 16 + j] = __float2bfloat16_rn(0.f);
}

// Byte offset of 16-byte chunk c (8 columns) of row r in a stage plane.
__device__ __forceinline__ int intra3_stage_off(int r, int c) { return r * 256 + 16 * (c ^ (2 * ((r >> 2) & 3))); }

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(valid ? 4 : 0));  // src-size 0: zero-filled
}

// threadIdx.x through an asm the compiler cannot hoist out of v3's item loop: otherwise it computes the
// lane-dependent constants of every phase once (v2's diagonal inverse alone has 16 predicates i == c), keeps them
// live across the loop and spills them at the 80-register cap; re-deriving them is a few integer operations.
__device__ __forceinline__ int tid_fresh() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
}


// __expf as a functor (intra2_elementwise_to's exponentials; the fused kernel's variants pass an ftz form).
struct ExpFast {
  __device__ __forceinline__ float operator()(float x) const { return __expf(x); }
};

// Any-decay variant (kExact; KdaDecays::Any): the diagonal 16 x 16 blocks of A_kk and A_qk are not factored around the
// sub-chunk's first row (the right factor exp(G_ref - G_j) overflows once a channel decays by more than ~88 over 15
// rows, which an unbounded gate allows) but summed exactly, q_i k_j exp(G_i - G_j) per channel (intra2_exact_diag, after
// elementwise), with exp(G_i - G_j) formed as the running product of the per-row factors exp(g_t) = exp(G_t - G_t-1)
// <= 1 from t = i down to j + 1 (never out of range; an underflow to 0 is the true value's size). Every other operand
// is a product of factors <= 1 for any decay (off-diagonal blocks factor around row 16 from both sides; exp(G),
// exp(G_last - G) <= 1), so they stay as they are. The exact sums read exp(g) (fp32) from the extension region and the
// raw bf16 q / k rows from the slots the factored diagonal products would have used: q rows [0, 16) in Ql rows [0, 16),
// q rows [16, 32) in Kl rows [0, 16), k rows [0, 16) in Kr rows [0, 16), k rows [16, 32) in Kr rows [32, 48). Ql / Kl
// rows [16, 32) and Kr rows [16, 32) (the off-diagonal block's operands) are as before.
struct IntraExactCfg {
  static constexpr int LDA = kD + 4, LDE = 17;  // rows 16 bytes apart modulo the banks (the elementwise float4 stores)
  static constexpr size_t off_a = Intra2Cfg::bytes;  // exp(g) fp32 [32][LDA]
  static constexpr size_t off_eq = off_a + static_cast<size_t>(Intra2Cfg::L) * LDA * sizeof(float);
  static constexpr size_t bytes = off_eq + static_cast<size_t>(Intra2Cfg::L) * LDE * sizeof(float);  // + A_qk diag
  static_assert(off_a % 16 == 0 && off_eq % 16 == 0, "float4 alignment");
};

// The elementwise operands of the thread's 4 rows: v to Vb and exp(G) k to KE (rows of LDB), the sub-chunk operands
// Ql, Kl, Kr to shared memory, and Q exp(G) / exp(G_last - G) k handed to out(i, qg, kd) for row i -- the two-kernel
// path's workspace rows, the fused kernel's ring rows. ExpGD forms exp(G) and exp(G_last - G), ExpRef the sub-chunk
// exponentials. exp(G_ref - G_j) > 1 only inside row j's own sub-chunk (at most exp(15 * 5.5)); the clamp at 88 keeps
// it finite for gates below the precondition. kExact: the any-decay layout above (IntraExactCfg).
template <class ExpGD, class ExpRef, bool kExact = false, class Out>
__device__ __forceinline__ void intra2_elementwise_to(const Intra2Tile& t, const Intra2Refs& rf, int r0, int d, char* sp,
                                                      bf16* KE, bf16* Vb, Out&& out) {
  using Cfg = Intra2Cfg;
  const ExpGD exp_gd;
  const ExpRef exp_ref;
  bf16* Ql = reinterpret_cast<bf16*>(sp + Cfg::off_ql);
  bf16* Kl = reinterpret_cast<bf16*>(sp + Cfg::off_kl);
  bf16* Kr = reinterpret_cast<bf16*>(sp + Cfg::off_kr);
  const bool first = r0 < 16;  // the thread's rows lie in sub-chunk 0 (all 4 of them: r0 is a multiple of 4)
#pragma unroll
  for (int u = 0; u < 4; ++u)  // v first: its registers are free for the exponentials below
    st8(Vb + (r0 + u) * Cfg::LDB + d, make_uint2(t.v[u][0], t.v[u][1]));
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int i = r0 + u;
    float eG[4], eD[4], eA[4], e16[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const float G = t.G[u][c];
      eG[c] = exp_gd(G);
      eD[c] = exp_gd(rf.gl[c] - G);
      eA[c] = exp_ref(G - (first ? rf.g0[c] : rf.g16[c]));
      e16[c] = exp_ref(fminf(rf.g16[c] - G, 88.f));
    }
    const int o = i * Cfg::LDB + d;
    st8(KE + o, scale4(t.k[u], eG));
    if constexpr (kExact) {
      const uint2 qraw = make_uint2(t.q[u][0], t.q[u][1]), kraw = make_uint2(t.k[u][0], t.k[u][1]);
      float a[4];  // exp(g_i) = exp(G_i - G_i-1); row i - 1 of u = 0 is lane - 4's last row (none before row 0)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float up = __shfl_up_sync(0xffffffffu, t.G[3][c], 4);
        const float prev = u > 0 ? t.G[u > 0 ? u - 1 : 0][c] : (r0 > 0 ? up : 0.f);
        a[c] = exp_ref(t.G[u][c] - prev);
      }
      *reinterpret_cast<float4*>(sp + IntraExactCfg::off_a + (static_cast<size_t>(i) * IntraExactCfg::LDA + d) * 4) =
          make_float4(a[0], a[1], a[2], a[3]);
      if (first) {
        st8(Ql + o, qraw);
        st8(Kr + o, kraw);
        st8(Kr + 16 * Cfg::LDB + o, scale4(t.k[u], e16));  // exp(G_16 - G_j) <= 1 for j < 16
      } else {
        st8(Ql + o, scale4(t.q[u], eA));
        st8(Kl + o, scale4(t.k[u], eA));
        st8(Kl + o - 16 * Cfg::LDB, qraw);
        st8(Kr + 16 * Cfg::LDB + o, kraw);
      }
    } else {
      st8(Ql + o, scale4(t.q[u], eA));
      st8(Kl + o, scale4(t.k[u], eA));
      st8(Kr + 16 * Cfg::LDB + o, scale4(t.k[u], e16));
      if (first) {  // reference row 0: exp(G_0 - G_j) <= 1
        float e0[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) e0[c] = exp_ref(rf.g0[c] - t.G[u][c]);
        st8(Kr + o, scale4(t.k[u], e0));
      }
    }
    out(i, scale4(t.q[u], eG), scale4(t.k[u], eD));
  }
}

// Sum of each x[k] over the warp's 32 lanes, scattered: lane l returns the total of x[l] (a halving exchange per step:
// 16 + 8 + 4 + 2 + 1 shuffles instead of 32 x 5 for 32 separate reductions).
template <int kHalf>
__device__ __forceinline__ void reduce_scatter_step(float (&x)[32], int lane) {
  const bool hi = (lane & kHalf) != 0;
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const float keep = hi ? x[k + kHalf] : x[k], send = hi ? x[k] : x[k + kHalf];
    x[k] = keep + __shfl_xor_sync(0xffffffffu, send, kHalf);
  }
}
__device__ __forceinline__ float warp_reduce_scatter32(float (&x)[32], int lane) {
  reduce_scatter_step<16>(x, lane);
  reduce_scatter_step<8>(x, lane);
  reduce_scatter_step<4>(x, lane);
  reduce_scatter_step<2>(x, lane);
  reduce_scatter_step<1>(x, lane);
  return x[0];
}

// The exact diagonal blocks (kExact; after a barrier that follows intra2_elementwise_to<..., true>): warp w takes rows
// w, 15 - w (sub-chunk 0) and 16 + w, 31 - w (sub-chunk 1) -- 30 pairs a warp --, lane l channels [4 l, 4 l + 4). For
// row i it walks j = i - 1 down to the sub-chunk's first row with e = exp(G_i - G_j) per channel as the running product
// of exp(g_j+1), accumulating the lane's parts of
//   A_qk[i][j] = sum q_i k_j exp(G_i - G_j),   A_kk[i][j] = sum k_i k_j exp(G_i - G_j)
// (and A_qk[i][i] = q_i . k_i), then one reduce-scatter over the lanes: lane jo < 16 stores A_qk[i][jo] (jo <= i) to
// the extension's plane (read by intra2_products_to<true>), lane 16 + jo beta_i A_kk[i][jo] (jo < i) to Ak (only its
// strictly lower part is read). fp32 throughout, from the raw bf16 q / k.
__device__ __forceinline__ void intra2_exact_diag(const char* sp, float* Ak, int tid) {
  using Cfg = Intra2Cfg;
  using X = IntraExactCfg;
  constexpr int LDB = Cfg::LDB;
  const int w = tid / 32, lane = tid % 32, c0 = 4 * lane;
  const bf16* Ql = reinterpret_cast<const bf16*>(sp + Cfg::off_ql);
  const bf16* Kl = reinterpret_cast<const bf16*>(sp + Cfg::off_kl);
  const bf16* Kr = reinterpret_cast<const bf16*>(sp + Cfg::off_kr);
  const float* Ae = reinterpret_cast<const float*>(sp + X::off_a);
  const float* bs = reinterpret_cast<const float*>(sp + Cfg::off_bs);
  float* Eq = reinterpret_cast<float*>(const_cast<char*>(sp) + X::off_eq);
  auto ld4 = [](const bf16* p) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = unpack2(u.x), b = unpack2(u.y);
    return make_float4(a.x, a.y, b.x, b.y);
  };
#pragma unroll 1
  for (int rr = 0; rr < 4; ++rr) {
    const int s = rr >> 1, io = (rr & 1) ? 15 - w : w, I = 16 * s + io;  // io: row within the sub-chunk
    const float4 q = ld4((s ? Kl + io * LDB : Ql + I * LDB) + c0), k = ld4(Kr + (32 * s + io) * LDB + c0);
    float x[32];  // x[jo]: A_qk[i][16 s + jo], x[16 + jo]: A_kk[i][16 s + jo], this lane's channels
    float4 e = make_float4(1.f, 1.f, 1.f, 1.f);
#pragma unroll
    for (int jo = 15; jo >= 0; --jo) {
      x[jo] = 0.f;
      x[16 + jo] = 0.f;
      if (jo == io) {
        x[jo] = q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
      } else if (jo < io) {
        const float4 a = *reinterpret_cast<const float4*>(Ae + (16 * s + jo + 1) * X::LDA + c0);
        e = make_float4(e.x * a.x, e.y * a.y, e.z * a.z, e.w * a.w);
        const float4 kj = ld4(Kr + (32 * s + jo) * LDB + c0);
        const float4 t = make_float4(kj.x * e.x, kj.y * e.y, kj.z * e.z, kj.w * e.w);
        x[jo] = q.x * t.x + q.y * t.y + q.z * t.z + q.w * t.w;
        x[16 + jo] = k.x * t.x + k.y * t.y + k.z * t.z + k.w * t.w;
      }
    }
    const float r = warp_reduce_scatter32(x, lane);
    const int jo = lane & 15;
    if (lane < 16) {
      if (jo <= io) Eq[I * X::LDE + jo] = r;
    } else if (jo < io) {
      Ak[I * Cfg::LDK + 16 * s + jo] = bs[I] * r;
    }
  }
}

// A_kk (times beta_i, strictly lower, fp32 to Ak) and A_qk (lower with the diagonal, bf16, zeros above): the
// A_qk pair (i, j), (i, j + 1) goes to store_aqk(i, j, x0, x1, zero_block) for the caller's destination, which
// stores pack2(j <= i ? x0 : 0, j + 1 <= i ? x1 : 0) and, when zero_block (job 0), zeros at j + 16 (the block above
// the diagonal). Warp w: kind w / 4 (0: A_kk from Kl, 1: A_qk from Ql); job w % 4 = the 16 x 16 tile (row tile,
// key tile) (0, 0), (1, 0), (1, 1); job 3 idles. Key tile jt of row tile rt reads Kr rows 16 rt + 16 jt (the
// reference of rt).
// kExact: the diagonal blocks (jobs 0, 2) come from intra2_exact_diag (A_kk already in Ak; A_qk from the extension's
// plane, through the same stores), only job 1 runs on tensor cores.
template <bool kExact = false, class StoreAqk>
__device__ __forceinline__ void intra2_products_to(const char* sp, float* Ak, StoreAqk&& store_aqk, int tid) {
  using Cfg = Intra2Cfg;
  constexpr int LDB = Cfg::LDB;
  const int w = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const int kind = w >> 2, job = w & 3;
  if (job == 3) return;
  const int rt = job == 0 ? 0 : 1, jt = job == 2 ? 1 : 0;
  if constexpr (kExact) {
    if (job != 1) {
      if (kind == 0) return;
      const float* Eq = reinterpret_cast<const float*>(sp + IntraExactCfg::off_eq);
#pragma unroll
      for (int n = 0; n < 2; ++n)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int i = 16 * rt + gq + 8 * half, jl = 8 * n + 2 * tq;  // jl: column within the diagonal block
          store_aqk(i, 16 * jt + jl, Eq[i * IntraExactCfg::LDE + jl], Eq[i * IntraExactCfg::LDE + jl + 1], job == 0);
        }
      return;
    }
  }
  const bf16* A = reinterpret_cast<const bf16*>(sp + (kind ? Cfg::off_ql : Cfg::off_kl)) + 16 * rt * LDB;
  const bf16* B = reinterpret_cast<const bf16*>(sp + Cfg::off_kr) + (16 * rt + 16 * jt) * LDB;
  float acc[2][4];
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[n][m] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    uint32_t a[4], b[4];
    ldsm_x4(a, A + (lane & 15) * LDB + 16 * kk + 8 * (lane >> 4));
    // B^T stored row-major ([key row][d]): non-transposed ldmatrix; b[0], b[1] key rows +0..7, b[2], b[3] +8..15
    ldsm_x4(b, B + ((lane & 7) + 8 * (lane >> 4)) * LDB + 16 * kk + 8 * ((lane >> 3) & 1));
    mma(acc[0], a, b[0], b[1]);
    mma(acc[1], a, b[2], b[3]);
  }
  const float* bs = reinterpret_cast<const float*>(sp + Cfg::off_bs);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * rt + gq + 8 * half, j = 16 * jt + 8 * n + 2 * tq;
      const float x0 = acc[n][2 * half], x1 = acc[n][2 * half + 1];
      if (kind == 0) {
        const float bi = bs[i];
        *reinterpret_cast<float2*>(Ak + i * Cfg::LDK + j) =
            make_float2(j < i ? bi * x0 : 0.f, j + 1 < i ? bi * x1 : 0.f);
      } else {
        store_aqk(i, j, x0, x1, job == 0);
      }
    }
}

// W = T KE and U = T Vb: warp w = (kind w / 4: W or U, row tile (w / 2) % 2, value half w % 2); rows of T
// past the row tile are zero, so k-steps kk <= rt only. NP: the warp's 64 columns in NP passes of 64 / NP (v2: 1;
// v3 and the fused kernel: 2, half the accumulators live: v3's loop state has to fit 80 registers). Every output
// element sees the same mma sequence either way (the same A and B fragments, k-steps in order), so the results do
// not depend on NP. The caller's destination: row i of W (U) starts at row_at(dstW (dstU), i) for the rows with
// row_ok(i); each bf16 pair goes through store(pointer, packed pair).
template <int NP, class RowOk, class RowAt, class Store>
__device__ __forceinline__ void intra2_apply_to(const char* sp, const bf16* Ts, bf16* dstW, bf16* dstU, RowOk&& row_ok,
                                                RowAt&& row_at, Store&& store, int tid) {
  using Cfg = Intra2Cfg;
  constexpr int LDB = Cfg::LDB, LDT = Cfg::LDT;
  const int w = tid / 32, lane = tid % 32, gq = lane / 4, tq = lane % 4;
  const int kind = w >> 2, rt = (w >> 1) & 1, c0 = 64 * (w & 1);
  const bf16* B = reinterpret_cast<const bf16*>(sp + (kind ? Cfg::off_v : Cfg::off_ke));
  bf16* dst = kind ? dstU : dstW;
  constexpr int NTP = 8 / NP;  // n-tiles of 8 columns per pass
#pragma unroll
  for (int pass = 0; pass < NP; ++pass) {
    const int cp = c0 + 8 * NTP * pass;  // the pass's first column
    float acc[NTP][4];
#pragma unroll
    for (int nt = 0; nt < NTP; ++nt)
#pragma unroll
      for (int m = 0; m < 4; ++m) acc[nt][m] = 0.f;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      if (kk <= rt) {
        uint32_t a[4];
        ldsm_x4(a, Ts + (16 * rt + (lane & 15)) * LDT + 16 * kk + 8 * (lane >> 4));
#pragma unroll
        for (int p = 0; p < NTP / 2; ++p) {
          uint32_t b[4];
          ldsm_x4_t(b, B + (16 * kk + (lane & 15)) * LDB + cp + 16 * p + 8 * (lane >> 4));
          mma(acc[2 * p], a, b[0], b[1]);
          mma(acc[2 * p + 1], a, b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = 16 * rt + gq + 8 * half;
      if (row_ok(i)) {
        bf16* row = row_at(dst, i) + cp + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < NTP; ++nt) store(row + 8 * nt, pack2(acc[nt][2 * half], acc[nt][2 * half + 1]));
      }
    }
  }
}

// One plane of a chunk (a head's 128 columns of rows [0, 32) from p0, rows C apart) into a stage laid out by
// intra3_stage_off: 512 16-byte chunks, two per thread of 256; rows >= Lc zero-filled (their source address clamped
// to row 0, which every chunk has).
__device__ __forceinline__ void intra3_copy_rows(char* dst, const bf16* __restrict__ p0, int Lc, int C, int tid) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int e = tid + Intra2Cfg::NT * j, r = e >> 4, c = e & 15;
    const bool ok = r < Lc;
    cp_async16(dst + intra3_stage_off(r, c), p0 + static_cast<size_t>(ok ? r : 0) * C + 8 * c, ok);
  }
}

}  // namespace
}  // namespace k3::cuda
