// CUDA matrix-vector products for the decode path (one token): y[rows] = W x, fp32 accumulate, fp32 out.
// W is an MXFP4 weight (model-spec section 4: packed U8 [rows][cols/2], low nibble = even element;
// E8M0 scales U8 [rows][cols/32]) or a dense bf16 weight [rows][cols]. x is fp32 or bf16.
// All pointers are device pointers; the kernels are enqueued on `stream` and the call returns the
// launch status (cudaSuccess, or cudaErrorInvalidValue for unsupported shapes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// MXFP4: cols must be a multiple of 32 and packed 16-byte aligned (true for cudaMalloc'd weights).
cudaError_t mxfp4_gemv(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, const float* x,
                       float* y, cudaStream_t stream);
cudaError_t mxfp4_gemv(const uint8_t* packed, const uint8_t* scales, int64_t rows, int64_t cols, const uint16_t* x_bf16,
                       float* y, cudaStream_t stream);
// Dense bf16: cols must be a multiple of 8 and W 16-byte aligned.
cudaError_t bf16_gemv(const uint16_t* W, int64_t rows, int64_t cols, const float* x, float* y, cudaStream_t stream);
cudaError_t bf16_gemv(const uint16_t* W, int64_t rows, int64_t cols, const uint16_t* x_bf16, float* y,
                      cudaStream_t stream);

}  // namespace k3::cuda
