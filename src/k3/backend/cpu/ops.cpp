#include "k3/backend/cpu/ops.h"

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

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* out) {
  rmsnorm(x, w, n, dim, eps, dim, out);
}

void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, int64_t stride, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * stride;
    float* o = out + t * stride;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(dim)) + eps);
    for (int64_t i = 0; i < dim; ++i) o[i] = xr[i] * inv * (w ? w[i] : 1.0f);
  }
}

void silu_glu(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void situ_glu(const float* gate, const float* up, int64_t count, float beta, float linear_beta, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = beta * std::tanh(g / beta) * sigmoidf(g) * (linear_beta * std::tanh(up[i] / linear_beta));
  }
}

}  // namespace k3::cpu
