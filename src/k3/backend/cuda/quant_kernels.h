// CUDA kernels over GGUF's block formats, reading the stored blocks (quant_decode.cuh decodes them in
// registers, bit for bit the CPU's dequant_row). W is a device WeightMatrix of a GGUF block format
// (quant_tables.h: is_gguf_block), rows of row_data_bytes(format, cols) bytes, 2-byte aligned.
//   quant_gemv:         y[t][r] = sum_c W[r][c] x[t][c], t < n <= 8 (fp32 x and y): the decode path (LinearRunner
//                       takes quant_mma.h's tensor-core kernel instead for Q4_K / Q5_K / Q6_K batches of 2..64)
//   quant_dequant_rows: fp32 rows of W (a range, or picked by index): the embedding gather of a quantised
//                       token table
//   quant_dequant_rows_bf16: a range of rows rounded to bf16: the prefill path's tiles (LinearRunner::run)
// cudaErrorInvalidValue for a format without a kernel or a bad size.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "k3/core/weight.h"

namespace k3::cuda {

// Which of quant_gemv.cu's kernels runs (tests and A/B timing; Auto = the measured rule). A forced kernel that
// cannot run (a format without a part decoder, x not 16-byte aligned, blocks off their alignment) falls back to V1.
// V1Rows: v1 with 4 rows per warp (the activations loaded once for 4 rows; v1's bits), every format, at 8 tokens
// (other token counts run V1). Q8: one token of Q4_K / Q5_K / Q6_K through quant_gemv_q8 (int8 activations; below),
// the exact rule's kernel where it cannot run.
enum class QuantGemvKernel : int { Auto = 0, V1 = 1, V2 = 2, V3 = 3, V1Rows = 4, Q8 = 5 };
// Whether f has the wide-load part decoders v2 and v3 run (quant_part.cuh).
bool quant_gemv_has_parts(WeightFormat f);
cudaError_t quant_gemv(const WeightMatrix& W, const float* x, int n, float* y, cudaStream_t s,
                       QuantGemvKernel kernel = QuantGemvKernel::Auto);

// Grouped form: count (1..kQuantGemvGroupMax) matrices of ONE format and width that read the same x, y[m] = x . W[m]^T
// in one launch (the projections of a layer that share x: KDA's q / k / v / gates / beta, MLA's q / kv_a, a shared
// expert's gate / up). Groupable where quant_gemv would give each matrix the v3 kernel at n tokens (by the rule: one
// token, rows up to 4096 wide, x 16-byte aligned, blocks at their alignment; up to 8 tokens where K3_QUANT_GEMV=v3:N
// forces v3); each y[m] is then bit-equal to quant_gemv's. Why: a one-token projection of a few MB pays ~2.5 us of launch, ramp and tail
// (session 32's projection chain: 4096 x 2304 Q4_K 7.3 us where a plain read of its bytes takes 3.2).
constexpr int kQuantGemvGroupMax = 8;
bool quant_gemv_groupable(const WeightMatrix* const* W, int count, const float* x, int n);
// cudaErrorInvalidValue where !quant_gemv_groupable.
cudaError_t quant_gemv_group(const WeightMatrix* const* W, float* const* y, int count, const float* x, int n, cudaStream_t s);

// One token through count (1..kQuantGemvGroupMax) Q4_K, Q5_K or Q6_K matrices of one width that share x, on int8
// activations (quant_gemv_q8.cu): llama.cpp's Q8_K rounding of x, the CPU int8 tiers' numbers bit for bit (avx2int8, and
// the avx512bf16 / amx tiers' per-block K path), not the exact fp32 products of the other kernels. Widths: whole
// 256-blocks up to kQ8MaxCols; x 16-byte aligned, the blocks at 16 bytes (Q6_K: 2). cudaErrorInvalidValue otherwise.
// quant_gemv and quant_gemv_group take it for one token where it runs (the rule since session 47); K3_QUANT_GEMV=exact
// (or any other K3_QUANT_GEMV form) keeps the exact kernels.
constexpr int64_t kQ8MaxCols = 32768;
bool quant_gemv_q8_supported(WeightFormat f, int64_t cols);
// Tests: q8 on or off for one token regardless of the rule (nullopt: the rule again).
void force_quant_gemv_q8_for_testing(std::optional<bool> on);
cudaError_t quant_gemv_q8(const WeightMatrix* const* W, float* const* y, int count, const float* x, cudaStream_t s);

// out[i][0..cols) (rows ld floats apart) = row (ids ? ids[i] : row0 + i) of W, i < count.
cudaError_t quant_dequant_rows(const WeightMatrix& W, int64_t row0, const int32_t* ids, int64_t count, float* out, int64_t ld,
                               cudaStream_t s);

// out[i][0..cols) (rows cols apart, bf16 bits) = row row0 + i of W rounded to nearest even, i < count; with lo,
// lo[i][..] = the residual (exact value - out) rounded the same way (out + lo: ~16 significant bits, the hi + lo
// weights of the Bf16x2 prefill GEMMs).
cudaError_t quant_dequant_rows_bf16(const WeightMatrix& W, int64_t row0, int64_t count, uint16_t* out, cudaStream_t s,
                                    uint16_t* lo = nullptr);

}  // namespace k3::cuda
