// The bf16 GEMV of decode (1..8 tokens): y[m] = W[m] . x for a group of matrices of one width that share x.
//
// Why a second GEMV (linear.cu keeps the first for fp32 weights and K3_GEMV_V1=1): at batch 1 a Kimi-Linear-48B
// step is ~175 GEMV launches of 1-58 MB (call s42-1, ncu, H200): the first kernel, a warp per row looping over
// 512-byte chunks four at a time, took ~5 us beyond its bytes' time at every size (18.9 MB: 9.8 us for 4.5 of
// bytes; the 256-row router: 5.9 us for 1.2 MB on 32 SMs). A warp waited one DRAM round trip per four chunks, and
// short matrices left most SMs idle. Here:
//   - a row is split over `split` warps of its block (gemv_bf16_split: a function of the matrix's rows and
//     width only, so a matrix gets the same bits alone or in a group), each warp taking every split-th chunk;
//   - a lane issues all of its chunks' loads (up to 8 x 16 bytes) before its first multiply;
//   - the kernel is launched with programmatic dependent launch (pdl.cuh): the first loads, weights only, are
//     issued before griddepcontrol.wait, so they overlap the previous kernel's tail.
// Arithmetic: fp32 fmaf per lane over its chunks in order, a warp xor-tree, then the split warps' partial sums
// added in warp order: deterministic for a (rows, cols) shape.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace k3::cuda {

// Warps per row (1, 2, 4 or 8) for a bf16 matrix of `rows` x `cols`.
int gemv_bf16_split(int64_t rows, int64_t cols);

// y[m] [n][rows[m]] = x [n][cols] . W[m]^T for m < count (1..8), n in 1..8, cols % 8 == 0, x and every W[m] 16-byte
// aligned. cudaErrorInvalidValue otherwise.
cudaError_t gemv_bf16_group(const uint16_t* const* W, const int64_t* rows, float* const* y, int count, int64_t cols,
                            const float* x, int n, cudaStream_t s);

// Whether gemv_bf16_group takes this shape and x (the caller falls back to linear.cu's kernel otherwise), and
// whether K3_GEMV_V1=1 asked for the first kernel (the A/B switch).
bool gemv_bf16_applies(int64_t cols, const float* x, const void* const* W, int count);

}  // namespace k3::cuda
