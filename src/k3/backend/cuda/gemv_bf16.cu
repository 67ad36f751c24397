// The bf16 decode GEMV (gemv_bf16.h): split rows, every chunk's load in flight at once, PDL launch.
#include "k3/backend/cuda/gemv_bf16.h"

#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/bf16_dot.cuh"
#include "k3/backend/cuda/linear_skinny.h"  // kLinearGroupMax
#include "k3/backend/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;     // warps per block; a block holds 8 / split rows
constexpr int kChunks = 8;    // 16-byte loads a lane keeps in flight (32 registers)
constexpr int kChunkCols = 256;  // columns of one warp-wide chunk: 8 bf16 a lane
// Warps of one full wave on an H100 / H200 (132 SMs x 32 warps at this kernel's ~64 registers): a matrix with
// fewer rows than this is split further so that its loads spread over every SM. A constant, not the device's
// count, so that the split (and the bits) depend on the shape alone.
constexpr int64_t kWaveWarps = 132 * 32;

struct Bf16GemvArgs {
  const uint16_t* W[kLinearGroupMax];
  float* y[kLinearGroupMax];
  int64_t rows[kLinearGroupMax];
  int64_t first_block[kLinearGroupMax + 1];
  int split[kLinearGroupMax];
  int count;
};

// The NT tokens' products with one chunk (8 columns a lane at c).
template <int NT>
__device__ __forceinline__ void fma_chunk(const uint4 w, const float* __restrict__ x, int64_t cols, int64_t c,
                                          float (&acc)[NT]) {
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = fma8_bf16(w, ld_acts16(x + t * cols + c), ld_acts16(x + t * cols + c + 4), acc[t]);
}

// Block -> (matrix m, 8 / split rows); warp -> (row, sub = its share of the row's chunks: sub, sub + split, ...).
template <int NT>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_bf16_kernel(const Bf16GemvArgs a, int64_t cols, const float* __restrict__ x) {
  __shared__ float part[kWarps][NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int m = 0;  // block-uniform
  while (m + 1 < a.count && static_cast<int64_t>(blockIdx.x) >= a.first_block[m + 1]) ++m;
  const int split = a.split[m], sub = warp & (split - 1);
  const int64_t rows = a.rows[m];
  const int64_t row = (static_cast<int64_t>(blockIdx.x) - a.first_block[m]) * (kWarps / split) + warp / split;
  const bool ok = row < rows;
  const uint16_t* wr = a.W[m] + (ok ? row : 0) * cols;
  const int64_t chunks = (cols + kChunkCols - 1) / kChunkCols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  // Before griddepcontrol.wait only the first batch's weights are requested, into L2 (ptxas sinks register loads
  // below the wait: SASS, session 42); the loads proper follow the wait and find them there.
  for (int u = 0; u < kChunks; ++u) {
    const int64_t c = (sub + static_cast<int64_t>(u) * split) * kChunkCols + lane * 8;
    if (ok && c < cols && (lane & 7) == 0) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(wr + c));
  }
  pdl::begin();
  for (int64_t j0 = sub; j0 < chunks; j0 += static_cast<int64_t>(kChunks) * split) {
    // Every load of the batch unconditional (columns clamped into the row: a chunk past the row reads the row's
    // last 8 columns and is not multiplied), all issued before the first multiply (bf16_dot.cuh).
    uint4 w[kChunks];
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = (j0 + static_cast<int64_t>(u) * split) * kChunkCols + lane * 8;
      w[u] = ld_weights16(wr + (c < cols ? c : cols - 8));
    }
    if constexpr (NT == 1) {  // decode's case: x's chunks in flight together too (64 registers)
      float4 xa[kChunks], xb[kChunks];
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int64_t c = (j0 + static_cast<int64_t>(u) * split) * kChunkCols + lane * 8, cc = c < cols ? c : cols - 8;
        xa[u] = ld_acts16(x + cc);
        xb[u] = ld_acts16(x + cc + 4);
      }
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int64_t c = (j0 + static_cast<int64_t>(u) * split) * kChunkCols + lane * 8;
        if (ok && c < cols) acc[0] = fma8_bf16(w[u], xa[u], xb[u], acc[0]);
      }
    } else {
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int64_t c = (j0 + static_cast<int64_t>(u) * split) * kChunkCols + lane * 8;
        if (ok && c < cols) fma_chunk<NT>(w[u], x, cols, c, acc);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t)
    for (int o = 16; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
  if (split > 1) {  // block-uniform: every warp reaches the barrier
    if (lane == 0)
#pragma unroll
      for (int t = 0; t < NT; ++t) part[warp][t] = acc[t];
    __syncthreads();
    if (sub != 0) return;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float s = part[warp][t];
      for (int k = 1; k < split; ++k) s += part[warp + k][t];
      acc[t] = s;
    }
  }
  if (!ok) return;
  float* y = a.y[m];
#pragma unroll
  for (int t = 0; t < NT; ++t)
    if (lane == t) y[t * rows + row] = acc[t];
}

bool v1_requested() {
  static const bool v1 = [] {
    const char* e = std::getenv("K3_GEMV_V1");
    return e != nullptr && std::strcmp(e, "1") == 0;
  }();
  return v1;
}

}  // namespace

int gemv_bf16_split(int64_t rows, int64_t cols) {
  const int64_t chunks = (cols + kChunkCols - 1) / kChunkCols;
  int split = 1;
  while (split < kWarps && chunks >= 2 * split &&
         ((chunks + split - 1) / split > kChunks || rows * split < kWaveWarps))
    split *= 2;
  return split;
}

bool gemv_bf16_applies(int64_t cols, const float* x, const void* const* W, int count) {
  if (v1_requested() || cols <= 0 || cols % 8 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0) return false;
  for (int m = 0; m < count; ++m)
    if (reinterpret_cast<uintptr_t>(W[m]) % 16 != 0) return false;
  return true;
}

cudaError_t gemv_bf16_group(const uint16_t* const* W, const int64_t* rows, float* const* y, int count, int64_t cols,
                            const float* x, int n, cudaStream_t s) {
  if (count < 1 || count > kLinearGroupMax || n < 1 || n > 8 || cols <= 0 || cols % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return cudaErrorInvalidValue;
  Bf16GemvArgs a{};
  int64_t blocks = 0;
  for (int m = 0; m < count; ++m) {
    if (W[m] == nullptr || y[m] == nullptr || rows[m] <= 0 || reinterpret_cast<uintptr_t>(W[m]) % 16 != 0)
      return cudaErrorInvalidValue;
    a.W[m] = W[m];
    a.y[m] = y[m];
    a.rows[m] = rows[m];
    a.split[m] = gemv_bf16_split(rows[m], cols);
    a.first_block[m] = blocks;
    const int per_block = kWarps / a.split[m];
    blocks += (rows[m] + per_block - 1) / per_block;
  }
  a.first_block[count] = blocks;
  a.count = count;
  const dim3 grid(static_cast<unsigned>(blocks));
  switch (n) {
    case 1: return pdl::launch(gemv_bf16_kernel<1>, grid, kWarps * 32, 0, s, a, cols, x);
    case 2: return pdl::launch(gemv_bf16_kernel<2>, grid, kWarps * 32, 0, s, a, cols, x);
    case 3: return pdl::launch(gemv_bf16_kernel<3>, grid, kWarps * 32, 0, s, a, cols, x);
    case 4: return pdl::launch(gemv_bf16_kernel<4>, grid, kWarps * 32, 0, s, a, cols, x);
    case 5: return pdl::launch(gemv_bf16_kernel<5>, grid, kWarps * 32, 0, s, a, cols, x);
    case 6: return pdl::launch(gemv_bf16_kernel<6>, grid, kWarps * 32, 0, s, a, cols, x);
    case 7: return pdl::launch(gemv_bf16_kernel<7>, grid, kWarps * 32, 0, s, a, cols, x);
    default: return pdl::launch(gemv_bf16_kernel<8>, grid, kWarps * 32, 0, s, a, cols, x);
  }
}

}  // namespace k3::cuda
