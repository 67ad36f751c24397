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
// fp16, the group's dot scaled once by 2^(s-127) x 2^14). The CPU reference: cpu moe_layer.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_gemv.h"
#include "k3/backend/cuda/mxfp4_decode.cuh"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;          // warps per block, both kernels
constexpr int kDownRows = 4;       // output rows per block of the down kernel
constexpr int kMaxPairK = 32;      // K bound (MoeWorkspace checks K <= 32)

// One lane's share of row `row` (of `cols` columns) of matrix `data` dotted with x; the caller sums the warp.
template <bool MX>
__device__ __forceinline__ float lane_dot(const void* __restrict__ data, const uint8_t* __restrict__ scales, int64_t row,
                                          int cols, const float* __restrict__ x, int lane) {
  float acc = 0.f;
  if constexpr (MX) {
    const uint8_t* wr = static_cast<const uint8_t*>(data) + row * (cols / 2);
    const uint8_t* sr = scales + row * (cols / 32);
#pragma unroll 2
    for (int g = lane; g < cols / 32; g += 32) {  // one E8M0 group (16 bytes, 32 values) per lane and step
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(wr) + g);
      const uint32_t u[4] = {v.x, v.y, v.z, v.w};
      const float4* xg = reinterpret_cast<const float4*>(x + g * 32);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float w[8];
        e2m1x8_to_float_x2m14(u[i], w);
        const float4 a = __ldg(xg + 2 * i), b = __ldg(xg + 2 * i + 1);
        s = fmaf(w[0], a.x, s); s = fmaf(w[1], a.y, s); s = fmaf(w[2], a.z, s); s = fmaf(w[3], a.w, s);
        s = fmaf(w[4], b.x, s); s = fmaf(w[5], b.y, s); s = fmaf(w[6], b.z, s); s = fmaf(w[7], b.w, s);
      }
      acc = fmaf(s, e8m0_scale_x2p14(sr[g]), acc);
    }
  } else {
    const uint16_t* wr = static_cast<const uint16_t*>(data) + row * cols;
#pragma unroll 4
    for (int c = lane * 8; c < cols; c += 256) {  // 8 bf16 (16 bytes) per lane and step
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(wr + c));
      const float2 w0 = bf16x2_to_float2(v.x), w1 = bf16x2_to_float2(v.y), w2 = bf16x2_to_float2(v.z),
                   w3 = bf16x2_to_float2(v.w);
      const float4 a = __ldg(reinterpret_cast<const float4*>(x + c)), b = __ldg(reinterpret_cast<const float4*>(x + c + 4));
      acc = fmaf(w0.x, a.x, acc); acc = fmaf(w0.y, a.y, acc); acc = fmaf(w1.x, a.z, acc); acc = fmaf(w1.y, a.w, acc);
      acc = fmaf(w2.x, b.x, acc); acc = fmaf(w2.y, b.y, acc); acc = fmaf(w3.x, b.z, acc); acc = fmaf(w3.y, b.w, acc);
    }
  }
  return acc;
}

// grid (ceil(I / kWarps), P): warp -> row i of pair blockIdx.y. h [P][I].
template <bool MX>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_gate_up_kernel(const ExpertBank w, int K, const float* __restrict__ x, const int32_t* __restrict__ topk_idx,
                        GluAct act, float beta, float lbeta, float* __restrict__ h) {
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
  const float g = warp_sum(lane_dot<MX>(w.gate, w.gate_scales, row, w.X, xt, lane));
  const float u = warp_sum(lane_dot<MX>(w.up, w.up_scales, row, w.X, xt, lane));
  if (lane == 0) hp[i] = moe_dev::glu(g, u, act, beta, lbeta);
}

// grid (ceil(X / kDownRows), n): the block's warps take the (row, k) dots; out [n][X] overwritten.
template <bool MX>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_down_kernel(const ExpertBank w, int K, const float* __restrict__ h, const int32_t* __restrict__ topk_idx,
                     const float* __restrict__ topk_w, float* __restrict__ out) {
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
    const float d = warp_sum(lane_dot<MX>(w.down, w.down_scales, static_cast<int64_t>(e) * w.X + r, w.I, hp, lane));
    if (lane == 0) s_d[rr][k] = d;
  }
  __syncthreads();
  if (threadIdx.x < kDownRows && r0 + static_cast<int>(threadIdx.x) < w.X) {
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
      const int e = s_e[k];
      if (e < 0 || e >= w.E) continue;
      acc = fmaf(topk_w[static_cast<int64_t>(t) * K + k], s_d[threadIdx.x][k], acc);
    }
    out[static_cast<int64_t>(t) * w.X + r0 + threadIdx.x] = acc;
  }
}

template <bool MX>
cudaError_t launch(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                   GluAct act, float beta, float lbeta, float* h, float* out, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>((w.I + kWarps - 1) / kWarps), static_cast<unsigned>(n * K));
  gemv_gate_up_kernel<MX><<<g1, kWarps * 32, 0, stream>>>(w, K, x, topk_idx, act, beta, lbeta, h);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 g2(static_cast<unsigned>((w.X + kDownRows - 1) / kDownRows), static_cast<unsigned>(n));
  gemv_down_kernel<MX><<<g2, kWarps * 32, 0, stream>>>(w, K, h, topk_idx, topk_w, out);
  return cudaGetLastError();
}

}  // namespace

bool moe_gemv_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("K3_MOE_GEMV");
    return !(v && v[0] == '0');
  }();
  return on;
}

cudaError_t moe_gemv_experts(const ExpertBank& w, bool mx, int n, int K, const float* x, const int32_t* topk_idx,
                             const float* topk_w, GluAct act, float beta, float lbeta, float* h, float* out,
                             cudaStream_t stream) {
  if (K <= 0 || K > kMaxPairK || n <= 0) return cudaErrorInvalidValue;
  return mx ? launch<true>(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, out, stream)
            : launch<false>(w, n, K, x, topk_idx, topk_w, act, beta, lbeta, h, out, stream);
}

}  // namespace k3::cuda
