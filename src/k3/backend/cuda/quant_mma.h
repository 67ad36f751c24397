// Tensor-core GEMV over GGUF K-quant blocks for decode batches (quant_gemv_mma.cu):
// y[t][r] = sum_c W[r][c] x[t][c] for 1 <= n <= kQuantMmaMaxTokens tokens, W in Q4_K, Q5_K or Q6_K as stored.
//
// Why: quant_gemv (quant_kernels.h) multiplies in fp32 on the CUDA cores and reloads the activations from L1
// for every 8 weights and every token, so at 8 tokens the Kimi-Linear head (163840 x 2304 Q6_K, 310 MB) took
// 880-1230 us (0.25-0.35 TB/s) and above 32 tokens every decode step dequantised whole matrices into bf16
// tiles for cuBLAS (docs/perf/cuda.md sessions 19 and 21). Here the block's small integers go straight into
// mma.sync fragments (exact in bf16) and its scales multiply the fragment sums, so the weights are read once
// for all n tokens at tensor-core rate.
//
// Numerics: each weight is the CPU's d * sc * q - dmin * m (Q4_K / Q5_K) or d * sc * (q - 32) (Q6_K) with the
// same fp32 scale products; the kernel sums q x over each sub-block on the tensor cores (the products exact,
// fp32 accumulation), then scale * sum - min * (sum of x over the sub-block). x enters as bf16 hi + lo halves
// (x' = hi + lo, within 2^-17 of x) or, without lo, as hi alone (2^-9: the class of llama.cpp's q8_1 / fp16
// activations). The result does not depend on the schedule (fixed reduction orders).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3/core/weight.h"

namespace k3::cuda {

constexpr int kQuantMmaMaxTokens = 64;

// The activations as quant_mma_prep leaves them.
struct QuantMmaActs {
  const uint16_t* hi = nullptr;  // [n][cols] bf16 bits, x rounded to nearest even
  const uint16_t* lo = nullptr;  // [n][cols] bf16 of x - hi, or null: products of hi alone
  const float* xsum = nullptr;   // [cols / 32][quant_mma_ldx(n)]: each 32 columns' sum of hi + lo (hi alone without lo)
  int n = 0;
  int64_t cols = 0;
};
// The sums' row length: the kernel's n8 tiles for n <= kQuantMmaMaxTokens (1, 2, 4 or 8 tiles: every tile's columns read
// in place, padding tokens zero), n rounded up to 8 above (the expert path, which reads only its own slots).
inline int quant_mma_ldx(int n) {
  return n <= 8 ? 8 : n <= 16 ? 16 : n <= 32 ? 32 : n <= kQuantMmaMaxTokens ? kQuantMmaMaxTokens : (n + 7) & ~7;
}

// Whether quant_gemv_mma runs W: Q4_K / Q5_K with 16-byte aligned data, or Q6_K (2-byte aligned), on the device.
bool quant_mma_supported(const WeightMatrix& W);

// x [n][cols] fp32 (16-byte aligned, cols a multiple of 256) -> hi, lo (lo may be null) and xsum (zeros for the
// padding tokens n .. ldx - 1).
cudaError_t quant_mma_prep(const float* x, int n, int64_t cols, uint16_t* hi, uint16_t* lo, float* xsum, cudaStream_t s);

// The kernel's forms (quant_gemv_mma.cu): KSplit = a block's 8 warps on the same rows, k split between them, each
// warp loading its own x and its weights; Staged = KSplit with the block's weights streamed through shared memory by
// coalesced cp.async (the same bits as KSplit with mt = 1; up to 16 tokens); Rows = the 8 warps on 128 different rows,
// x staged in shared memory once per block (1/8 of the activation traffic), k split over blocks into `work` when the
// rows alone do not fill the GPU.
// Tiled = KSplit's decode over W.tiled, a tile-major copy of the matrix made at upload (quant_mma_tiled.cuh: Q6_K 5
// coalesced loads a lane and unit instead of 34), up to kQuantMmaTiledMaxTokens tokens; mt then means m16 tiles per
// BLOCK (1, 2, 4 or 8: 8 / mt warps split each tile's k; for Q6_K 1 is KSplit's split, the same bits; 0 = the rule).
enum class QuantMmaForm { Auto, KSplit, Rows, Staged, Tiled };
constexpr int kQuantMmaStagedMaxTokens = 16;
constexpr int kQuantMmaTiledMaxTokens = 16;
// The vocabulary heads: matrices of at least this many rows, whose one-token product is ~25% of a GGUF decode step
// (LinearRunner gives them the tensor cores from one token). With K3_QUANT_MMA_TILED=1 the Q6_K ones get a tiled copy;
// =all: every Q4_K / Q5_K / Q6_K matrix quant_mma_supported takes (A/B; the stored blocks stay beside it for prefill).
constexpr int64_t kQuantMmaTallMatrixRows = 65536;
// Whether the heads get the copy without K3_QUANT_MMA_TILED (=1 heads, =all, =0 none). On since call s37-1 (H200):
// CudaQuantModelTiled passed (k3-tiny Q4_K_M, every K-quant matrix tiled: 4.1e-6 vs the CPU) and k3's Q4_K_M of the
// Kimi-Linear-dims slice decoded at batch 1 / 8 / 16 1374 / 6001 / 9031 tok/s without it, 1561 / 6599 / 9147 with
// the heads', 1617-1639 / 6635-6726 / 9160-9241 with every matrix's (three alternating rounds). =all is not the
// default: its copy doubles every K-quant matrix while prefill still reads the stored blocks. Memory with the
// default: the head's bytes again (+1%): 310 MB for Kimi-Linear, 963 MB for K3.
constexpr bool kQuantMmaTiledByDefault = true;
bool quant_mma_tiled_wanted(const WeightMatrix& W);
// Tests: the mode the uploads after this call use (0 none, 1 the heads, 2 every K-quant matrix; -1 back to
// K3_QUANT_MMA_TILED or the default).
void quant_mma_set_tiled_mode(int mode);
int64_t quant_mma_tiled_bytes(const WeightMatrix& W);
// W's tile-major copy into out (quant_mma_tiled_bytes(W) bytes, 16-byte aligned), on stream s.
cudaError_t quant_mma_make_tiled(const WeightMatrix& W, void* out, cudaStream_t s);
// Scratch for the Rows form's k slices: partial sums, slices x n x rows floats (quant_mma_work_floats). Too little (or
// none) means fewer slices: the result is the same up to the order of the slices' sums.
struct QuantMmaWork {
  float* partials = nullptr;
  size_t floats = 0;
};
// The floats quant_gemv_mma(W, n tokens, form) uses at most: 0 where it runs KSplit or one k slice.
size_t quant_mma_work_floats(const WeightMatrix& W, int n, QuantMmaForm form = QuantMmaForm::Auto);

// y [n][W.rows]. mt: m16 tiles per warp of the KSplit form (1 or 2; 0 = the measured rule; Tiled: per block, above);
// form: Auto = the measured rule (Tiled wherever W.tiled is set and n <= kQuantMmaTiledMaxTokens); both for tests and
// A/B timing. cudaErrorInvalidValue when W is not quant_mma_supported or the activations do
// not match it.
cudaError_t quant_gemv_mma(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s, int mt = 0,
                           QuantMmaForm form = QuantMmaForm::Auto, QuantMmaWork work = {});

// Grouped form: count (1..kQuantMmaGroupMax) matrices of ONE format and width that read the same prepared x, y[m] =
// x . W[m]^T, in one launch of the KSplit kernel (the block's matrix from a table), or of the Tiled kernel when every
// member has a tiled copy. Groupable where quant_gemv_mma's rule gives each the KSplit form (Q4_K / Q5_K up to 16
// tokens, Q6_K below 8) or each the Tiled form; each y[m] is then bit-equal to quant_gemv_mma(W[m], a, y[m]). Why:
// session 33's one-token group (quant_gemv_group) took KDA's six projections from 32.8 to 20.3 us; at 2..16 tokens sharing the prep alone gained 1.05-1.5x, one launch for the six 1.9-2.0x more (call
// s35-1). LinearRunner's default since session 35 (K3_QUANT_MMA_GROUP=0: one launch per matrix).
constexpr int kQuantMmaGroupMax = 8;
bool quant_gemv_mma_groupable(const WeightMatrix* const* W, int count, const QuantMmaActs& a);
// cudaErrorInvalidValue where !quant_gemv_mma_groupable.
cudaError_t quant_gemv_mma_group(const WeightMatrix* const* W, float* const* y, int count, const QuantMmaActs& a, cudaStream_t s);
}  // namespace k3::cuda
