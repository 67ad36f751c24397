// The CPU backend's kernels per weight format, and its one dispatch point on WeightFormat: matmul,
// row_dot and dequant_row (ops.h) look up a format's RowKernels here once per call. Adding a format =
// its dot and dequant in weight_kernels.cpp, its gemm in weight_gemm.cpp, the same in each other tier
// (weight_kernels_avx512.cpp, weight_kernels_avx512bf16.cpp), one case in the tier tables of weight_kernels.cpp and
// tests in test_cpu_kernels.
#pragma once
#include <cstdint>
#include <optional>

#include "k3/core/error.h"
#include "k3/core/weight.h"

namespace k3::cpu {

// THE CONTRACT (batch invariance; CpuKernels.Matmul*): every output element is computed with exactly the
// same arithmetic whatever the number of tokens n, i.e. gemm's y[t][r] has the bits of dot(W, r, x_t).
// The serving engine, prefix caching and the goldens (prefill vs --decode logits) rely on it. So gemm may
// only change the loop nest around dot's per-(row, token) accumulation -- same lanes, same number of
// accumulators, same reduction and scalar tail -- never the arithmetic itself (weight_gemm.cpp).
struct RowKernels {
  // Dot product of row r with x (W.cols values), fp32 accumulation.
  float (*dot)(const WeightMatrix& W, int64_t r, const float* x);
  // Row r converted to fp32 (W.cols values), exactly (for ops that need a row's values, dequant_row).
  void (*dequant)(const WeightMatrix& W, int64_t r, float* out);
  // Rows [r0, r1) against n tokens (x: [n][W.cols]): y[t * W.rows + r] = dot(W, r, x + t * W.cols), bit
  // for bit. Register-blocked tiles of rows x tokens, weights converted once per tile (weight_gemm.cpp).
  void (*gemm)(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y);
  // Optional (null: matmul() runs dot / gemm itself): the whole y = x W^T over n tokens, threads included,
  // for a tier that converts the activations once per call (avx512bf16: bf16 pairs, int8 blocks) instead
  // of once per row. Same contract: a token's outputs have the bits of dot(W, r, x_t).
  void (*matmul)(const WeightMatrix& W, const float* x, int64_t n, float* y);
  // Optional, with matmul: its two halves, for callers that run many matmuls in one fork-join
  // (ops.cpp matmul_batch): the bytes n converted tokens take, the conversion, and rows [r0, r1) over
  // converted tokens (y[t * ldy + r - r0]). prepare + rows give matmul's bits.
  int64_t (*act_bytes)(int64_t cols, int64_t n) = nullptr;
  void (*prepare)(const float* x, int64_t n, int64_t cols, uint8_t* out) = nullptr;
  void (*rows)(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) = nullptr;
};

enum class CpuIsa;
// Whether this build has kernels for a CPU tier (cpu_isa.h); row_kernels() uses the tier chosen at start-up.
bool isa_has_kernels(CpuIsa isa);

// The kernels of format f; throws k3::Error for a format this backend has none for.
const RowKernels& row_kernels(WeightFormat f);

// Tests only: row_kernels() serves tier `isa` from now on, for every thread (nullopt: back to the tier
// chosen at start-up), so that one process can check each tier and compare them. Throws k3::Error when
// the CPU cannot run the tier or this build has no kernels for it. Not for use while matmuls run.
void force_cpu_isa_for_testing(std::optional<CpuIsa> isa);
// The tier row_kernels() serves now: the forced one, else the one chosen at start-up.
CpuIsa active_tier_for_testing();

// fp32 dot product (two 8-lane accumulators, fma scalar tail): the f32 format's dot, also used by other
// CPU ops on rows they hold in fp32.
float dot_f32(const float* w, const float* x, int64_t n);

}  // namespace k3::cpu
