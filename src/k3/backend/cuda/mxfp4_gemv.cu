// MXFP4 / bf16 GEMV kernels (see mxfp4_gemv.h). W4A16-style: weights are dequantised in registers.
//
// MXFP4 layout per warp: each warp owns kRowsPerWarp rows; lane l handles groups g = l, l+32, ...
// of every one of its rows. One group = 32 weights = 16 packed bytes = one 16-byte load, so a warp's
// loads of a row are 512 contiguous bytes (coalesced) and each lane needs exactly one scale per load.
// E2M1 -> fp16 by bit placement (mxfp4_decode.cuh), two at a time as half2; the 2^14 is folded into
// the group scale. x is staged once per block in shared memory as fp32,
// padded by one float every 32 so that lanes reading different groups hit different banks.
#include "k3/backend/cuda/mxfp4_gemv.h"

#include "k3/backend/cuda/mxfp4_decode.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace k3::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarpsPerBlock * kRowsPerWarp;

__device__ __forceinline__ float load_x(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float load_x(const uint16_t* x, int64_t i) {
  return __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

// Dot of 8 E2M1 values packed in w (element 2i = low nibble of byte i) with xs[0..7] (shared, fp32).
__device__ __forceinline__ float dot8(uint32_t w, const float* xs) {
  uint32_t h[4];  // (elems 0, 4), (1, 5), (2, 6), (3, 7)
  e2m1x8_to_half2(w, h);
  const uint32_t e02 = h[0], o02 = h[1], e13 = h[2], o13 = h[3];
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&e02));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&o02));
  const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&e13));
  const float2 d = __half22float2(*reinterpret_cast<const __half2*>(&o13));
  float s = a.x * xs[0];
  s = fmaf(b.x, xs[1], s);
  s = fmaf(c.x, xs[2], s);
  s = fmaf(d.x, xs[3], s);
  s = fmaf(a.y, xs[4], s);
  s = fmaf(b.y, xs[5], s);
  s = fmaf(c.y, xs[6], s);
  s = fmaf(d.y, xs[7], s);
  return s;
}

template <typename XT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    mxfp4_gemv_kernel(const uint8_t* __restrict__ packed, const uint8_t* __restrict__ scales, int64_t rows,
                      int64_t cols, const XT* __restrict__ x, float* __restrict__ y) {
  pdl::begin();
  extern __shared__ float xs[];  // cols + cols/32 floats: element i at i + i/32
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) xs[i + (i >> 5)] = load_x(x, i);
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * kRowsPerWarp;
  if (row0 >= rows) return;
  const int64_t groups = cols >> 5;
  const uint4* prow[kRowsPerWarp];
  const uint8_t* srow[kRowsPerWarp];
  bool valid[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    valid[r] = row0 + r < rows;
    const int64_t rr = valid[r] ? row0 + r : row0;  // invalid rows re-read row0 (never stored)
    prow[r] = reinterpret_cast<const uint4*>(packed + rr * (cols >> 1));
    srow[r] = scales + rr * groups;
  }
  float acc[kRowsPerWarp] = {};
#pragma unroll 2
  for (int64_t g = lane; g < groups; g += 32) {
    uint4 q[kRowsPerWarp];
    uint32_t s[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      q[r] = __ldg(prow[r] + g);
      s[r] = __ldg(srow[r] + g);
    }
    const float* xg = xs + g * 33;
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      float gs = dot8(q[r].x, xg);
      gs += dot8(q[r].y, xg + 8);
      gs += dot8(q[r].z, xg + 16);
      gs += dot8(q[r].w, xg + 24);
      acc[r] = fmaf(gs, e8m0_scale_x2p14(s[r]), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && valid[r]) y[row0 + r] = v;
  }
}

// Dense bf16: lane l handles 8-element chunks c = l, l+32, ...; x read straight from global (L1-resident,
// coalesced: the warp's chunk reads are contiguous).
template <typename XT>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    bf16_gemv_kernel(const uint16_t* __restrict__ W, int64_t rows, int64_t cols, const XT* __restrict__ x,
                     float* __restrict__ y) {
  pdl::begin();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + warp) * kRowsPerWarp;
  if (row0 >= rows) return;
  const int64_t chunks = cols >> 3;
  const uint4* prow[kRowsPerWarp];
  bool valid[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    valid[r] = row0 + r < rows;
    prow[r] = reinterpret_cast<const uint4*>(W + (valid[r] ? row0 + r : row0) * cols);
  }
  float acc[kRowsPerWarp] = {};
#pragma unroll 2
  for (int64_t c = lane; c < chunks; c += 32) {
    uint4 q[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) q[r] = __ldg(prow[r] + c);
    float xv[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) xv[k] = load_x(x, c * 8 + k);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const uint32_t w4[4] = {q[r].x, q[r].y, q[r].z, q[r].w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 wf = bf16x2_to_float2(w4[k]);
        acc[r] = fmaf(wf.x, xv[2 * k], acc[r]);
        acc[r] = fmaf(wf.y, xv[2 * k + 1], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const float v = warp_sum(acc[r]);
    if (lane == 0 && valid[r]) y[row0 + r] = v;
  }
}

template <typename XT>
cudaError_t launch_mxfp4(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, const XT* x,
                         float* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || cols % 32 != 0 || (reinterpret_cast<uintptr_t>(packed) & 15u) != 0)
    return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(cols + cols / 32) * sizeof(float);
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(mxfp4_gemv_kernel<XT>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  (void)pdl::launch(mxfp4_gemv_kernel<XT>, static_cast<unsigned>(blocks), kWarpsPerBlock * 32, smem, stream, packed, scales, rows,
                                                                                              cols, x, y);
  return cudaGetLastError();
}

template <typename XT>
cudaError_t launch_bf16(const uint16_t* W, int64_t rows, int64_t cols, const XT* x, float* y, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || cols % 8 != 0 || (reinterpret_cast<uintptr_t>(W) & 15u) != 0)
    return cudaErrorInvalidValue;
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  (void)pdl::launch(bf16_gemv_kernel<XT>, static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream, W, rows, cols, x, y);
  return cudaGetLastError();
}

}  // namespace

cudaError_t mxfp4_gemv(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, const float* x,
                       float* y, cudaStream_t stream) {
  return launch_mxfp4(packed, scales, rows, cols, x, y, stream);
}
cudaError_t mxfp4_gemv(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, const uint16_t* x,
                       float* y, cudaStream_t stream) {
  return launch_mxfp4(packed, scales, rows, cols, x, y, stream);
}
cudaError_t bf16_gemv(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y, cudaStream_t stream) {
  return launch_bf16(W, rows, cols, x, y, stream);
}
cudaError_t bf16_gemv(const uint16_t* W, int64_t rows, int64_t cols, const uint16_t* x, float* y,
                      cudaStream_t stream) {
  return launch_bf16(W, rows, cols, x, y, stream);
}

}  // namespace k3::cuda
