// The MoE experts as GEMV kernels, for decode batches of a few (token, expert) pairs (MoePath::Gemv).
//
// Why: at batch 1 the tile paths spend ~4 launches per layer (plan, gate/up tiles, down tiles, combine) and
// reach ~2 TB/s on the experts' bytes (ncu, docs/perf/cuda.md "Session 13"): the tiles sort pairs by
// expert so that a tile shares its expert's weights between tokens, which a pair or two per expert cannot
// use. Here every pair is a plain matrix-vector product, rows spread over warps like the dense GEMV
// (linear.cu), no sorting and no K-split partials:
//   1. gate/up: one warp per (pair, row i): the gate and up rows' dots with the pair's token, the GLU in the
//      warp, h[p][i] written (p = t * K + k, the pair's own index);
//   2. down + combine: the rows' dots of each pair, summed per token in rank order k = 0..K-1 (out = sum_k w_k *
//      d_k, fmaf from 0, the combine of moe_decode.cu), so that the result does not depend on the schedule. bf16:
//      a warp per 4 rows of one pair (blocks pair-major) then a combine launch (the pairs form, by default), or a
//      block per (token, 4 output rows) whose warps take the (row, k) dots and sum them (the items form). An
//      invalid expert id (outside [0, E)) adds nothing.
// fp32 activations and accumulation; bf16 weights widened exactly, MXFP4 decoded exactly (E2M1 x 2^-14 in
// fp16, the group's dot scaled once by 2^(s-127) x 2^14). The CPU reference: cpu moe_layer. bf16 rows take a
// warp each; MXFP4 rows a quad of lanes (so that a warp's rows share their activation loads, below).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "k3/backend/cuda/bf16_dot.cuh"
#include "k3/backend/cuda/env_flag.h"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_gemv.h"
#include "k3/backend/cuda/mxfp4_decode.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;          // warps per block, both kernels
constexpr int kDownRows = 4;       // output rows per block of the down kernel
constexpr int kMaxPairK = 32;      // K bound (MoeWorkspace checks K <= 32)

// Where the bf16 gate/up kernel stores h[i] when the down kernel reads it permuted (I % 256 == 0; lane_dots2_bf16's
// kPermX): within each 256-value chunk, value 8l + r (r < 4) at 4l + r, value 8l + 4 + r at 128 + 4l + r.
__device__ __forceinline__ int h_perm(int i) { return (i & ~255) | ((i & 4) << 5) | (((i >> 3) & 31) << 2) | (i & 3); }

// K3_MOE_HPERM=0 keeps h in column order (the A/B arm of call s48-1); force_moe_h_perm_for_testing overrides.
EnvFlag g_h_perm{"K3_MOE_HPERM"};
bool h_perm_enabled() { return g_h_perm.on(); }

// The bf16 down kernel's form (MoeDownForm): K3_MOE_DOWN=items, else pairs; force_moe_down_form_for_testing
// overrides.
std::atomic<int> g_down_forced{-1};
MoeDownForm down_form() {
  static const MoeDownForm env_form = [] {
    const char* v = std::getenv("K3_MOE_DOWN");
    const std::string s = v ? v : "";
    return s == "items" ? MoeDownForm::Items : MoeDownForm::Pairs;
  }();
  const int f = g_down_forced.load(std::memory_order_relaxed);
  return f < 0 ? env_form : static_cast<MoeDownForm>(f);
}

// A lane's shares of two bf16 rows' dots (`cols` columns, lane l takes columns 8l, 8l + 256, ...: 16 bytes a step)
// with their activations xa and xb (the same pointer for gate / up). Each batch of kB steps issues all of its loads,
// weights and activations, before the first multiply (bf16_dot.cuh: call s42-1 found one to two loads in flight);
// addresses are clamped into the row so that the loads are unconditional. Each row's fmaf chain runs in column
// order, the bits of the one-row loop this replaced. A row with valid false is not multiplied (its acc stays).
// kPermX: the activations are stored in h_perm's order (cols % 256 == 0), so that a lane's 8 values are two float4
// that the warp reads as two contiguous 512-byte runs (in column order a lane's two float4 sit 32 bytes apart and
// each load instruction touches twice the sectors it uses: 40% of the down kernel's sectors, ncu s47-3).
template <int kB, bool kPermX = false>
__device__ __forceinline__ void lane_dots2_bf16(const uint16_t* __restrict__ ra, const float* __restrict__ xa, bool va,
                                                const uint16_t* __restrict__ rb, const float* __restrict__ xb, bool vb,
                                                int cols, int lane, float& acc_a, float& acc_b) {
  const bool same_x = xa == xb;
  for (int base = 0; base < cols; base += 256 * kB) {  // warp-uniform batches
    const int c0 = base + lane * 8;
    uint4 wa[kB], wb[kB];
    float4 a0[kB], a1[kB], b0[kB], b1[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int c = c0 + 256 * j, cc = c < cols ? c : cols - 8;
      wa[j] = ld_weights16(ra + cc);
      wb[j] = ld_weights16(rb + cc);
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int c = c0 + 256 * j, cc = c < cols ? c : cols - 8;
      // kPermX: chunk base + 256 j's values 8l..8l+3 stored at 4l, 8l+4..8l+7 at 128 + 4l (h_perm)
      const int cb = base + 256 * j < cols ? base + 256 * j : cols - 256;
      const int o0 = kPermX ? cb + 4 * lane : cc, o1 = kPermX ? cb + 128 + 4 * lane : cc + 4;
      a0[j] = ld_acts16(xa + o0);
      a1[j] = ld_acts16(xa + o1);
      if (!same_x) {
        b0[j] = ld_acts16(xb + o0);
        b1[j] = ld_acts16(xb + o1);
      }
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      if (c0 + 256 * j >= cols) continue;
      if (va) acc_a = fma8_bf16(wa[j], a0[j], a1[j], acc_a);
      if (vb) acc_b = same_x ? fma8_bf16(wb[j], a0[j], a1[j], acc_b) : fma8_bf16(wb[j], b0[j], b1[j], acc_b);
    }
  }
}

// bf16 rows: a warp per row (16 bytes of weights against 32 of activations per lane and step).
// Threads 0..rows-1 of the block: out[t][r0 + thread] = sum over k in rank order of w_k * d[thread][k] (fmaf
// from 0, as moe_combine), pairs with an invalid id skipped.
// With `shared`, d[thread][K] is the shared expert's row, added last (the graph's `out += shared`).
// The token's output for one row: sum over k in rank order of w_k * d(k) (fmaf from 0, pairs with an invalid expert id
// skipped), + d(K) with the shared expert. Every form's combine runs this, so that they give the same bits.
template <class ExpertOf, class DotOf>
__device__ __forceinline__ float rank_order_sum(const ExpertBank& w, int K, ExpertOf e_of, const float* __restrict__ wt,
                                                DotOf d_of, bool shared) {
  float acc = 0.f;
  for (int k = 0; k < K; ++k) {
    const int e = e_of(k);
    if (e < 0 || e >= w.E) continue;
    acc = fmaf(wt[k], d_of(k), acc);
  }
  return shared ? acc + d_of(K) : acc;
}

__device__ __forceinline__ void combine_rows(const ExpertBank& w, int K, int rows, const float (*d)[kMaxPairK + 1],
                                             const int* e_of, const float* __restrict__ topk_w, int t, int r0,
                                             float* __restrict__ out, bool shared = false) {
  if (threadIdx.x >= static_cast<unsigned>(rows) || r0 + static_cast<int>(threadIdx.x) >= w.X) return;
  const float* drow = d[threadIdx.x];
  out[static_cast<int64_t>(t) * w.X + r0 + threadIdx.x] = rank_order_sum(
      w, K, [&](int k) { return e_of[k]; }, topk_w + static_cast<int64_t>(t) * K, [&](int k) { return drow[k]; }, shared);
}

// grid (ceil(I / kWarps), P [+ n]): warp -> row i of pair blockIdx.y; pairs from `routed` on (when sh.gate is set)
// are token (p - routed)'s shared expert. h [P (+ n)][I].
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gate_up_kernel(const ExpertBank w, int K, const float* __restrict__ x, const int32_t* __restrict__ topk_idx,
                        GluAct act, float beta, float lbeta, float* __restrict__ h, SharedGluBf16 sh, int routed,
                        bool perm) {
  pdl::begin();
  const int lane = threadIdx.x & 31, p = blockIdx.y;
  const int i = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (i >= w.I) return;
  const bool shared = p >= routed;
  const int e = shared ? 0 : topk_idx[p];
  float* hp = h + static_cast<int64_t>(p) * w.I;
  const int hi = perm ? h_perm(i) : i;
  if (e < 0 || e >= w.E) {  // nothing routed here: the down kernel skips the pair, h stays defined anyway
    if (lane == 0) hp[hi] = 0.f;
    return;
  }
  const float* xt = x + static_cast<int64_t>(shared ? p - routed : p / K) * w.X;
  const int64_t row = shared ? i : static_cast<int64_t>(e) * w.I + i;
  const uint16_t* gate = shared ? sh.gate : static_cast<const uint16_t*>(w.gate);
  const uint16_t* up = shared ? sh.up : static_cast<const uint16_t*>(w.up);
  float acc[2] = {0.f, 0.f};
  lane_dots2_bf16<5>(gate + row * w.X, xt, true, up + row * w.X, xt, true, w.X, lane, acc[0], acc[1]);
  const float g = warp_sum(acc[0]), u = warp_sum(acc[1]);
  if (lane == 0) hp[hi] = moe_dev::glu(g, u, act, beta, lbeta);
}

// grid (ceil(X / kDownRows), n): the block's warps take the (row, k) dots -- k = K the shared expert when sh.down is
// set (its h rows after the routed pairs') -- then sum them; out [n][X] overwritten. kPerm: h in h_perm's order.
template <bool kPerm>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_kernel(const ExpertBank w, int K, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                     const float* __restrict__ topk_w, float* __restrict__ out, SharedGluBf16 sh, int routed) {
  pdl::begin();
  __shared__ float s_d[kDownRows][kMaxPairK + 1];
  __shared__ int s_e[kMaxPairK + 1];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.y;
  const int r0 = blockIdx.x * kDownRows;
  const bool has_shared = sh.down != nullptr;
  const int KI = K + (has_shared ? 1 : 0);  // items a row: the routed pairs, then the shared expert
  if (threadIdx.x < K) s_e[threadIdx.x] = topk_idx[static_cast<int64_t>(t) * K + threadIdx.x];
  if (threadIdx.x == K) s_e[K] = 0;  // the shared expert: always valid
  __syncthreads();
  for (int item0 = warp; item0 < kDownRows * KI; item0 += 2 * kWarps) {  // two (row, k) items a warp at a time
    const uint16_t* rows[2];
    const float* xs[2];
    bool valid[2];
    float acc[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int item = item0 + j * kWarps, rr = item / KI, k = item % KI, r = r0 + rr;
      const int e = item < kDownRows * KI ? s_e[k] : -1;
      valid[j] = item < kDownRows * KI && r < w.X && e >= 0 && e < w.E;
      // An invalid item reads (and does not use) the first row and pair: addresses that exist.
      if (k == K) {  // the shared expert (has_shared)
        rows[j] = sh.down + (valid[j] ? static_cast<int64_t>(r) * w.I : 0);
        xs[j] = h + (static_cast<int64_t>(routed) + t) * w.I;
      } else {
        rows[j] = static_cast<const uint16_t*>(w.down) + (valid[j] ? (static_cast<int64_t>(e) * w.X + r) * w.I : 0);
        xs[j] = h + (valid[j] ? (static_cast<int64_t>(t) * K + k) * w.I : 0);
      }
    }
    lane_dots2_bf16<4, kPerm>(rows[0], xs[0], valid[0], rows[1], xs[1], valid[1], w.I, lane, acc[0], acc[1]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int item = item0 + j * kWarps;
      const float d = warp_sum(acc[j]);
      if (lane == 0 && valid[j]) s_d[item / KI][item % KI] = d;
    }
  }
  __syncthreads();
  combine_rows(w, K, kDownRows, s_d, s_e, topk_w, t, r0, out, has_shared);
}

// A lane's shares of kR bf16 rows' dots with ONE activation row x (lane_dots2_bf16's columns, batches, clamping and
// kPermX): each batch issues the kR rows' weights, then x, before the first multiply; each row's fmaf chain in column
// order -- the bits lane_dots2_bf16 gives that row.
template <int kR, int kB, bool kPermX>
__device__ __forceinline__ void lane_dots_rows_bf16(const uint16_t* const (&rows)[kR], const float* __restrict__ x,
                                                    int cols, int lane, float (&acc)[kR]) {
  for (int base = 0; base < cols; base += 256 * kB) {  // warp-uniform batches
    const int c0 = base + lane * 8;
    uint4 wv[kR][kB];
    float4 a0[kB], a1[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int c = c0 + 256 * j, cc = c < cols ? c : cols - 8;
#pragma unroll
      for (int i = 0; i < kR; ++i) wv[i][j] = ld_weights16(rows[i] + cc);
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int c = c0 + 256 * j, cc = c < cols ? c : cols - 8;
      const int cb = base + 256 * j < cols ? base + 256 * j : cols - 256;
      a0[j] = ld_acts16(x + (kPermX ? cb + 4 * lane : cc));
      a1[j] = ld_acts16(x + (kPermX ? cb + 128 + 4 * lane : cc + 4));
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      if (c0 + 256 * j >= cols) continue;
#pragma unroll
      for (int i = 0; i < kR; ++i) acc[i] = fma8_bf16(wv[i][j], a0[j], a1[j], acc[i]);
    }
  }
}

// The down kernel's pairs form (the default; MoeDownForm): grid (ceil(X / (kWarps kR)), pairs), block (bx, p) takes
// kR rows a warp of pair p's expert (the shared expert for p >= routed) against h row p and writes the dots to d
// [pairs][X]; down_combine_kernel sums them. Consecutive blocks read consecutive rows of ONE expert, the gate/up
// kernel's order. Why: the items form (every block reading 4 rows of each of the K + 1 experts) streamed at 48-50% of
// DRAM whatever its shape -- 2 rows a warp in 3 dependent rounds (s45-1), a stream of items with h in shared memory
// (s47-2, 50-52%), a warp per k over 4 rows (s48-2, 54%) -- while the pair-major gate/up kernel reaches 75%. This form:
// 20.6 us at 64.5% against the items form's 26.6-27.1 at 49-50% (ncu, batch 1, Kimi-Linear), plus the combine
// launch; end to end +3% at batch 1 (call s48-3). Same dots and warp sums as the items form, the combine is
// combine_rows' steps: the same bits (CudaMoe.GemvDownFormsGiveTheSameBits). Folding the combine into this kernel
// (each block counted in by a fence and an atomic, the token's last block of a row block summing) lost: -1.2% at batch
// 1 against the launch (call s48-7), so the combine stays a launch.
template <int kR, int kB, bool kPerm>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_pairs_kernel(const ExpertBank w, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                           float* __restrict__ d, SharedGluBf16 sh, int routed) {
  pdl::begin();
  const int lane = threadIdx.x & 31, p = blockIdx.y;
  const int r0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * kR;
  if (r0 >= w.X) return;
  const bool shared = p >= routed;
  const int e = shared ? 0 : topk_idx[p];
  if (e < 0 || e >= w.E) return;  // the combine skips the pair
  const uint16_t* base = shared ? sh.down : static_cast<const uint16_t*>(w.down) + static_cast<int64_t>(e) * w.X * w.I;
  const uint16_t* rows[kR];
  float acc[kR];
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    rows[i] = base + static_cast<int64_t>(r0 + i < w.X ? r0 + i : w.X - 1) * w.I;  // past X: read, unused
    acc[i] = 0.f;
  }
  lane_dots_rows_bf16<kR, kB, kPerm>(rows, h + static_cast<int64_t>(p) * w.I, w.I, lane, acc);
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0 && r0 + i < w.X) d[static_cast<int64_t>(p) * w.X + r0 + i] = v;
  }
}

// grid (ceil(X / 256), n): out[t][r] = sum over k in rank order of w_k d[tK + k][r] (fmaf from 0, invalid ids skipped),
// + d[routed + t][r] with the shared expert: combine_rows' steps.
__global__ void __launch_bounds__(256)
    down_combine_kernel(const ExpertBank w, int K, const float* __restrict__ d, const int32_t* __restrict__ topk_idx,
                        const float* __restrict__ topk_w, float* __restrict__ out, bool shared, int routed) {
  pdl::begin();
  const int t = blockIdx.y, r = blockIdx.x * 256 + threadIdx.x;
  if (r >= w.X) return;
  const int64_t p0 = static_cast<int64_t>(t) * K;  // the token's first pair
  out[static_cast<int64_t>(t) * w.X + r] = rank_order_sum(
      w, K, [&](int k) { return topk_idx[p0 + k]; }, topk_w + p0,
      [&](int k) { return d[(k < K ? p0 + k : static_cast<int64_t>(routed) + t) * w.X + r]; }, shared);
}

// MXFP4 rows: 4 lanes per row, 8 rows per warp. A lane takes every 4th E8M0 group of its row (16 bytes of
// weights) and the 32 activations of that group; the warp's 8 rows read the SAME 4 activation chunks per step
// (one L1 broadcast each), so activations cost 512 bytes of L1 per 512 bytes of weights. (A warp per row read
// 128 bytes of activations per 16-byte weight load: L1-bound at ~9% of HBM, session 13.)
__device__ __forceinline__ float mx_group_dot(uint4 v, const float* __restrict__ xg) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
  const float4* x4 = reinterpret_cast<const float4*>(xg);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float w[8];
    e2m1x8_to_float_x2m14(u[i], w);
    const float4 a = __ldg(x4 + 2 * i), b = __ldg(x4 + 2 * i + 1);
    s = fmaf(w[0], a.x, s); s = fmaf(w[1], a.y, s); s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
    s = fmaf(w[4], b.x, s); s = fmaf(w[5], b.y, s); s = fmaf(w[6], b.z, s); s = fmaf(w[7], b.w, s);
  }
  return s;
}

// The 4-lane dots of kR MXFP4 rows against one x (lane q of a row's quad takes groups q, q + 4, ...), each summed
// over the quad. Each batch of kB groups issues all the rows' weight and scale loads before the first multiply (the
// loop this replaced, `#pragma unroll 2`, had ~2 groups a lane in flight: 14% of DRAM at batch 1, ncu s48-5); the
// groups of a row still go into its fmaf chain in order q, q + 4, ...: the same bits.
template <int kR, int kB>
__device__ __forceinline__ void quad_dots_mx(const uint8_t* const (&wr)[kR], const uint8_t* const (&sr)[kR], int groups,
                                             const float* __restrict__ x, int q, float (&acc)[kR]) {
  for (int g0 = q; g0 < groups; g0 += 4 * kB) {  // the quad's lanes may differ by one batch at the end: no shuffles here
    uint4 wv[kR][kB];
    uint32_t sc[kR][kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int g = g0 + 4 * j < groups ? g0 + 4 * j : q;  // past the row: group q again, read and unused
#pragma unroll
      for (int i = 0; i < kR; ++i) {
        wv[i][j] = __ldg(reinterpret_cast<const uint4*>(wr[i]) + g);
        sc[i][j] = sr[i][g];
      }
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int g = g0 + 4 * j;
      if (g >= groups) break;
#pragma unroll
      for (int i = 0; i < kR; ++i) acc[i] = fmaf(mx_group_dot(wv[i][j], x + g * 32), e8m0_scale_x2p14(sc[i][j]), acc[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < kR; ++i) {
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 1);
    acc[i] += __shfl_xor_sync(0xffffffffu, acc[i], 2);
  }
}

// The 4-lane dot of one MXFP4 row, summed over the quad.
__device__ __forceinline__ float quad_dot_mx(const uint8_t* __restrict__ wr, const uint8_t* __restrict__ sr, int groups,
                                             const float* __restrict__ x, int q) {
  const uint8_t* const w1[1] = {wr};
  const uint8_t* const s1[1] = {sr};
  float acc[1] = {0.f};
  quad_dots_mx<1, 6>(w1, s1, groups, x, q, acc);
  return acc[0];
}

// grid (ceil(I / (8 kWarps)), P): lane quad -> row i of pair blockIdx.y.
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gate_up_mx_kernel(const ExpertBank w, int K, const float* __restrict__ x, const int32_t* __restrict__ topk_idx,
                           GluAct act, float beta, float lbeta, float* __restrict__ h) {
  pdl::begin();
  const int lane = threadIdx.x & 31, q = lane & 3, p = blockIdx.y;
  const int i = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * 8 + (lane >> 2);
  if ((blockIdx.x * kWarps + (threadIdx.x >> 5)) * 8 >= w.I) return;  // whole warp past the rows
  const bool row_ok = i < w.I;
  const int e = topk_idx[p];  // block-uniform
  float* hp = h + static_cast<int64_t>(p) * w.I;
  if (e < 0 || e >= w.E) {
    if (q == 0 && row_ok) hp[i] = 0.f;
    return;
  }
  const int64_t row = static_cast<int64_t>(e) * w.I + (row_ok ? i : w.I - 1);
  const int groups = w.X / 32;
  const float* xt = x + static_cast<int64_t>(p / K) * w.X;
  const uint8_t* const rows[2] = {static_cast<const uint8_t*>(w.gate) + row * (w.X / 2),
                                  static_cast<const uint8_t*>(w.up) + row * (w.X / 2)};
  const uint8_t* const scales[2] = {w.gate_scales + row * groups, w.up_scales + row * groups};
  float gu[2] = {0.f, 0.f};  // gate and up, their loads in flight together
  quad_dots_mx<2, 4>(rows, scales, groups, xt, q, gu);
  if (q == 0 && row_ok) hp[i] = moe_dev::glu(gu[0], gu[1], act, beta, lbeta);
}

// grid (ceil(X / 8), n): warp k' takes k = k', k' + kWarps, ... for the block's 8 rows (quads), then the
// block sums each row's K dots in rank order.
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_mx_kernel(const ExpertBank w, int K, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                        const float* __restrict__ topk_w, float* __restrict__ out) {
  pdl::begin();
  __shared__ float s_d[8][kMaxPairK + 1];
  __shared__ int s_e[kMaxPairK];
  const int lane = threadIdx.x & 31, q = lane & 3, rl = lane >> 2, t = blockIdx.y;
  const int r0 = blockIdx.x * 8, r = r0 + rl;
  if (threadIdx.x < K) s_e[threadIdx.x] = topk_idx[static_cast<int64_t>(t) * K + threadIdx.x];
  __syncthreads();
  const int groups = w.I / 32;
  for (int k = threadIdx.x >> 5; k < K; k += kWarps) {
    const int e = s_e[k];
    if (e < 0 || e >= w.E) continue;  // warp-uniform
    const int64_t row = static_cast<int64_t>(e) * w.X + (r < w.X ? r : w.X - 1);
    const float d = quad_dot_mx(static_cast<const uint8_t*>(w.down) + row * (w.I / 2), w.down_scales + row * groups,
                                groups, h + (static_cast<int64_t>(t) * K + k) * w.I, q);
    if (q == 0) s_d[rl][k] = d;
  }
  __syncthreads();
  combine_rows(w, K, 8, s_d, s_e, topk_w, t, r0, out);
}

// The MXFP4 down kernel's pairs form (as the bf16 one's): grid (ceil(X / (8 kWarps)), n K), a lane quad per row of
// pair p's expert against h row p, the dots to d [n K][X] for down_combine_kernel. Same dots, same combine: the bits of
// gemv_down_mx_kernel.
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_mx_pairs_kernel(const ExpertBank w, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                              float* __restrict__ d) {
  pdl::begin();
  const int lane = threadIdx.x & 31, q = lane & 3, p = blockIdx.y;
  const int r0 = (blockIdx.x * kWarps + (threadIdx.x >> 5)) * 8, r = r0 + (lane >> 2);
  if (r0 >= w.X) return;  // whole warp past the rows
  const int e = topk_idx[p];
  if (e < 0 || e >= w.E) return;  // the combine skips the pair
  const int groups = w.I / 32;
  const int64_t row = static_cast<int64_t>(e) * w.X + (r < w.X ? r : w.X - 1);
  const float v = quad_dot_mx(static_cast<const uint8_t*>(w.down) + row * (w.I / 2), w.down_scales + row * groups,
                              groups, h + static_cast<int64_t>(p) * w.I, q);
  if (q == 0 && r < w.X) d[static_cast<int64_t>(p) * w.X + r] = v;
}

cudaError_t launch_mx(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                      GluAct act, float beta, float lbeta, float* h, float* d, float* out, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>((w.I + 8 * kWarps - 1) / (8 * kWarps)), static_cast<unsigned>(n * K));
  (void)pdl::launch(gemv_gate_up_mx_kernel, g1, kWarps * 32, 0, stream, w, K, x, topk_idx, act, beta, lbeta, h);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  if (down_form() == MoeDownForm::Items) {
    const dim3 g2(static_cast<unsigned>((w.X + 7) / 8), static_cast<unsigned>(n));
    (void)pdl::launch(gemv_down_mx_kernel, g2, kWarps * 32, 0, stream, w, K, h, topk_idx, topk_w, out);
    return cudaGetLastError();
  }
  const dim3 g2(static_cast<unsigned>((w.X + 8 * kWarps - 1) / (8 * kWarps)), static_cast<unsigned>(n * K));
  (void)pdl::launch(gemv_down_mx_pairs_kernel, g2, kWarps * 32, 0, stream, w, h, topk_idx, d);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 g3(static_cast<unsigned>((w.X + 255) / 256), static_cast<unsigned>(n));
  (void)pdl::launch(down_combine_kernel, g3, 256, 0, stream, w, K, d, topk_idx, topk_w, out, false, n * K);
  return cudaGetLastError();
}

cudaError_t launch_bf16(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                        GluAct act, float beta, float lbeta, float* h, float* d, float* out, const SharedGluBf16& sh,
                        cudaStream_t stream) {
  const int routed = n * K, pairs = routed + (sh.gate ? n : 0);
  const dim3 g1(static_cast<unsigned>((w.I + kWarps - 1) / kWarps), static_cast<unsigned>(pairs));
  const bool perm = w.I % 256 == 0 && h_perm_enabled();
  (void)pdl::launch(gemv_gate_up_kernel, g1, kWarps * 32, 0, stream, w, K, x, topk_idx, act, beta, lbeta, h, sh, routed,
                    perm);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const MoeDownForm form = down_form();
  if (form == MoeDownForm::Items) {
    const dim3 g2(static_cast<unsigned>((w.X + kDownRows - 1) / kDownRows), static_cast<unsigned>(n));
    if (perm)
      (void)pdl::launch(gemv_down_kernel<true>, g2, kWarps * 32, 0, stream, w, K, h, topk_idx, topk_w, out, sh, routed);
    else
      (void)pdl::launch(gemv_down_kernel<false>, g2, kWarps * 32, 0, stream, w, K, h, topk_idx, topk_w, out, sh, routed);
    return cudaGetLastError();
  }
  constexpr int kR = 4, rows_per_block = kWarps * kR;  // the pairs form: 4 rows a warp, 4 chunks a batch
  const dim3 g2(static_cast<unsigned>((w.X + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(pairs));
  const auto kernel = perm ? gemv_down_pairs_kernel<kR, 4, true> : gemv_down_pairs_kernel<kR, 4, false>;
  (void)pdl::launch(kernel, g2, kWarps * 32, 0, stream, w, h, topk_idx, d, sh, routed);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 g3(static_cast<unsigned>((w.X + 255) / 256), static_cast<unsigned>(n));
  (void)pdl::launch(down_combine_kernel, g3, 256, 0, stream, w, K, d, topk_idx, topk_w, out, sh.down != nullptr, routed);
  return cudaGetLastError();
}

}  // namespace

void force_moe_down_form_for_testing(std::optional<MoeDownForm> form) {
  g_down_forced.store(form ? static_cast<int>(*form) : -1, std::memory_order_relaxed);
}

void force_moe_h_perm_for_testing(std::optional<bool> on) { g_h_perm.force(on); }

bool moe_gemv_enabled() { return moe_gemv_mode() != 0; }

int moe_gemv_mode() {
  static const int mode = [] {
    const char* v = std::getenv("K3_MOE_GEMV");
    return v && v[0] == '0' ? 0 : v && v[0] == '2' ? 2 : 1;
  }();
  return mode;
}

cudaError_t moe_gemv_experts(const ExpertBank& w, bool mx, int n, int K, const float* x, const int32_t* topk_idx,
                             const float* topk_w, GluAct act, float beta, float lbeta, float* h, float* d, float* out,
                             cudaStream_t stream) {
  if (K <= 0 || K > kMaxPairK || n <= 0) return cudaErrorInvalidValue;
  return mx ? launch_mx(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, d, out, stream)
            : launch_bf16(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, d, out, SharedGluBf16{}, stream);
}

cudaError_t moe_gemv_experts_shared(const ExpertBank& w, const SharedGluBf16& sh, int n, int K, const float* x,
                                    const int32_t* topk_idx, const float* topk_w, GluAct act, float beta, float lbeta,
                                    float* h, float* d, float* out, cudaStream_t stream) {
  if (K <= 0 || K > kMaxPairK || n <= 0 || !sh.gate || !sh.up || !sh.down || w.format != WeightFormat::BF16)
    return cudaErrorInvalidValue;
  return launch_bf16(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, d, out, sh, stream);
}

}  // namespace k3::cuda
