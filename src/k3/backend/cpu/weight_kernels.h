// The CPU backend's kernels per weight format, and its one dispatch point on WeightFormat: matmul,
// row_dot and dequant_row (ops.h) look up a format's RowKernels here once per call. Adding a format =
// its three row functions in weight_kernels.cpp + one case in row_kernels() + tests in test_cpu_kernels.
#pragma once
#include <cstdint>

#include "k3/core/error.h"
#include "k3/core/weight.h"

namespace k3::cpu {

struct RowKernels {
  // Dot product of row r with x (W.cols values), fp32 accumulation.
  float (*dot)(const WeightMatrix& W, int64_t r, const float* x);
  // Row r converted to fp32 (W.cols values). For batch invariance, dot_f32(dequantised row, x) must give
  // the same bits as dot(W, r, x) (CpuKernels.Matmul*) unless the format has dot_multi.
  void (*dequant)(const WeightMatrix& W, int64_t r, float* out);
  // Optional: row r against nt tokens (x rows ldx apart), out[t * ldo] for t < nt, each token with exactly
  // dot's arithmetic. Null: matmul dequantises the row once per token block and uses dot_f32.
  void (*dot_multi)(const WeightMatrix& W, int64_t r, const float* x, int64_t ldx, int64_t nt, float* out, int64_t ldo);
  // Rows are fp32 in memory already: matmul reads them in place instead of dequantising.
  bool fp32_rows;
};

enum class CpuIsa;
// Whether this build has kernels for a CPU tier (cpu_isa.h); row_kernels() uses the tier chosen at start-up.
bool isa_has_kernels(CpuIsa isa);

// The kernels of format f; throws k3::Error for a format this backend has none for.
const RowKernels& row_kernels(WeightFormat f);

// fp32 dot product (two 8-lane accumulators, fma scalar tail): what every format's dequantised rows use.
float dot_f32(const float* w, const float* x, int64_t n);

}  // namespace k3::cpu
