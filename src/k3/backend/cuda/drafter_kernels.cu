// The block drafter's kernels (drafter_kernels.h). Blocks are a few rows (k3-tiny's drafter: 8; DSpark: 7),
// so one thread block per (block, head) holds its keys, values and scores in shared memory; the scores are
// fp32 dot products (the CPU reference accumulates in double: differences at fp32 rounding).
#include "k3/backend/cuda/drafter_kernels.h"

#include "k3/backend/cuda/warp_argmax.cuh"

namespace k3::cuda {
namespace {

__global__ void copy_rows_kernel(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t cols) {
  const int64_t r = blockIdx.x;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[r * dst_stride + c] = src[r * src_stride + c];
}

__global__ void block_attention_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                                       int block, int heads, int hd, float scale, float* __restrict__ o) {
  extern __shared__ float sm[];
  float* ks = sm;                  // [block][hd]
  float* vs = ks + block * hd;     // [block][hd]
  float* p = vs + block * hd;      // [block][block] scores, then probabilities
  const int b = blockIdx.x / heads, m = blockIdx.x % heads;
  const int64_t C = static_cast<int64_t>(heads) * hd, r0 = static_cast<int64_t>(b) * block, c0 = static_cast<int64_t>(m) * hd;
  for (int e = threadIdx.x; e < block * hd; e += blockDim.x) {
    const int64_t at = (r0 + e / hd) * C + c0 + e % hd;
    ks[e] = k[at];
    vs[e] = v[at];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < block * block; e += blockDim.x) {
    const int i = e / block, j = e % block;
    const float* qi = q + (r0 + i) * C + c0;
    float dot = 0.f;
    for (int d = 0; d < hd; ++d) dot = fmaf(qi[d], ks[j * hd + d], dot);
    p[e] = dot * scale;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < block; i += blockDim.x) {
    float* row = p + i * block;
    float mx = row[0];
    for (int j = 1; j < block; ++j) mx = fmaxf(mx, row[j]);
    float sum = 0.f;
    for (int j = 0; j < block; ++j) sum += (row[j] = expf(row[j] - mx));
    for (int j = 0; j < block; ++j) row[j] /= sum;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < block * hd; e += blockDim.x) {
    const int i = e / hd, d = e % hd;
    float acc = 0.f;
    for (int j = 0; j < block; ++j) acc = fmaf(p[i * block + j], vs[j * hd + d], acc);
    o[(r0 + i) * C + c0 + d] = acc;
  }
}

}  // namespace

cudaError_t copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int64_t cols,
                      cudaStream_t s) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  copy_rows_kernel<<<static_cast<unsigned>(rows), cols >= 256 ? 256 : 128, 0, s>>>(dst, dst_stride, src, src_stride, cols);
  return cudaGetLastError();
}

cudaError_t block_attention(const float* q, const float* k, const float* v, int64_t n, int block, int heads, int head_dim,
                            float scale, float* o, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (block < 1 || heads < 1 || head_dim < 1 || n % block != 0) return cudaErrorInvalidValue;
  const size_t smem = (2 * static_cast<size_t>(block) * head_dim + static_cast<size_t>(block) * block) * sizeof(float);
  const int64_t grid = n / block * heads;
  if (smem > 48 * 1024 || grid > 0x7fffffff) return cudaErrorInvalidValue;
  block_attention_kernel<<<static_cast<unsigned>(grid), 128, smem, s>>>(q, k, v, block, heads, head_dim, scale, o);
  return cudaGetLastError();
}

namespace {

constexpr int kArgmaxThreads = 256;

// One block per row: a strided scan per thread, then warps, then the block (8 warps' bests in smem).
__global__ void argmax_rows_kernel(const float* __restrict__ x, int64_t V, int32_t* __restrict__ ids) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * V;
  float bv = 0.f;
  int bi = -1;
  for (int64_t i = threadIdx.x; i < V; i += kArgmaxThreads)
    if (better(row[i], static_cast<int>(i), bv, bi)) bv = row[i], bi = static_cast<int>(i);
  warp_best(bv, bi);
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[w] = bv, si[w] = bi;
  __syncthreads();
  if (w == 0) {
    bv = lane < kArgmaxThreads / 32 ? sv[lane] : 0.f;
    bi = lane < kArgmaxThreads / 32 ? si[lane] : -1;
    warp_best(bv, bi);
    if (lane == 0) ids[blockIdx.x] = bi;
  }
}

}  // namespace

cudaError_t argmax_rows(const float* x, int64_t rows, int64_t V, int32_t* ids, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (V <= 0 || V > INT32_MAX || rows > INT32_MAX) return cudaErrorInvalidValue;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, s>>>(x, V, ids);
  return cudaGetLastError();
}

}  // namespace k3::cuda
