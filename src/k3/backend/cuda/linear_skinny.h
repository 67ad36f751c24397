// Dense projections for small batches on tensor cores: y[n][rows] = x[n][cols] . W^T for bf16 W and
// 2 <= n <= 32 tokens, W streamed from HBM once for all tokens (linear_skinny.cu says how).
//
// Why: the fp32 GEMV (linear.cu) reads W once but reloads x from L1 for every token and every 8 weights,
// so at n = 8 it is L1-bound at ~20% of HBM bandwidth (lm_head 163840 x 2304: 790 us vs 172 us at n = 1);
// above 8 tokens cuBLASLt in the bf16x2 mode reads W twice (one GEMM per half). Decode batches of 2..32
// sequences spend most of their dense time there.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3/core/weight.h"

namespace k3::cuda {

constexpr int kSkinnyMinTokens = 2;
constexpr int kSkinnyMaxTokens = 32;
// Up to this many tokens LinearRunner splits x inside the skinny kernel (linear_skinny_f32); above, the
// kernel is issue-bound (3-4 n8 tiles) and the in-kernel conversion, repeated by every block, cost more
// than the split launch it saves (H200, Kimi-Linear slice tg32, all fused: b32 -4..-6%). Up to 8 it is
// neutral end to end within the +-3% noise of two calls (one launch fewer per projection, same bits;
// docs/perf/cuda.md session 10).
constexpr int kSkinnyFusedMaxTokens = 8;
// Most matrices one grouped launch takes (linear_skinny_group, linear_gemv_group).
constexpr int kLinearGroupMax = 8;

// Whether linear_skinny handles this weight and batch: bf16, cols a multiple of 32, rows >= 1, 16-byte
// aligned data, kSkinnyMinTokens <= n <= kSkinnyMaxTokens.
bool linear_skinny_supported(const WeightMatrix& W, int64_t n);

// x given as bf16 hi and lo halves [n][cols] (x = hi + lo, from to_bf16_split; 16-byte aligned rows), so
// the result matches fp32 arithmetic to ~1e-6 relative; fp32 accumulation. cudaErrorInvalidValue when not
// linear_skinny_supported.
cudaError_t linear_skinny(const WeightMatrix& W, const uint16_t* x_hi, const uint16_t* x_lo, int n, float* y,
                          cudaStream_t s);

// The same product from the fp32 activations x [n][cols] (16-byte aligned), split into hi / lo inside the
// kernel with to_bf16_split's rounding: the same bits as to_bf16_split + linear_skinny, one launch.
// cudaErrorInvalidValue when not linear_skinny_supported or x is not 16-byte aligned.
cudaError_t linear_skinny_f32(const WeightMatrix& W, const float* x, int n, float* y, cudaStream_t s);

// Grouped forms: count (1..kLinearGroupMax) matrices that read the same x, y[m] = x . W[m]^T, in ONE launch
// (the projections of a layer that share their input: KDA's q / k / v / gates, MLA's q_a / kv_a / gate, a
// GLU's gate / up). Each W[m] as linear_skinny_supported, all of x's width; the bits of each y[m] equal
// linear_skinny's / linear_skinny_f32's for that matrix alone. Why: at 2..32 tokens a 4096 x 2304 projection
// takes ~11 us for ~4.5 us of bytes (ramp-up and tail of a small grid); one grid over all of a layer's rows
// keeps the SMs streaming across the matrices.
cudaError_t linear_skinny_group(const WeightMatrix* const* W, float* const* y, int count, const uint16_t* x_hi,
                                const uint16_t* x_lo, int n, cudaStream_t s);
cudaError_t linear_skinny_group_f32(const WeightMatrix* const* W, float* const* y, int count, const float* x, int n,
                                    cudaStream_t s);

}  // namespace k3::cuda
