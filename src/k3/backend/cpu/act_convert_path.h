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
// Included by the tiers' files (weight_kernels_avx512bf16.cpp, weight_kernels_quant_vnni.cpp, weight_kernels_amx.cpp)
// and ops.cpp (the row chunking of its generic matmul).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
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

// Rows [0, rows) of a matmul over the pool in chunks of whole 16-row blocks and at least kMinChunkBytes of
// weights (x tokens), about four chunks per thread on big matrices; inline when that is one chunk. The pool's
// default grain (rows / (4 x threads)) gave a 64 x 2048 BF16 projection ONE row per chunk at 16 threads: 16
// threads woken for 4 KB each, the rows' 4- / 16-row kernels run one row at a time (158 us, 1.7 GB/s, against
// 39 us at 8 threads; docs/perf/cpu.md, session 25). A row's result does not depend on its chunk, so the bits
// do not change.
inline constexpr int64_t kMinChunkBytes = 64 * 1024;
// K3_ROW_CHUNKS=pool: the pool's default grain instead (the A/B switch of the measurement; same bits).
inline bool pool_default_row_chunks() {
  static const bool v = [] {
    const char* e = std::getenv("K3_ROW_CHUNKS");
    return e != nullptr && std::string(e) == "pool";
  }();
  return v;
}
template <class F>
void rows_over_pool_chunked(int64_t rows, int64_t bytes_per_row, F&& rows_range) {
  if (pool_default_row_chunks()) return ThreadPool::global().parallel_for(rows, 0, rows_range);
  const int64_t threads = ThreadPool::global().size();
  int64_t grain = std::max<int64_t>((rows + 4 * threads - 1) / (4 * threads),
                                    (kMinChunkBytes + bytes_per_row - 1) / std::max<int64_t>(bytes_per_row, 1));
  grain = (grain + 15) / 16 * 16;
  if (grain >= rows || threads == 1) return rows_range(0, rows, 0);
  ThreadPool::global().parallel_for(rows, grain, rows_range);
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
    rows_over_pool_chunked(rows, W.bytes() / rows * n, rows_range);
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
