// quant_moe_experts (quant_moe.h): routed experts stacked as GGUF blocks, the exact decode path.
//
// Two kernels, one warp per output value, each a GEMV row over the blocks as quant_gemv.cu's (lanes take
// groups of 8 weights, decode them in registers with qdev::decode8: the CPU's exact values; fp32 products
// and accumulation, warp-shuffle sums):
//   gate_up: hidden[p][i] = act(gate_e[i] . x_t, up_e[i] . x_t) for every (token, rank) pair p = t K + k,
//            e = topk_idx[p]: the gate and up rows read in the same pass;
//   down:    out[t][o] = sum over k in rank order of topk_w[t][k] * (down_e[o] . hidden[p]).
// Each pair reads its expert's rows itself, so a prefill batch would read an expert once per token routed
// to it: the formats with a part decoder take quant_moe_grouped instead (quant_moe_grouped.cu), and from 2.5 pairs
// per expert on average every format takes moe_experts' tensor-core tiles (quant_moe_choice; moe_tc_tile.cuh). An expert id outside [0, E) (never produced by moe_route)
// contributes nothing.
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/quant_decode.cuh"
#include "k3/backend/cuda/quant_moe.h"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;
// quant_moe_choice's switch to the tensor-core tiles, in half (token, expert) pairs per expert, measured against the
// grouped kernels (CudaQuantMoe.TimingAtKimiLinearShape, H200, Kimi-Linear's experts in Q4_K / Q6_K; docs/perf/cuda.md
// "Session 19"): at 2 pairs per expert grouped 1530 us vs tiles 1750, at 4 2909 vs 2019.
constexpr int kTcHalfPairsPerExpert = 5;

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Row `row` of a block matrix of `cols` columns dotted with fp32 v, this lane's share.
template <WeightFormat F>
__device__ __forceinline__ float lane_dot(const uint8_t* row, int cols, const float* __restrict__ v, const IqTables& T) {
  constexpr int B = weight_layout(F).block_bytes, kGroups = weight_layout(F).block_elems / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(v) & 15) == 0;
  float s = 0.f;
  for (int gi = threadIdx.x & 31; gi < cols / 8; gi += 32) {
    float w[8], a[8];
    qdev::decode8<F>(row + (gi / kGroups) * B, gi % kGroups, T, w);
    qdev::load_x8(v + gi * 8, aligned, a);
#pragma unroll
    for (int j = 0; j < 8; ++j) s = fmaf(w[j], a[j], s);
  }
  return s;
}

template <WeightFormat F>
__global__ void __launch_bounds__(kWarps * 32)
    gate_up_kernel(const uint8_t* __restrict__ gate, const uint8_t* __restrict__ up, int E, int I, int X, int K, int64_t pairs,
                   const float* __restrict__ x, const int32_t* __restrict__ idx, GluAct act, float beta, float lbeta,
                   float* __restrict__ hidden, IqTables T) {
  pdl::begin();
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (wid >= pairs * I) return;
  const int64_t p = wid / I;
  const int i = static_cast<int>(wid % I);
  const int e = idx[p];
  float g = 0.f, u = 0.f;
  if (e >= 0 && e < E) {
    const int64_t row_bytes = row_data_bytes(F, X), off = (static_cast<int64_t>(e) * I + i) * row_bytes;
    const float* xt = x + (p / K) * X;
    g = warp_sum(lane_dot<F>(gate + off, X, xt, T));
    u = warp_sum(lane_dot<F>(up + off, X, xt, T));
  }
  if ((threadIdx.x & 31) == 0) hidden[p * I + i] = e >= 0 && e < E ? moe_dev::glu(g, u, act, beta, lbeta) : 0.f;
}

template <WeightFormat F>
__global__ void __launch_bounds__(kWarps * 32)
    down_kernel(const uint8_t* __restrict__ down, int E, int I, int X, int K, int64_t n, const int32_t* __restrict__ idx,
                const float* __restrict__ wts, const float* __restrict__ hidden, float* __restrict__ out, IqTables T) {
  pdl::begin();
  const int64_t wid = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (wid >= n * X) return;
  const int64_t t = wid / X;
  const int o = static_cast<int>(wid % X);
  const int64_t row_bytes = row_data_bytes(F, I);
  float acc = 0.f;
  for (int k = 0; k < K; ++k) {
    const int64_t p = t * K + k;
    const int e = idx[p];
    if (e < 0 || e >= E) continue;
    const float d = warp_sum(lane_dot<F>(down + (static_cast<int64_t>(e) * X + o) * row_bytes, I, hidden + p * I, T));
    acc = fmaf(wts[p], d, acc);
  }
  if ((threadIdx.x & 31) == 0) out[t * X + o] = acc;
}

unsigned warp_blocks(int64_t warps) { return static_cast<unsigned>((warps + kWarps - 1) / kWarps); }

// K3_QUANT_MOE: -1 = the rule, else the forced QuantMoeKernels ("gemv" = PerPair, "grouped", "tc" = Tiles).
int quant_moe_mode() {
  static const int m = [] {
    const char* s = std::getenv("K3_QUANT_MOE");
    if (!s) return -1;
    if (std::strcmp(s, "gemv") == 0) return static_cast<int>(QuantMoeKernels::PerPair);
    if (std::strcmp(s, "grouped") == 0) return static_cast<int>(QuantMoeKernels::Grouped);
    if (std::strcmp(s, "tc") == 0) return static_cast<int>(QuantMoeKernels::Tiles);
    if (std::strcmp(s, "mma") == 0) return static_cast<int>(QuantMoeKernels::Mma);
    return -1;
  }();
  return m;
}

}  // namespace

QuantMoeKernels quant_moe_choice(const ExpertStack& w, int n, int K) {
  const int mode = quant_moe_mode();
  QuantMoeKernels k;
  if (mode >= 0)
    k = static_cast<QuantMoeKernels>(mode);
  else
    k = 2 * static_cast<int64_t>(n) * K >= static_cast<int64_t>(kTcHalfPairsPerExpert) * w.E ? QuantMoeKernels::Tiles : QuantMoeKernels::Grouped;
  // The tensor-core decode tiles (quant_moe_mma) between 1 and 12 pairs per expert (CudaQuantMoe.TimingAtKimiLinearShape,
  // H200 call s29-4, 256 x 2304 x 1024 Q4_K / Q6_K, us a layer: 1 pair 673 vs grouped 831; 2: 903 vs 1526 and tiles
  // 1761; 8: 1493 vs tiles 2055; 16: 2510 vs tiles 2192), and end to end (the Kimi-Linear slice's Q4_K_M, x split):
  // batch 64 (2 pairs) 10183 vs 7816 tok/s, but batch 8 (0.25 pairs) 4425 vs 4824 and batch 1 1085 vs 1146 -- below one
  // pair per expert the fp32 grouped kernels keep it.
  const int64_t P = static_cast<int64_t>(n) * K;
  const int mma = quant_moe_mma_mode();
  if (quant_moe_mma_supported(w) && mma != 0 &&
      (mma == 1 || k == QuantMoeKernels::Mma || (mode < 0 && P >= w.E && P < 12 * static_cast<int64_t>(w.E))))
    return QuantMoeKernels::Mma;
  if (k == QuantMoeKernels::Mma) k = QuantMoeKernels::Grouped;
  return k == QuantMoeKernels::Grouped && !quant_moe_grouped_supported(w) ? QuantMoeKernels::PerPair : k;
}

cudaError_t quant_moe_experts(const ExpertStack& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                              GluAct act, float situ_beta, float situ_linear_beta, float* hidden, float* out, cudaStream_t s) {
  const int E = w.E, I = w.I, X = w.X;
  const WeightFormat df = expert_down_format(w);
  if (!is_gguf_block(w.format) || n < 0 || K <= 0 || E <= 0 || I <= 0 || X <= 0) return cudaErrorInvalidValue;
  if (X % weight_layout(w.format).block_elems != 0 || I % weight_layout(df).block_elems != 0 ||
      reinterpret_cast<uintptr_t>(x) % 4 != 0 || reinterpret_cast<uintptr_t>(hidden) % 4 != 0)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const IqTables T = iq_tables();
  const int64_t pairs = static_cast<int64_t>(n) * K;
  const cudaError_t e = with_gguf_format(w.format, [&](auto f) {
    constexpr WeightFormat F = decltype(f)::value;
    (void)pdl::launch(gate_up_kernel<F>, warp_blocks(pairs * I), kWarps * 32, 0, s, static_cast<const uint8_t*>(w.gate), static_cast<const uint8_t*>(w.up),
                                                                     E, I, X, K, pairs, x, topk_idx, act, situ_beta,
                                                                     situ_linear_beta, hidden, T);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  return with_gguf_format(df, [&](auto f) {
    constexpr WeightFormat F = decltype(f)::value;
    (void)pdl::launch(down_kernel<F>, warp_blocks(static_cast<int64_t>(n) * X), kWarps * 32, 0, s, static_cast<const uint8_t*>(w.down), E, I, X, K,
                                                                                     n, topk_idx, topk_w, hidden, out, T);
    return cudaGetLastError();
  });
}

}  // namespace k3::cuda
