// The state-step helpers of the chunk-32 KDA state kernel v2 (kda_tc_state2.cu) and of the fused kernel's consumer
// warps (kda_tc_fused.cu): warp w holds S^T for 16 value columns in registers; V~ = U - W S, O = Q S + A_qk V~,
// S = diag(eL) S + K^T V~, all warp-local. One definition for both (same bits by construction).
#pragma once

#include <cstddef>
#include <cstdint>

#include "k3/backend/cuda/kda_tc_common.cuh"

namespace k3::cuda {
namespace {

// Views of one operand buffer.
struct State2Ops {
  const bf16 *W, *Q, *K, *A, *U;
  const float* eL;
};

template <class Cfg>
__device__ __forceinline__ State2Ops state2_ops(const char* b) {
  return State2Ops{reinterpret_cast<const bf16*>(b + Cfg::off_w), reinterpret_cast<const bf16*>(b + Cfg::off_q),
                   reinterpret_cast<const bf16*>(b + Cfg::off_k), reinterpret_cast<const bf16*>(b + Cfg::off_a),
                   reinterpret_cast<const bf16*>(b + Cfg::off_u), reinterpret_cast<const float*>(b + Cfg::off_e)};
}

// Per-lane ldmatrix offsets (elements), fixed for the whole kernel so each ldmatrix is base + constant.
//  offB / offA (plain, W / Q rows of LDB, A_qk rows of LDA): lanes 8m..8m+7 address matrix m = rows
//    (l & 7) + 8 (l >> 4), columns 8 ((l >> 3) & 1): r[0], r[1] = B fragment (k halves) of n-tile 2p,
//    r[2], r[3] of n-tile 2p + 1, for token rows [16 p, 16 p + 16) at + 16 p LD, k-slice j at + 16 j.
//  offU (trans, U rows of LDU): the same row pattern, columns 16 w + 8 ((l >> 3) & 1): r[0], r[1] = C
//    fragment halves (v rows gq, gq + 8) of n-tile 2p of U^T, r[2], r[3] of n-tile 2p + 1.
//  offK (trans, K rows of LDB): rows (l & 15), columns 8 (l >> 4): r[0], r[1] = B fragment (token halves)
//    of k n-tile 2p, r[2], r[3] of n-tile 2p + 1, at + 16 kk LDB + 16 p.
struct State2Lane {
  int gq, tq, offB, offA, offU, offK;
};

template <class Cfg>
__device__ __forceinline__ State2Lane state2_lane(int warp, int lane) {
  const int r = (lane & 7) + 8 * (lane >> 4), c = 8 * ((lane >> 3) & 1);
  return State2Lane{lane >> 2, lane & 3, r * Cfg::LDB + c, r * Cfg::LDA + c, r * Cfg::LDU + 16 * warp + c,
                    (lane & 15) * Cfg::LDB + 8 * (lane >> 4)};
}

// The bf16 A fragment of S^T for key k-slice j: the C fragments of n-tiles 2j, 2j + 1, packed.
__device__ __forceinline__ void state2_sfrag(uint32_t (&a)[4], const float (&st)[16][4], int j) {
  a[0] = pack2(st[2 * j][0], st[2 * j][1]);
  a[1] = pack2(st[2 * j][2], st[2 * j][3]);
  a[2] = pack2(st[2 * j + 1][0], st[2 * j + 1][1]);
  a[3] = pack2(st[2 * j + 1][2], st[2 * j + 1][3]);
}

// V~^T = U^T - S^T W^T and O^T = S^T Q^T: both B tiles against the same bf16 A fragments of S^T (packed
// once), eight independent accumulator chains of 8 k-steps. va receives V~^T as the bf16 A fragments of the
// two token k-slices (the operand of A_qk and of the state update).
template <class Cfg>
__device__ __forceinline__ void state2_vnew(const State2Ops& b, const State2Lane& ln, const float (&st)[16][4],
                                            uint32_t (&va)[2][4], float (&ot)[4][4]) {
  float acc[4][4];
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int m = 0; m < 4; ++m) acc[nt][m] = ot[nt][m] = 0.f;
#pragma unroll
  for (int j = 0; j < kD / 16; ++j) {  // key k-slice [16 j, 16 j + 16)
    uint32_t a[4];
    state2_sfrag(a, st, j);
#pragma unroll
    for (int p = 0; p < 2; ++p) {  // tokens [16 p, 16 p + 16) = n-tiles 2p, 2p + 1
      uint32_t w[4], q[4];
      ldsm_x4(w, b.W + ln.offB + 16 * p * Cfg::LDB + 16 * j);
      ldsm_x4(q, b.Q + ln.offB + 16 * p * Cfg::LDB + 16 * j);
      mma(acc[2 * p], a, w[0], w[1]);
      mma(acc[2 * p + 1], a, w[2], w[3]);
      mma(ot[2 * p], a, q[0], q[1]);
      mma(ot[2 * p + 1], a, q[2], q[3]);
    }
  }
  float vt[4][4];
#pragma unroll
  for (int p = 0; p < 2; ++p) {
    uint32_t u[4];  // U^T in C-fragment layout: u[2 s] v rows gq, u[2 s + 1] rows gq + 8, of n-tile 2p + s
    ldsm_x4_t(u, b.U + ln.offU + 16 * p * Cfg::LDU);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const float2 lo = unpack2(u[2 * s]), hi = unpack2(u[2 * s + 1]);
      const int nt = 2 * p + s;
      vt[nt][0] = lo.x - acc[nt][0];
      vt[nt][1] = lo.y - acc[nt][1];
      vt[nt][2] = hi.x - acc[nt][2];
      vt[nt][3] = hi.y - acc[nt][3];
    }
  }
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {  // C fragments of token n-tiles 2kk, 2kk + 1 = A fragment of k-slice kk
    va[kk][0] = pack2(vt[2 * kk][0], vt[2 * kk][1]);
    va[kk][1] = pack2(vt[2 * kk][2], vt[2 * kk][3]);
    va[kk][2] = pack2(vt[2 * kk + 1][0], vt[2 * kk + 1][1]);
    va[kk][3] = pack2(vt[2 * kk + 1][2], vt[2 * kk + 1][3]);
  }
}

// O^T (= S^T Q^T on entry) += V~^T A_qk^T, then O rows i < Lc to o_w (o at the chunk's first row, the warp's
// first value column). A_qk[i][j] = 0 for j > i (the intra kernel writes the zeros): tokens j >= 16 add
// nothing to rows i < 16, so that k-step is skipped. A store instruction of the warp covers 4 rows x 8
// consecutive columns: whole 32-byte sectors, no staging through shared memory needed.
template <class Cfg>
__device__ __forceinline__ void state2_out(const State2Ops& b, const State2Lane& ln, const uint32_t (&va)[2][4],
                                           float (&ot)[4][4], int Lc, float* __restrict__ o_w, int C) {
  constexpr int LDA = Cfg::LDA;
#pragma unroll
  for (int p = 0; p < 2; ++p)
#pragma unroll
    for (int kk = 0; kk <= p; ++kk) {
      uint32_t a[4];
      ldsm_x4(a, b.A + ln.offA + 16 * p * LDA + 16 * kk);
      mma(ot[2 * p], va[kk], a[0], a[1]);
      mma(ot[2 * p + 1], va[kk], a[2], a[3]);
    }
  const bool full = Lc == Cfg::L;  // uniform: the common case stores without per-row predicates
#pragma unroll
  for (int nt = 0; nt < 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 8 * nt + 2 * ln.tq + (e & 1);
      if (full || i < Lc) o_w[static_cast<size_t>(i) * C + ln.gq + 8 * (e >> 1)] = ot[nt][e];
    }
}

// S^T = S^T diag(eL) + V~^T K: 16 independent accumulator tiles, two k-steps (the chunk's tokens) each.
template <class Cfg>
__device__ __forceinline__ void state2_update(const State2Ops& b, const State2Lane& ln, const uint32_t (&va)[2][4],
                                              float (&st)[16][4]) {
  constexpr int LDB = Cfg::LDB;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {  // st[nt] columns (keys) 8 nt + 2 tq, + 1
    const float2 e = *reinterpret_cast<const float2*>(b.eL + 8 * nt + 2 * ln.tq);
    st[nt][0] *= e.x;
    st[nt][1] *= e.y;
    st[nt][2] *= e.x;
    st[nt][3] *= e.y;
  }
#pragma unroll
  for (int kk = 0; kk < 2; ++kk)
#pragma unroll
    for (int p = 0; p < 8; ++p) {
      uint32_t k[4];
      ldsm_x4_t(k, b.K + ln.offK + 16 * kk * LDB + 16 * p);
      mma(st[2 * p], va[kk], k[0], k[1]);
      mma(st[2 * p + 1], va[kk], k[2], k[3]);
    }
}

// st[nt][e] = S[k = 8 nt + 2 tq + (e & 1)][v = gq + 8 (e >> 1)] of the warp's 16 columns; S_w: the [kD][kD]
// state at the warp's first value column. Loaded (kStore false) or stored; each instruction touches 4 rows x
// 32 bytes.
template <bool kStore>
__device__ __forceinline__ void state2_io(float (&st)[16][4], float* S_w, const State2Lane& ln) {
#pragma unroll
  for (int nt = 0; nt < 16; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float* p = S_w + static_cast<size_t>(8 * nt + 2 * ln.tq + (e & 1)) * kD + ln.gq + 8 * (e >> 1);
      if constexpr (kStore) *p = st[nt][e];
      else st[nt][e] = *p;
    }
}

}  // namespace
}  // namespace k3::cuda
