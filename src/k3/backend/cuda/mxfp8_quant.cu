// quantize_mxfp8_rows and fake_quant_mxfp8_rows (mxfp8_quant.h).
#include "k3/backend/cuda/mxfp8_quant.h"

#include "k3/backend/cuda/cache_dtype.cuh"
#include "k3/backend/cuda/mxfp8_quant.cuh"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;

__global__ void __launch_bounds__(kWarps * 32) quantize_rows_kernel(const float* __restrict__ x, int64_t blocks,
                                                                    uint8_t* __restrict__ codes, uint8_t* __restrict__ scales) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (b >= blocks) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const float v = x[b * 32 + lane];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // fmaxf drops NaN
  const uint32_t s = mxfp8::scale_byte(amax);
  codes[b * 32 + lane] = mxfp8::code(v, mxfp8::inverse_scale(s));
  if (lane == 0) scales[b] = static_cast<uint8_t>(s);
}

// One warp per 32-value block of a row (the row's last block may be short: mxfp8::fake_quant_warp). The dequantised
// value is exact in float (mxfp8.cpp's fake_quant_block says why).
__global__ void __launch_bounds__(kWarps * 32) fake_quant_rows_kernel(const float* x, float* out, int64_t rows,
                                                                      int64_t cols, int64_t row_blocks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (b >= rows * row_blocks) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t r = b / row_blocks, c = (b - r * row_blocks) * 32 + lane;
  const bool in = c < cols;
  const float q = mxfp8::fake_quant_warp(in ? x[r * cols + c] : 0.f);
  if (in) out[r * cols + c] = q;
}

}  // namespace

cudaError_t fake_quant_mxfp8_rows(const float* x, float* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows < 0 || cols < 1 || !x || !out) return cudaErrorInvalidValue;
  const int64_t row_blocks = (cols + 31) / 32, warps = rows * row_blocks;
  if (warps == 0) return cudaSuccess;
  const int64_t grid = (warps + kWarps - 1) / kWarps;
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  fake_quant_rows_kernel<<<static_cast<unsigned>(grid), kWarps * 32, 0, stream>>>(x, out, rows, cols, row_blocks);
  return cudaGetLastError();
}

cudaError_t quantize_mxfp8_rows(const float* x, int64_t rows, int64_t cols, uint8_t* codes, uint8_t* scales,
                                cudaStream_t stream) {
  if (rows < 0 || cols < 0 || cols % 32 != 0) return cudaErrorInvalidValue;
  const int64_t blocks = rows * cols / 32;
  if (blocks == 0) return cudaSuccess;
  const int64_t grid = (blocks + kWarps - 1) / kWarps;
  quantize_rows_kernel<<<static_cast<unsigned>(grid), kWarps * 32, 0, stream>>>(x, blocks, codes, scales);
  return cudaGetLastError();
}

}  // namespace k3::cuda
