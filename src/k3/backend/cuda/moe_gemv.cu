// The MoE experts as two GEMV kernels, for decode batches of a few (token, expert) pairs (MoePath::Gemv).
//
// Why: at batch 1 the tile paths spend ~4 launches per layer (plan, gate/up tiles, down tiles, combine) and
// reach ~2 TB/s on the experts' bytes (ncu, docs/perf/cuda.md "Session 13"): the tiles sort pairs by
// expert so that a tile shares its expert's weights between tokens, which a pair or two per expert cannot
// use. Here every pair is a plain matrix-vector product, rows spread over warps like the dense GEMV
// (linear.cu), no sorting and no K-split partials:
//   1. gate/up: one warp per (pair, row i): the gate and up rows' dots with the pair's token, the GLU in the
//      warp, h[p][i] written (p = t * K + k, the pair's own index);
//   2. down + combine: a block per (token, 4 output rows); its warps take the (row, k) dots, the block sums
//      them in rank order k = 0..K-1 (out = sum_k w_k * d_k, fmaf from 0, the combine of moe_decode.cu), so
//      the result does not depend on the schedule. An invalid expert id (outside [0, E)) adds nothing.
// fp32 activations and accumulation; bf16 weights widened exactly, MXFP4 decoded exactly (E2M1 x 2^-14 in
// fp16, the group's dot scaled once by 2^(s-127) x 2^14). The CPU reference: cpu moe_layer. bf16 rows take a
// warp each; MXFP4 rows a quad of lanes (so that a warp's rows share their activation loads, below).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_gemv.h"
#include "k3/backend/cuda/mxfp4_decode.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;          // warps per block, both kernels
constexpr int kDownRows = 4;       // output rows per block of the down kernel
constexpr int kMaxPairK = 32;      // K bound (MoeWorkspace checks K <= 32)

// One lane's share of bf16 row `row` (of `cols` columns) dotted with x; the caller sums the warp.
__device__ __forceinline__ float lane_dot_bf16(const void* __restrict__ data, int64_t row, int cols,
                                               const float* __restrict__ x, int lane) {
  const uint16_t* wr = static_cast<const uint16_t*>(data) + row * cols;
  float acc = 0.f;
#pragma unroll 4
  for (int c = lane * 8; c < cols; c += 256) {  // 8 bf16 (16 bytes) per lane and step
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(wr + c));
    const float2 w0 = bf16x2_to_float2(v.x), w1 = bf16x2_to_float2(v.y), w2 = bf16x2_to_float2(v.z),
                 w3 = bf16x2_to_float2(v.w);
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + c)), b = __ldg(reinterpret_cast<const float4*>(x + c + 4));
    acc = fmaf(w0.x, a.x, acc); acc = fmaf(w0.y, a.y, acc); acc = fmaf(w1.x, a.z, acc); acc = fmaf(w1.y, a.w, acc);
    acc = fmaf(w2.x, b.x, acc); acc = fmaf(w2.y, b.y, acc); acc = fmaf(w3.x, b.z, acc); acc = fmaf(w3.y, b.w, acc);
  }
  return acc;
}

// bf16 rows: a warp per row (16 bytes of weights against 32 of activations per lane and step).
// Threads 0..rows-1 of the block: out[t][r0 + thread] = sum over k in rank order of w_k * d[thread][k] (fmaf
// from 0, as moe_combine), pairs with an invalid id skipped.
__device__ __forceinline__ void combine_rows(const ExpertBank& w, int K, int rows, const float (*d)[kMaxPairK],
                                             const int* e_of, const float* __restrict__ topk_w, int t, int r0,
                                             float* __restrict__ out) {
  if (threadIdx.x >= static_cast<unsigned>(rows) || r0 + static_cast<int>(threadIdx.x) >= w.X) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) {
    const int e = e_of[k];
    if (e < 0 || e >= w.E) continue;
    acc = fmaf(topk_w[static_cast<int64_t>(t) * K + k], d[threadIdx.x][k], acc);
  }
  out[static_cast<int64_t>(t) * w.X + r0 + threadIdx.x] = acc;
}

// grid (ceil(I / kWarps), P): warp -> row i of pair blockIdx.y. h [P][I].
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gate_up_kernel(const ExpertBank w, int K, const float* __restrict__ x, const int32_t* __restrict__ topk_idx,
                        GluAct act, float beta, float lbeta, float* __restrict__ h) {
  pdl::launch_dependents();
  const int lane = threadIdx.x & 31, p = blockIdx.y;
  const int i = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (i >= w.I) return;
  const int e = topk_idx[p];
  float* hp = h + static_cast<int64_t>(p) * w.I;
  if (e < 0 || e >= w.E) {  // nothing routed here: the down kernel skips the pair, h stays defined anyway
    if (lane == 0) hp[i] = 0.f;
    return;
  }
  const float* xt = x + static_cast<int64_t>(p / K) * w.X;
  const int64_t row = static_cast<int64_t>(e) * w.I + i;
  const float g = warp_sum(lane_dot_bf16(w.gate, row, w.X, xt, lane));
  const float u = warp_sum(lane_dot_bf16(w.up, row, w.X, xt, lane));
  if (lane == 0) hp[i] = moe_dev::glu(g, u, act, beta, lbeta);
}

// grid (ceil(X / kDownRows), n): the block's warps take the (row, k) dots; out [n][X] overwritten.
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_kernel(const ExpertBank w, int K, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                     const float* __restrict__ topk_w, float* __restrict__ out) {
  pdl::launch_dependents();
  __shared__ float s_d[kDownRows][kMaxPairK];
  __shared__ int s_e[kMaxPairK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.y;
  const int r0 = blockIdx.x * kDownRows;
  if (threadIdx.x < K) s_e[threadIdx.x] = topk_idx[static_cast<int64_t>(t) * K + threadIdx.x];
  __syncthreads();
  for (int item = warp; item < kDownRows * K; item += kWarps) {
    const int rr = item / K, k = item % K, r = r0 + rr, e = s_e[k];
    if (r >= w.X || e < 0 || e >= w.E) continue;
    const float* hp = h + (static_cast<int64_t>(t) * K + k) * w.I;
    const float d = warp_sum(lane_dot_bf16(w.down, static_cast<int64_t>(e) * w.X + r, w.I, hp, lane));
    if (lane == 0) s_d[rr][k] = d;
  }
  __syncthreads();
  combine_rows(w, K, kDownRows, s_d, s_e, topk_w, t, r0, out);
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

// The 4-lane dot of one MXFP4 row (lane q of the row's quad takes groups q, q + 4, ...), summed over the quad.
__device__ __forceinline__ float quad_dot_mx(const uint8_t* __restrict__ wr, const uint8_t* __restrict__ sr, int groups,
                                             const float* __restrict__ x, int q) {
  float acc = 0.f;
#pragma unroll 2
  for (int g = q; g < groups; g += 4)
    acc = fmaf(mx_group_dot(__ldg(reinterpret_cast<const uint4*>(wr) + g), x + g * 32), e8m0_scale_x2p14(sr[g]), acc);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  return acc + __shfl_xor_sync(0xffffffffu, acc, 2);
}

// grid (ceil(I / (8 kWarps)), P): lane quad -> row i of pair blockIdx.y.
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gate_up_mx_kernel(const ExpertBank w, int K, const float* __restrict__ x, const int32_t* __restrict__ topk_idx,
                           GluAct act, float beta, float lbeta, float* __restrict__ h) {
  pdl::launch_dependents();
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
  const float g = quad_dot_mx(static_cast<const uint8_t*>(w.gate) + row * (w.X / 2), w.gate_scales + row * groups,
                              groups, xt, q);
  const float u = quad_dot_mx(static_cast<const uint8_t*>(w.up) + row * (w.X / 2), w.up_scales + row * groups, groups,
                              xt, q);
  if (q == 0 && row_ok) hp[i] = moe_dev::glu(g, u, act, beta, lbeta);
}

// grid (ceil(X / 8), n): warp k' takes k = k', k' + kWarps, ... for the block's 8 rows (quads), then the
// block sums each row's K dots in rank order.
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_mx_kernel(const ExpertBank w, int K, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                        const float* __restrict__ topk_w, float* __restrict__ out) {
  pdl::launch_dependents();
  __shared__ float s_d[8][kMaxPairK];
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

cudaError_t launch_mx(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                      GluAct act, float beta, float lbeta, float* h, float* out, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>((w.I + 8 * kWarps - 1) / (8 * kWarps)), static_cast<unsigned>(n * K));
  gemv_gate_up_mx_kernel<<<g1, kWarps * 32, 0, stream>>>(w, K, x, topk_idx, act, beta, lbeta, h);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 g2(static_cast<unsigned>((w.X + 7) / 8), static_cast<unsigned>(n));
  gemv_down_mx_kernel<<<g2, kWarps * 32, 0, stream>>>(w, K, h, topk_idx, topk_w, out);
  return cudaGetLastError();
}

cudaError_t launch_bf16(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                   GluAct act, float beta, float lbeta, float* h, float* out, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>((w.I + kWarps - 1) / kWarps), static_cast<unsigned>(n * K));
  gemv_gate_up_kernel<<<g1, kWarps * 32, 0, stream>>>(w, K, x, topk_idx, act, beta, lbeta, h);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 g2(static_cast<unsigned>((w.X + kDownRows - 1) / kDownRows), static_cast<unsigned>(n));
  gemv_down_kernel<<<g2, kWarps * 32, 0, stream>>>(w, K, h, topk_idx, topk_w, out);
  return cudaGetLastError();
}

}  // namespace

bool moe_gemv_enabled() { return moe_gemv_mode() != 0; }

int moe_gemv_mode() {
  static const int mode = [] {
    const char* v = std::getenv("K3_MOE_GEMV");
    return v && v[0] == '0' ? 0 : v && v[0] == '2' ? 2 : 1;
  }();
  return mode;
}

cudaError_t moe_gemv_experts(const ExpertBank& w, bool mx, int n, int K, const float* x, const int32_t* topk_idx,
                             const float* topk_w, GluAct act, float beta, float lbeta, float* h, float* out,
                             cudaStream_t stream) {
  if (K <= 0 || K > kMaxPairK || n <= 0) return cudaErrorInvalidValue;
  return mx ? launch_mx(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, out, stream)
            : launch_bf16(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, out, stream);
}

}  // namespace k3::cuda
