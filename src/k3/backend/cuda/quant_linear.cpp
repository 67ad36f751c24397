// LinearRunner::run_blocks (linear.h): dense projections over GGUF block matrices. Q4_K / Q5_K / Q6_K from
// kQuantMmaMinTokens to kQuantMmaMaxTokens tokens: the tensor-core block GEMV (quant_mma.h; x as bf16 hi + lo in
// Bf16x2, hi alone in Bf16). Otherwise, up to
// kQuantGemvMaxTokens tokens: quant_gemv per chunk of kGemvMaxTokens (the blocks read once per chunk,
// decoded in registers, fp32; the crossover to tiles is a byte count, not a measurement yet). More (prefill):
// the rows in tiles of at most kDequantTileFloats values (fewer with K3_CUDA_DEQUANT_TILE), each decoded
// exactly (the CPU's values) and rounded to bf16 into the runner's scratch, and multiplied on the tensor
// cores by cublasGemmEx (bf16 operands, fp32 accumulation). Bf16x2 (the default): weights and x both as bf16
// hi + lo halves, three GEMMs accumulating (hi.hi, hi.lo, lo.hi: ~2^-16 relative per product; k3-tiny's logits
// within 1e-5 of the CPU's, CudaQuantModel); Bf16: one
// GEMM of the rounded halves (2^-9 relative per factor, the level of llama.cpp's CUDA prefill: fp16 tiles, or
// q8_1 activations). Until session 18 the tiles were
// fp32 and the GEMM cublasSgemm: 4 bytes per weight written and read, SIMT FLOPs (~8 of the 87 ms of a
// Kimi-Linear-slice pp512 on llama-quantize's Q4_K_M, docs/perf/cuda.md).
#include <algorithm>
#include <array>
#include <string>

#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/linear_skinny.h"  // kLinearGroupMax
#include "k3/backend/cuda/quant_kernels.h"

namespace k3::cuda {

bool LinearRunner::blocks_mma_applies(const DeviceLinear& W, const float* x, int64_t n) const {
  // One token: the fp32 GEMV's v2 / v3 kernels keep the matrices they win on (4096 x 7168 Q6_K 26.4 vs 30.6 us,
  // 4096 x 2304 Q4_K 11.9 vs 14.1), the tall heads take the tensor cores (163840 x 2304 Q6_K 297.9 -> 209.5 us;
  // CudaQuantMma.TimingAtK3Width, call s31-1, docs/perf/cuda.md).
  // A matrix with a tiled copy (quant_mma.h: the Q6_K heads; every K-quant matrix with K3_QUANT_MMA_TILED=all) too.
  const bool from_one = W.rows >= kQuantMmaTallRows || W.tiled != nullptr;
  const int min_tokens = quant_mma_min_tokens_ == kQuantMmaMinTokens && from_one ? 1 : quant_mma_min_tokens_;
  return n >= min_tokens && n <= kQuantMmaMaxTokens && quant_mma_supported(W) && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

QuantMmaForm LinearRunner::blocks_mma_form(int n) const {
  // K3_QUANT_MMA_FORM=staged: the kernel's own limit, the rule above it.
  return quant_mma_form_ == QuantMmaForm::Staged && n > kQuantMmaStagedMaxTokens ? QuantMmaForm::Auto : quant_mma_form_;
}

void LinearRunner::reserve_blocks_mma(const DeviceLinear& W, int n) {
  const size_t sums = static_cast<size_t>(quant_mma_ldx(n)) * static_cast<size_t>(W.cols / 32) * sizeof(float);
  if (xsum_.bytes() < sums) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued kernel may still read the old sums
    xsum_ = DeviceBuffer(std::max<size_t>(sums, size_t{1} << 16));
    ++generation_;
  }
  const size_t work = quant_mma_work_floats(W, n, blocks_mma_form(n)) * sizeof(float);
  if (qwork_.bytes() < work) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued kernel may still use the old partials
    qwork_ = DeviceBuffer(work);
    ++generation_;
  }
}

QuantMmaActs LinearRunner::prep_blocks_mma(const float* x, int n, int64_t cols) {
  const auto [hi, lo] = bf16_halves(x, n * cols, false);
  uint16_t* lo_or_null = precision_ == GemmPrecision::Bf16x2 ? lo : nullptr;
  K3_CUDA_CHECK(quant_mma_prep(x, n, cols, hi, lo_or_null, xsum_.get<float>(), stream_));
  return QuantMmaActs{hi, lo_or_null, xsum_.get<float>(), n, cols};
}

void LinearRunner::product_blocks_mma(const DeviceLinear& W, const QuantMmaActs& acts, float* y) {
  K3_CUDA_CHECK(quant_gemv_mma(W, acts, y, stream_, 0, blocks_mma_form(acts.n),
                               QuantMmaWork{qwork_.get<float>(), qwork_.bytes() / sizeof(float)}));
}

bool LinearRunner::run_blocks_mma(const DeviceLinear& W, const float* x, int64_t n, float* y) {
  if (!blocks_mma_applies(W, x, n)) return false;
  const int nt = static_cast<int>(n);
  reserve_blocks_mma(W, nt);
  product_blocks_mma(W, prep_blocks_mma(x, nt, W.cols), y);
  return true;
}

namespace {

// The members of a group that share one launch: matrices b >= a (not yet done) for which `take(b)` holds.
struct Subgroup {
  std::array<const DeviceLinear*, kLinearGroupMax> W{};
  std::array<float*, kLinearGroupMax> y{};
  std::array<int, kLinearGroupMax> index{};
  int count = 0;
};
template <class Take>
Subgroup collect(const DeviceLinear* const* W, float* const* y, int count, int a, const std::array<bool, kLinearGroupMax>& done,
                 const Take& take) {
  Subgroup g;
  for (int b = a; b < count; ++b)
    if (!done[b] && take(b)) {
      g.W[g.count] = W[b];
      g.y[g.count] = y[b];
      g.index[g.count++] = b;
    }
  return g;
}

}  // namespace

void LinearRunner::run_group_blocks(const DeviceLinear* const* W, float* const* y, int count, const float* x, int64_t n) {
  std::array<bool, kLinearGroupMax> done{};
  auto mark = [&](const Subgroup& g) {
    for (int i = 0; i < g.count; ++i) done[g.index[i]] = true;
  };
  // Which matrices run() would give the tensor-core block GEMV (the group's other GGUF matrices that take the v3
  // GEMV can share its launch).
  std::array<bool, kLinearGroupMax> mma{};
  for (int m = 0; m < count; ++m) mma[m] = W[m]->rows > 0 && blocks_mma_applies(*W[m], x, n);
  const int nt = static_cast<int>(n);
  // The v3 GEMV (one token by the rule; up to 8 tokens with K3_QUANT_GEMV=v3:N and K3_QUANT_MMA=9): one launch per
  // format and width.
  for (int a = 0; a < count && n <= kGemvMaxTokens; ++a) {
    if (done[a] || mma[a] || !quant_gemv_groupable(&W[a], 1, x, nt)) continue;
    const Subgroup g = collect(W, y, count, a, done, [&](int b) {
      return !mma[b] && W[b]->format == W[a]->format && W[b]->cols == W[a]->cols && quant_gemv_groupable(&W[b], 1, x, nt);
    });
    if (g.count < 2) continue;  // alone: run() below
    K3_CUDA_CHECK(quant_gemv_group(g.W.data(), g.y.data(), g.count, x, nt, stream_));
    mark(g);
  }
  // The tensor cores (2..kQuantMmaMaxTokens tokens; the tall heads from one): x prepared (split, summed per 32
  // columns) once for the matrices of the first such width, then one launch per format where the rule gives the members
  // the KSplit form (quant_gemv_mma_group; not with K3_QUANT_MMA_FORM set), else one product each (K3_QUANT_MMA_GROUP=0:
  // always one each). Each y[m] is run()'s: the same prep of the same x.
  int first = -1;
  for (int m = 0; m < count && first < 0; ++m)
    if (mma[m]) first = m;
  auto member = [&](int m) { return mma[m] && W[m]->cols == W[first]->cols; };
  if (first >= 0 && collect(W, y, count, first, done, member).count >= 2) {
    for (int m = first; m < count; ++m)  // every buffer sized before the prep: a growth synchronises
      if (member(m)) reserve_blocks_mma(*W[m], nt);
    const QuantMmaActs acts = prep_blocks_mma(x, nt, W[first]->cols);
    for (int a = first; a < count; ++a) {
      if (done[a] || !member(a)) continue;
      const Subgroup g = collect(W, y, count, a, done, [&](int b) { return member(b) && W[b]->format == W[a]->format; });
      if (g.count >= 2 && mma_grouped_ && quant_mma_form_ == QuantMmaForm::Auto && quant_gemv_mma_groupable(g.W.data(), g.count, acts)) {
        K3_CUDA_CHECK(quant_gemv_mma_group(g.W.data(), g.y.data(), g.count, acts, stream_));
      } else {
        for (int i = 0; i < g.count; ++i) product_blocks_mma(*g.W[i], acts, g.y[i]);
      }
      mark(g);
    }
  }
  for (int m = 0; m < count; ++m)
    if (!done[m]) run(*W[m], x, n, y[m]);
}

void LinearRunner::run_blocks(const DeviceLinear& W, const float* x, int64_t n, float* y) {
  if (n <= 0 || W.rows <= 0) return;
  if (run_blocks_mma(W, x, n, y)) return;
  const int64_t m = W.rows, k = W.cols;
  if (n <= kQuantGemvMaxTokens) {  // y is [n][m]: each chunk of tokens writes its own rows of y
    for (int64_t t0 = 0; t0 < n; t0 += kGemvMaxTokens)
      K3_CUDA_CHECK(quant_gemv(W, x + t0 * k, static_cast<int>(std::min<int64_t>(kGemvMaxTokens, n - t0)), y + t0 * m, stream_));
    return;
  }
  constexpr int64_t kIntMax = 0x7fffffff;
  if (m > kIntMax || n > kIntMax || k > kIntMax || k <= 0)
    throw Error("CUDA backend: a " + std::string(weight_format_name(W.format)) + " projection of " + std::to_string(m) + " x " +
                std::to_string(k) + " for " + std::to_string(n) + " tokens is outside cuBLAS's int sizes");
  const bool split = precision_ == GemmPrecision::Bf16x2;
  const int64_t tile = std::clamp<int64_t>(dequant_tile_floats_ / k, 1, m);
  // Bf16x2: the tile's weights as hi + lo halves too (two tiles in the buffer), so that the sum of the three
  // products below is ~fp32 (the rounding of a bf16 weight alone, 2^-9, flipped 6 of 48 argmaxes of trained
  // k3-tiny against the CPU on its Q4_K_M file: CudaQuantModel, session 19).
  const size_t need = static_cast<size_t>(tile * k) * sizeof(uint16_t) * (split ? 2 : 1);
  if (wq_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued GEMM may still read the old tile
    wq_ = DeviceBuffer(need);
    ++generation_;
  }
  const auto [hi, lo] = bf16_halves(x, n * k, false);  // x rounded (and split) once for every tile
  if (split)
    K3_CUDA_CHECK(to_bf16_split(x, n * k, hi, lo, stream_));
  else
    K3_CUDA_CHECK(to_bf16(x, n * k, hi, stream_));
  const float one = 1.0f, zero = 0.0f;
  uint16_t* w_hi = wq_.get<uint16_t>();
  uint16_t* w_lo = split ? w_hi + tile * k : nullptr;
  auto gemm = [&](int64_t r0, int64_t mr, const uint16_t* wt, const uint16_t* xb, const float* beta) {
    // Column-major: y^T[r0 .. r0 + mr) x n (ld m) = tile^T (tile stored [mr][k], ld k, transposed) . x^T [k x n] (ld k)
    check_cublas(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(mr), static_cast<int>(n), static_cast<int>(k), &one,
                              wt, CUDA_R_16BF, static_cast<int>(k), xb, CUDA_R_16BF, static_cast<int>(k), beta,
                              y + r0, CUDA_R_32F, static_cast<int>(m), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx (GGUF blocks as bf16 tiles)");
  };
  for (int64_t r0 = 0; r0 < m; r0 += tile) {
    const int64_t mr = std::min(tile, m - r0);
    K3_CUDA_CHECK(quant_dequant_rows_bf16(W, r0, mr, w_hi, stream_, w_lo));
    gemm(r0, mr, w_hi, hi, &zero);
    if (split) {
      gemm(r0, mr, w_hi, lo, &one);  // y += w_hi . x_lo
      gemm(r0, mr, w_lo, hi, &one);  // y += w_lo . x_hi (w_lo . x_lo, ~2^-18 of a product, is left out)
    }
  }
}

}  // namespace k3::cuda
