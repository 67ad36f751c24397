#include "k3/backend/cpu/ops.h"

#include "k3/backend/cpu/act_convert_path.h"
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
    act_path::rows_over_pool_chunked(rows, W.bytes() / rows * n, rows_range);
  else
    rows_range(0, rows, 0);
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* out) {
  rmsnorm(x, w, n, dim, eps, dim, out);
}

namespace {
// Sum of squares in double over 4 x 4 lanes (then the lanes in a fixed order, then the tail): a decode step's
// one-row norms were a 2304-long chain of dependent double adds (~4.9 us each at 16 threads, 62 a Kimi-Linear
// step: call s46-1's profile); this is ~16x shorter. The order depends on nothing but dim.
double sum_squares(const float* x, int64_t dim) {
  __m256d acc[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
  int64_t i = 0;
  for (; i + 16 <= dim; i += 16)
    for (int j = 0; j < 4; ++j) {
      const __m256d v = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4 * j));
      acc[j] = _mm256_fmadd_pd(v, v, acc[j]);
    }
  alignas(32) double lanes[4][4];
  for (int j = 0; j < 4; ++j) _mm256_store_pd(lanes[j], acc[j]);
  double ss = 0;
  for (int l = 0; l < 4; ++l)
    for (int j = 0; j < 4; ++j) ss += lanes[j][l];
  for (; i < dim; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}
}  // namespace

// Rows in parallel when there are many (prefill); a row's arithmetic is the same on any thread.
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, int64_t stride, float* out) {
  parallel_for(n, n * dim > 65536, [&](int64_t t) {
    const float* xr = x + t * stride;
    float* o = out + t * stride;
    const double ss = sum_squares(xr, dim);
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
