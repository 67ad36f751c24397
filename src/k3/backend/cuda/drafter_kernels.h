// Kernels of the block drafter's ops (graph::Backend::block_attention and the strided / broadcast form of
// copy; docs/block-drafter.md). fp32, device pointers, enqueued on `stream`; each returns the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3::cuda {

// dst row r (dst_stride floats apart) = src row r (src_stride floats apart; 0: the same row for every r),
// `cols` floats each (CpuBackend::copy).
cudaError_t copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                      cudaStream_t s);

// cpu::block_attention (backend/cpu/block_attention.h): q, k, v, o [n][heads * head_dim] contiguous, non-causal
// softmax attention inside each block of `block` rows. One thread block per (block, head), the block's k and v
// in shared memory: cudaErrorInvalidValue when they do not fit (2 * block * head_dim + block^2 floats > 48 KiB).
cudaError_t block_attention(const float* q, const float* k, const float* v, int64_t n, int block, int heads, int head_dim,
                            float scale, float* o, cudaStream_t s);

// ids[r] = the index of row r's maximum (the lowest of equal maxima, as std::max_element), rows of V
// contiguous floats: a drafter's greedy drafts without copying its logits to the host.
cudaError_t argmax_rows(const float* x, int64_t rows, int64_t V, int32_t* ids, cudaStream_t s);

}  // namespace k3::cuda
