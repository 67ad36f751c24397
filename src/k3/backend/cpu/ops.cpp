#include "k3/backend/cpu/ops.h"

#include "k3/backend/cpu/vec_math.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace k3::cpu {

float row_dot(const WeightMatrix& W, int64_t r, const float* x) { return row_kernels(W.format).dot(W, r, x); }

void dequant_row(const WeightMatrix& W, int64_t r, float* out) { row_kernels(W.format).dequant(W, r, out); }

// Batch-invariant: every output element is computed with the same arithmetic whatever n is (a token's
// result does not depend on which other tokens share the call), so batching and chunked prefill never
// change numerics.
void matmul(const WeightMatrix& W, const float* x, int64_t n, float* y) {
  const int64_t rows = W.rows, cols = W.cols;
  const RowKernels& k = row_kernels(W.format);
  if (k.matmul) return k.matmul(W, x, n, y);  // the tier converts x once and threads itself (weight_kernels.h)
  if (n == 1) {
    // Matrix-vector: stream each row once, converting in registers.
    parallel_for(rows, rows * cols > 32768, [&](int64_t r) { y[r] = k.dot(W, r, x); });
    return;
  }
  // Several tokens: each thread takes ranges of rows and runs the format's register-blocked gemm over all
  // tokens (every output still bit-identical to the single-token dot above, weight_kernels.h).
  auto rows_range = [&](int64_t r0, int64_t r1, int) { k.gemm(W, r0, r1, x, n, y); };
  if (rows * cols * n > 65536)
    ThreadPool::global().parallel_for(rows, 0, rows_range);
  else
    rows_range(0, rows, 0);
}

namespace {

// The converted activations of matmul_batch's jobs, one buffer per calling thread that grows to the largest
// call and is reused (fresh vectors per job cost a zero-fill and page faults on every MoE layer: ~32 MB per
// layer at pp512 on kl-1b). Separate from act_path's scratch, which dot / gemm / matmul use.
uint8_t* batch_act_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < bytes) buf.resize(bytes);
  return buf.data();
}

}  // namespace

void matmul_batch(std::span<const MatmulJob> jobs) {
  // A tier that converts the activations once per call (RowKernels::prepare / rows: avx512bf16's bf16
  // pairs and int8 quads) gets each job's tokens converted once here, and its blocks run on them; driven
  // through dot / gemm it would convert them again for every row (a third of its decode time). Jobs with
  // the same input and the same conversion (an expert's gate and up) share one converted copy, and the
  // conversions run in parallel over token ranges (they were serial: ~2-4% of a prefill's wall time with 2
  // threads). A token's conversion is the same code whatever range it is in, so the bits are matmul's.
  struct Conversion {
    const float* x;
    int64_t n, cols;
    void (*prepare)(const float*, int64_t, int64_t, uint8_t*);
    int64_t stride;  // bytes per converted token
    size_t offset;   // into the scratch buffer
  };
  std::vector<Conversion> convs;
  std::vector<size_t> conv_of(jobs.size(), SIZE_MAX);
  size_t act_total = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const MatmulJob& j = jobs[i];
    const RowKernels& k = row_kernels(j.W->format);
    if (!k.prepare || j.n <= 0) continue;
    const int64_t cols = j.W->cols;
    for (size_t c = 0; c < convs.size() && conv_of[i] == SIZE_MAX; ++c)
      if (convs[c].x == j.x && convs[c].n == j.n && convs[c].cols == cols && convs[c].prepare == k.prepare) conv_of[i] = c;
    if (conv_of[i] != SIZE_MAX) continue;
    const int64_t stride = k.act_bytes(cols, 1);
    conv_of[i] = convs.size();
    convs.push_back({j.x, j.n, cols, k.prepare, stride, act_total});
    act_total += static_cast<size_t>(stride * j.n + 63) / 64 * 64;
  }
  uint8_t* act_base = convs.empty() ? nullptr : batch_act_scratch(act_total);
  {
    // Pieces of at most 16 tokens, so a few large conversions still spread over the threads.
    struct Piece {
      size_t conv;
      int64_t t0, t1;
    };
    std::vector<Piece> pieces;
    int64_t conv_values = 0;
    for (size_t c = 0; c < convs.size(); ++c) {
      conv_values += convs[c].n * convs[c].cols;
      for (int64_t t = 0; t < convs[c].n; t += 16) pieces.push_back({c, t, std::min(convs[c].n, t + 16)});
    }
    parallel_for(static_cast<int64_t>(pieces.size()), conv_values > 65536, [&](int64_t pi) {
      const Piece& p = pieces[static_cast<size_t>(pi)];
      const Conversion& cv = convs[p.conv];
      cv.prepare(cv.x + p.t0 * cv.cols, p.t1 - p.t0, cv.cols, act_base + cv.offset + p.t0 * cv.stride);
    });
  }
  struct Block {
    const MatmulJob* job;
    int64_t r0, r1;
  };
  int64_t total_bytes = 0;
  for (const MatmulJob& j : jobs) total_bytes += j.W->bytes() * std::max<int64_t>(j.n, 1);
  ThreadPool& pool = ThreadPool::global();
  // ~8 blocks per thread: enough for the dynamic hand-out to even out a slow thread, few enough that a
  // block (>= 16 rows) amortises its hand-out (one atomic add).
  const int64_t target = std::max<int64_t>(total_bytes / (8 * static_cast<int64_t>(pool.size())), 1);
  std::vector<Block> blocks;
  for (const MatmulJob& j : jobs) {
    if (j.n <= 0 || j.W->rows <= 0) continue;
    const int64_t row_bytes = std::max<int64_t>(j.W->bytes() / j.W->rows * j.n, 1);
    const int64_t rows_per = std::clamp<int64_t>(target / row_bytes, 16, j.W->rows);
    for (int64_t r = 0; r < j.W->rows; r += rows_per) blocks.push_back({&j, r, std::min(j.W->rows, r + rows_per)});
  }
  auto run = [&](int64_t b0, int64_t b1, int) {
    for (int64_t b = b0; b < b1; ++b) {
      const Block& bl = blocks[static_cast<size_t>(b)];
      const MatmulJob& j = *bl.job;
      const RowKernels& k = row_kernels(j.W->format);
      const size_t c = conv_of[static_cast<size_t>(bl.job - jobs.data())];
      if (c != SIZE_MAX)
        k.rows(*j.W, bl.r0, bl.r1, act_base + convs[c].offset, j.n, j.y + bl.r0, j.W->rows);
      else if (j.n == 1)
        for (int64_t r = bl.r0; r < bl.r1; ++r) j.y[r] = k.dot(*j.W, r, j.x);
      else
        k.gemm(*j.W, bl.r0, bl.r1, j.x, j.n, j.y);
    }
  };
  if (total_bytes > 32768 * 2)
    pool.parallel_for(static_cast<int64_t>(blocks.size()), 1, run);
  else
    run(0, static_cast<int64_t>(blocks.size()), 0);
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* out) {
  rmsnorm(x, w, n, dim, eps, dim, out);
}

// Rows in parallel when there are many (prefill); a row's arithmetic is the same on any thread.
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, int64_t stride, float* out) {
  parallel_for(n, n * dim > 65536, [&](int64_t t) {
    const float* xr = x + t * stride;
    float* o = out + t * stride;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * (w ? w[i] : 1.0f);
  });
}

namespace {
// zip8 over chunks of 16384 values in parallel when there are many (a prefill's dense GLU or output gate:
// ~1-3 M values). Chunks start at multiples of 8 and the function is per lane, so every element gets the
// arithmetic it gets in one zip8 call.
template <typename F>
void zip8_chunks(const float* a, const float* b, float* out, int64_t count, F&& fn) {
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  parallel_for(chunks, count > 4 * kChunk, [&](int64_t c) {
    const int64_t i = c * kChunk;
    zip8(a + i, b + i, out + i, std::min(kChunk, count - i), fn);
  });
}
}  // namespace

void silu_glu(const float* gate, const float* up, int64_t count, float* out) {
  zip8_chunks(gate, up, out, count, [](__m256 g, __m256 u) { return _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), u); });
}

void situ_glu(const float* gate, const float* up, int64_t count, float beta, float linear_beta, float* out) {
  const __m256 b = _mm256_set1_ps(beta), lb = _mm256_set1_ps(linear_beta);
  zip8_chunks(gate, up, out, count, [&](__m256 g, __m256 u) {
    const __m256 act = _mm256_mul_ps(_mm256_mul_ps(b, tanh8(_mm256_div_ps(g, b))), sigmoid8(g));
    return _mm256_mul_ps(act, _mm256_mul_ps(lb, tanh8(_mm256_div_ps(u, lb))));
  });
}

void sigmoid_inplace(float* x, int64_t count) {
  zip8_chunks(x, x, x, count, [](__m256 a, __m256) { return sigmoid8(a); });
}

void sigmoid_mul(float* y, const float* g, int64_t count) {
  zip8_chunks(y, g, y, count, [](__m256 a, __m256 s) { return _mm256_mul_ps(a, sigmoid8(s)); });
}

}  // namespace k3::cpu
