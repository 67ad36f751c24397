// quant_gemv (quant_kernels.h): the decode GEMV over GGUF blocks.
//
// One warp per output row, 8 warps per block, as linear.cu's GEMV: lane l takes the groups of 8 weights
// gi = l, l + 32, ... of the row (for 256-element formats one warp pass is one block, lane l decoding its
// group l), decodes them in registers (qdev::decode8: the CPU's exact values) and applies them to all n
// tokens, so the blocks are read once per call. fp32 products and accumulation; lane sums are reduced by
// warp shuffles. Error: each output is a sum of cols fp32 products, cols / 32 of them accumulated in
// sequence per lane plus 5 shuffle adds, so |y - exact| <= (cols / 32 + 5) * 2^-24 * sum |w x| to first
// order (the bound the tests check, with a factor 2 of margin).
#include "k3/backend/cuda/quant_decode.cuh"
#include "k3/backend/cuda/quant_kernels.h"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;

template <WeightFormat F, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_kernel(const uint8_t* __restrict__ W, int64_t rows, int64_t cols, const float* __restrict__ x,
                      float* __restrict__ y, IqTables T) {
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;  // then so is every c = 8 gi of every token (cols % 32 == 0)
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes, kGroups = E / 8;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const uint8_t* wr = W + row * (cols / E) * B;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  const int64_t groups = cols / 8;
  for (int64_t gi = lane; gi < groups; gi += 32) {
    float w[8];
    qdev::decode8<F>(wr + (gi / kGroups) * B, static_cast<int>(gi % kGroups), T, w);
    const int64_t c = gi * 8;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float v[8];
      qdev::load_x8(x + t * cols + c, x_aligned, v);
      float s = acc[t];
#pragma unroll
      for (int j = 0; j < 8; ++j) s = fmaf(w[j], v[j], s);
      acc[t] = s;
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[t * rows + row] = v;
  }
}

template <WeightFormat F, int NT>
cudaError_t launch(const WeightMatrix& W, const float* x, float* y, cudaStream_t s, const IqTables& T) {
  const unsigned grid = static_cast<unsigned>((W.rows + kWarps - 1) / kWarps);
  quant_gemv_kernel<F, NT><<<grid, kWarps * 32, 0, s>>>(static_cast<const uint8_t*>(W.data), W.rows, W.cols, x, y, T);
  return cudaGetLastError();
}

template <WeightFormat F>
cudaError_t launch_n(const WeightMatrix& W, const float* x, int n, float* y, cudaStream_t s, const IqTables& T) {
  switch (n) {
    case 1: return launch<F, 1>(W, x, y, s, T);
    case 2: return launch<F, 2>(W, x, y, s, T);
    case 3: return launch<F, 3>(W, x, y, s, T);
    case 4: return launch<F, 4>(W, x, y, s, T);
    case 5: return launch<F, 5>(W, x, y, s, T);
    case 6: return launch<F, 6>(W, x, y, s, T);
    case 7: return launch<F, 7>(W, x, y, s, T);
    case 8: return launch<F, 8>(W, x, y, s, T);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t quant_gemv(const WeightMatrix& W, const float* x, int n, float* y, cudaStream_t s) {
  if (!is_gguf_block(W.format) || n < 0 || n > 8 || W.rows < 0 || W.cols % weight_layout(W.format).block_elems != 0)
    return cudaErrorInvalidValue;
  if (n == 0 || W.rows == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(W.data) % 2 != 0 || reinterpret_cast<uintptr_t>(x) % 4 != 0) return cudaErrorInvalidValue;
  const IqTables T = iq_tables();
  return with_gguf_format(W.format, [&](auto f) { return launch_n<decltype(f)::value>(W, x, n, y, s, T); });
}

}  // namespace k3::cuda
