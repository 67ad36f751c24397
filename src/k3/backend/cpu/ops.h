// Dense CPU ops of the forward pass. fp32 activations and accumulation; weights in their stored format,
// converted in registers (AVX2+FMA) by the row kernels of weight_kernels.h. Multi-threaded with the
// thread pool over output rows.
#pragma once
#include <cstdint>
#include <functional>
#include <span>

#include "k3/core/weight.h"

namespace k3::cpu {

// y[n][W.rows] = x[n][W.cols] . W^T   (x and y must not alias)
void matmul(const WeightMatrix& W, const float* x, int64_t n, float* y);
// Several independent matmuls (a token's routed experts: each a few hundred KB, i.e. microseconds of
// memory traffic) in ONE fork-join: the rows of all jobs are cut into blocks of about equal weight bytes
// that the threads take in turn. Every output has the bits matmul(job) gives it (a row's result is the
// format's gemm / dot whatever block or thread computes it). Jobs must not write to each other's inputs.
struct MatmulJob {
  const WeightMatrix* W;
  const float* x;  // [n][W->cols]
  int64_t n;
  float* y;  // [n][W->rows]
};
void matmul_batch(std::span<const MatmulJob> jobs);
// Two dependent batches in ONE fork-join (matmul_batch.cpp): every job of `first`; for each group g in
// [0, groups), once all first-stage jobs with first_group[i] == g are done, between(g) on one thread (it may
// write the inputs of g's second-stage jobs: an expert's GLU); then the `second` jobs, job i once its group
// second_group[i] is through. At decode this halves the routed experts' fork-joins per layer and spreads the
// GLUs over the threads. Every output has the bits matmul(job) gives it.
void matmul_two_stage(std::span<const MatmulJob> first, std::span<const int> first_group, std::span<const MatmulJob> second,
                      std::span<const int> second_group, int groups, const std::function<void(int)>& between);
// Dot product of one weight row with x (cols values); the building block of matmul.
float row_dot(const WeightMatrix& W, int64_t row, const float* x);
// Dequantise one row into fp32 (cols values).
void dequant_row(const WeightMatrix& W, int64_t row, float* out);

// out[i] = x[i] * rsqrt(mean(x^2) + eps) * (w ? w[i] : 1), for n rows of dim values. out may alias x.
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* out);
// The same over the first `dim` values of n rows that are `stride` floats apart (in place allowed).
void rmsnorm(const float* x, const float* w, int64_t n, int64_t dim, float eps, int64_t stride, float* out);

// GLUs over [n][d]: out = act(gate) * up. out may alias gate.
void silu_glu(const float* gate, const float* up, int64_t count, float* out);
void situ_glu(const float* gate, const float* up, int64_t count, float beta, float linear_beta, float* out);

// x[i] = sigmoid(x[i]) (router scores, KDA beta).
void sigmoid_inplace(float* x, int64_t count);
// y[i] *= sigmoid(g[i]) (output gates).
void sigmoid_mul(float* y, const float* g, int64_t count);

inline float sigmoidf(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

}  // namespace k3::cpu
