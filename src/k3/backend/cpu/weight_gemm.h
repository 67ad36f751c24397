// The CPU backend's multi-token kernels (matmul with n > 1), one per weight format: rows [r0, r1) of W
// against n tokens (x: [n][W.cols]), y[t * W.rows + r]. Private to weight_kernels.cpp, which puts them in
// RowKernels::gemm; the contract (every output bit-identical to the single-token dot) is stated there.
#pragma once
#include <cstdint>

#include "k3/core/weight.h"

namespace k3::cpu {

void gemm_f32(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y);
void gemm_bf16(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y);
void gemm_f16(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y);
void gemm_mxfp4(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y);
void gemm_mxfp4_ggml(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y);

}  // namespace k3::cpu
