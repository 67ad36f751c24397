// The drivers of a kernel tier whose matmuls convert the activations ONCE per call (avx512bf16: bf16 pairs,
// int8 quads; weight_kernels.h's optional matmul / act_bytes / prepare / rows): the scratch buffer, the
// entry points dot / gemm / matmul built from a Path's conversion and its rows over converted tokens, and
// the RowKernels that holds them. Plain code (no target pragma), so that no inline function of a standard
// header is instantiated with EVEX code; the Path's functions are the tier's compiled-for-the-tier kernels.
//
// A Path is a struct with three static functions:
//   int64_t stride_bytes(int64_t cols)                       bytes of one converted token
//   void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out)   n tokens converted
//   void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy)
// Include only from the tier's files (weight_kernels_avx512bf16.cpp, weight_kernels_quant_vnni.cpp).
#pragma once
#include <cstdint>
#include <vector>

#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/thread_pool.h"

namespace k3::cpu::act_path {

// The converted activations of the current call, one buffer per thread (a matmul converts on the calling
// thread; pool workers only read it while the caller waits). Grows to the largest call, never shrinks:
// at most about half the size of the fp32 activations it was made from.
inline uint8_t* scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

template <class Path>
float dot(const WeightMatrix& W, int64_t r, const float* x) {
  uint8_t* act = scratch(static_cast<size_t>(Path::stride_bytes(W.cols)));
  Path::prepare(x, 1, W.cols, act);
  float y = 0;
  Path::rows(W, r, r + 1, act, 1, &y, 1);
  return y;
}

template <class Path>
void gemm(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  uint8_t* act = scratch(static_cast<size_t>(n * Path::stride_bytes(W.cols)));
  Path::prepare(x, n, W.cols, act);
  Path::rows(W, r0, r1, act, n, y + r0, W.rows);
}

// When a matmul converts its tokens over the pool (many tokens), and when it splits its rows over the pool (the
// thresholds of ops.cpp's matmul). Shared with tiers that build their own matmul (amx).
inline bool convert_over_pool(int64_t n, int64_t cols) { return n > 1 && n * cols > 65536; }
inline bool rows_over_pool(int64_t rows, int64_t cols, int64_t n) {
  return rows > 1 && (n == 1 ? rows * cols > 32768 : rows * cols * n > 65536);
}

// The whole matmul: activations converted once (split over tokens when there are many), then the rows split
// over the pool.
template <class Path>
void matmul(const WeightMatrix& W, const float* x, int64_t n, float* y) {
  const int64_t rows = W.rows, cols = W.cols, stride = Path::stride_bytes(cols);
  uint8_t* act = scratch(static_cast<size_t>(n * stride));
  if (convert_over_pool(n, cols))
    ThreadPool::global().parallel_for(n, 0, [&](int64_t t0, int64_t t1, int) {
      Path::prepare(x + t0 * cols, t1 - t0, cols, act + t0 * stride);
    });
  else
    Path::prepare(x, n, cols, act);
  auto rows_range = [&](int64_t r0, int64_t r1, int) { Path::rows(W, r0, r1, act, n, y + r0, rows); };
  if (rows_over_pool(rows, cols, n))
    ThreadPool::global().parallel_for(rows, 0, rows_range);
  else
    rows_range(0, rows, 0);
}

template <class Path>
int64_t act_bytes(int64_t cols, int64_t n) { return n * Path::stride_bytes(cols); }

// The Path's kernels; dequant is `exact`'s (a tier's rounding is of the activations, never of the weights).
template <class Path>
constexpr RowKernels kernels(const RowKernels& exact) {
  return {dot<Path>, exact.dequant, gemm<Path>, matmul<Path>, act_bytes<Path>, Path::prepare, Path::rows};
}

}  // namespace k3::cpu::act_path
