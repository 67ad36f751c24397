// quant_dequant_rows / quant_dequant_rows_bf16 (quant_kernels.h): GGUF blocks to fp32 (or bf16) rows, one
// thread per group of 8 weights (qdev::decode8: the CPU's dequant_row, bit for bit; bf16 then rounds to
// nearest even), a grid-stride loop over (row, group).
#include <cuda_bf16.h>

#include <algorithm>

#include "k3/backend/cuda/quant_decode.cuh"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

__device__ __forceinline__ void store8(float* o, const float (&w)[8]) {
#pragma unroll
  for (int j = 0; j < 8; ++j) o[j] = w[j];
}
// bf16 of w at o (16 bytes: o is 16-byte aligned) and, when lo is set, bf16 of the residuals w - hi at lo.
__device__ __forceinline__ void store8(uint16_t* o, const float (&w)[8], uint16_t* lo = nullptr) {
  __nv_bfloat162 h[4];
  uint32_t v[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    h[j] = __floats2bfloat162_rn(w[2 * j], w[2 * j + 1]);
    v[j] = *reinterpret_cast<const uint32_t*>(&h[j]);
  }
  *reinterpret_cast<uint4*>(o) = make_uint4(v[0], v[1], v[2], v[3]);
  if (!lo) return;  // the residuals only where the caller splits
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(w[2 * j] - __low2float(h[j]), w[2 * j + 1] - __high2float(h[j]));
    v[j] = *reinterpret_cast<const uint32_t*>(&r);
  }
  *reinterpret_cast<uint4*>(lo) = make_uint4(v[0], v[1], v[2], v[3]);
}

template <WeightFormat F, typename Out>
__global__ void dequant_rows_kernel(const uint8_t* __restrict__ W, int64_t cols, int64_t row0, const int32_t* __restrict__ ids,
                                    int64_t count, Out* __restrict__ out, Out* __restrict__ lo, int64_t ld, IqTables T) {
  pdl::begin();  // pdl-launched (pdl.cuh): nothing read before the predecessor completes
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes, kGroups = E / 8;
  const int64_t per_row = cols / 8, row_bytes = cols / E * B, total = count * per_row;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / per_row, gi = i % per_row;
    const int64_t src = ids ? ids[r] : row0 + r;
    float w[8];
    qdev::decode8<F>(W + src * row_bytes + (gi / kGroups) * B, static_cast<int>(gi % kGroups), T, w);
    if constexpr (sizeof(Out) == 2)
      store8(out + r * ld + gi * 8, w, lo ? lo + r * ld + gi * 8 : nullptr);
    else
      store8(out + r * ld + gi * 8, w);
  }
}

// The one launch of both entry points (arguments checked by the caller): a grid-stride loop over (row, group).
template <typename Out>
cudaError_t launch_dequant(const WeightMatrix& W, int64_t row0, const int32_t* ids, int64_t count, Out* out, Out* lo, int64_t ld,
                           cudaStream_t s) {
  if (count == 0 || W.cols == 0) return cudaSuccess;
  const IqTables T = iq_tables();
  const int64_t total = count * (W.cols / 8);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 132 * 32));
  return with_gguf_format(W.format, [&](auto f) {
    (void)pdl::launch(dequant_rows_kernel<decltype(f)::value, Out>, blocks, 256, 0, s, static_cast<const uint8_t*>(W.data), W.cols, row0, ids,
                                                                       count, out, lo, ld, T);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t quant_dequant_rows(const WeightMatrix& W, int64_t row0, const int32_t* ids, int64_t count, float* out, int64_t ld,
                               cudaStream_t s) {
  if (!is_gguf_block(W.format) || count < 0 || row0 < 0 || ld < W.cols || W.cols % weight_layout(W.format).block_elems != 0 ||
      (!ids && row0 + count > W.rows) || reinterpret_cast<uintptr_t>(W.data) % 2 != 0)
    return cudaErrorInvalidValue;
  return launch_dequant<float>(W, row0, ids, count, out, nullptr, ld, s);
}

cudaError_t quant_dequant_rows_bf16(const WeightMatrix& W, int64_t row0, int64_t count, uint16_t* out, cudaStream_t s, uint16_t* lo) {
  if (!is_gguf_block(W.format) || count < 0 || row0 < 0 || row0 + count > W.rows || W.cols % weight_layout(W.format).block_elems != 0 ||
      reinterpret_cast<uintptr_t>(W.data) % 2 != 0 || reinterpret_cast<uintptr_t>(out) % 16 != 0 || reinterpret_cast<uintptr_t>(lo) % 16 != 0)
    return cudaErrorInvalidValue;
  return launch_dequant<uint16_t>(W, row0, nullptr, count, out, lo, W.cols, s);
}

}  // namespace k3::cuda
