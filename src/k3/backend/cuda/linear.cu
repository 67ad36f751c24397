// Dense projections (linear.h).
//
// GEMV path: one warp per output row, 8 warps per block. Lane l reads 8 consecutive weights (one
// 16-byte load for bf16, two for fp32) at columns 8l, 8l + 256, ... and applies them to all NT tokens,
// so W is streamed once for the whole group of tokens; x is read through L1 (it is small and shared by
// all warps of the SM). fp32 accumulation, warp-shuffle reduction. cols % 8 != 0 falls back to a
// scalar loop over columns.
#include "k3/backend/cuda/linear.h"

#include <string>

#include "k3/backend/cuda/dense_kernels.h"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

template <int NT, typename WT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const WT* __restrict__ W, int64_t rows, int64_t cols, const float* __restrict__ x,
                float* __restrict__ y) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (row >= rows) return;
  const WT* wr = W + row * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  if ((cols & 7) == 0) {
    for (int64_t c = lane * 8; c < cols; c += 256) {
      float w[8];
      if constexpr (sizeof(WT) == 2) {
        const uint4 v = *reinterpret_cast<const uint4*>(wr + c);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w[2 * i] = __uint_as_float(u[i] << 16);
          w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
      } else {
        const float4 a = *reinterpret_cast<const float4*>(wr + c);
        const float4 b = *reinterpret_cast<const float4*>(wr + c + 4);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4 xa = __ldg(reinterpret_cast<const float4*>(x + t * cols + c));
        const float4 xb = __ldg(reinterpret_cast<const float4*>(x + t * cols + c + 4));
        float s = acc[t];
        s = fmaf(w[0], xa.x, s); s = fmaf(w[1], xa.y, s); s = fmaf(w[2], xa.z, s); s = fmaf(w[3], xa.w, s);
        s = fmaf(w[4], xb.x, s); s = fmaf(w[5], xb.y, s); s = fmaf(w[6], xb.z, s); s = fmaf(w[7], xb.w, s);
        acc[t] = s;
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      float w;
      if constexpr (sizeof(WT) == 2) w = bf(wr[c]); else w = wr[c];
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] = fmaf(w, x[t * cols + c], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[t * rows + row] = v;
  }
}

template <typename WT>
cudaError_t launch_gemv(const WT* W, int64_t rows, int64_t cols, const float* x, int n, float* y, cudaStream_t s) {
  const unsigned grid = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  switch (n) {
    case 1: gemv_kernel<1, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 2: gemv_kernel<2, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 3: gemv_kernel<3, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 4: gemv_kernel<4, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 5: gemv_kernel<5, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 6: gemv_kernel<6, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 7: gemv_kernel<7, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    case 8: gemv_kernel<8, WT><<<grid, kWarps * 32, 0, s>>>(W, rows, cols, x, y); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t linear_gemv(const DeviceLinear& W, const float* x, int n, float* y, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (n > LinearRunner::kGemvMaxTokens) return cudaErrorInvalidValue;
  if (W.type == WType::BF16)
    return launch_gemv(static_cast<const uint16_t*>(W.w), W.rows, W.cols, x, n, y, s);
  return launch_gemv(static_cast<const float*>(W.w), W.rows, W.cols, x, n, y, s);
}

LinearRunner::LinearRunner(cudaStream_t stream, GemmPrecision precision) : stream_(stream), precision_(precision) {
  check_cublas(cublasCreate(&handle_), "cublasCreate");
  check_cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
  // A fixed workspace so that cuBLAS never allocates during a step (and CUDA graph capture works).
  workspace_ = DeviceBuffer(32u << 20);
  check_cublas(cublasSetWorkspace(handle_, workspace_.get(), workspace_.bytes()), "cublasSetWorkspace");
}

LinearRunner::~LinearRunner() {
  if (handle_) cublasDestroy(handle_);
}

void LinearRunner::run(const DeviceLinear& W, const float* x, int64_t n, float* y) {
  if (n <= 0) return;
  if (n <= kGemvMaxTokens) {
    K3_CUDA_CHECK(linear_gemv(W, x, static_cast<int>(n), y, stream_));
    return;
  }
  const int m = static_cast<int>(W.rows), k = static_cast<int>(W.cols), nn = static_cast<int>(n);
  const float one = 1.0f, zero = 0.0f;
  if (W.type == WType::F32) {
    // Column-major view: y^T [rows x n] = W^T(op T of the col-major [cols x rows]) . x^T [cols x n].
    check_cublas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, static_cast<const float*>(W.w), k, x, k,
                             &zero, y, m),
                 "cublasSgemm");
    return;
  }
  const size_t elems = static_cast<size_t>(n * W.cols), need = elems * 2 * 2;  // room for hi and lo
  if (xb_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued GEMM may still read the old buffer
    xb_ = DeviceBuffer(need * 2);                   // grows with the largest batch seen
  }
  uint16_t* hi = xb_.get<uint16_t>();
  uint16_t* lo = hi + elems;
  const bool split = precision_ == GemmPrecision::Bf16x2;
  if (split)
    K3_CUDA_CHECK(to_bf16_split(x, n * W.cols, hi, lo, stream_));
  else
    K3_CUDA_CHECK(to_bf16(x, n * W.cols, hi, stream_));
  check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, W.w, CUDA_R_16BF, k, hi, CUDA_R_16BF, k,
                            &zero, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
  if (split)
    check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, W.w, CUDA_R_16BF, k, lo, CUDA_R_16BF, k,
                              &one, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (lo)");
}

}  // namespace k3::cuda
