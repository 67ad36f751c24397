// Dense projections y[n][rows] = x[n][cols] . W^T on the GPU, W bf16 or fp32 (as stored in the
// checkpoint; WeightFormat BF16 or F32, the formats linear.cu dispatches on), x and y fp32. One token runs a
// GEMV-style kernel (fp32 activations); 2..32 tokens with bf16 weights a tensor-core skinny GEMM that reads W
// once with x split into bf16 hi + lo (linear_skinny.h; the GEMV up to 8 tokens for other weights); larger n goes to cuBLASLt (cublasLtMatmul: bf16 tensor cores with x
// rounded to bf16 or split into bf16 hi + lo, or an fp32 GEMM for fp32 weights), with one algorithm per
// shape chosen by the Lt heuristic and cached. The CPU reference is cpu::matmul.
// GGUF block formats (Q8_0, Q4_K, ..., IQ1_M; quant_kernels.h): up to 32 tokens a GEMV over the blocks (8
// tokens per pass); more: row tiles decoded and rounded to bf16 into a reused scratch (at most kDequantTileFloats values)
// and multiplied on the tensor cores (cublasGemmEx, x as in bf16 weights' GEMMs; quant_linear.cpp).
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <utility>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/quant_mma.h"
#include "k3/core/weight.h"

namespace k3::cuda {

inline void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string("cuBLAS: ") + what + " failed with status " + std::to_string(static_cast<int>(st)));
}

// A dense weight in device memory: the graph's WeightMatrix (BF16 or F32 here; upload_weights widens F16).
using DeviceLinear = WeightMatrix;

// How prefill-sized projections treat the fp32 activations on the tensor cores.
//   Bf16:   x rounded to bf16 (one GEMM; what vLLM/SGLang do; ~3e-3 relative per projection)
//   Bf16x2: x split into bf16 hi + lo, two GEMMs accumulated in fp32 (~1e-5: matches the fp32 CPU
//           reference and the decode path; twice the tensor-core work)
enum class GemmPrecision : int { Bf16 = 0, Bf16x2 = 1 };

// Owns the cuBLAS and cuBLASLt handles, the GEMM workspace, the cached Lt plans and the bf16 staging
// buffer of the activations; one per stream.
class LinearRunner {
 public:
  LinearRunner(cudaStream_t stream, GemmPrecision precision = GemmPrecision::Bf16x2);
  ~LinearRunner();
  LinearRunner(const LinearRunner&) = delete;
  LinearRunner& operator=(const LinearRunner&) = delete;

  // Largest n that takes the GEMV path.
  static constexpr int kGemvMaxTokens = 8;
  // bf16x2 batches up to this many tokens (and a [2n][rows] fp32 scratch up to kMergedMaxFloats) run one
  // GEMM over x's hi and lo halves side by side: W is read once.
  static constexpr int kMergedMaxTokens = 256;
  static constexpr int64_t kMergedMaxFloats = int64_t{64} << 20;  // 256 MB
  // GGUF block matrices without the tensor-core block GEMV below (formats other than Q4_K / Q5_K / Q6_K): up to this
  // many tokens the block GEMV in chunks of kGemvMaxTokens (the blocks read once per chunk: 4 reads at 32 tokens move
  // less than one fp32 tile's write + read); above, bf16 tiles.
  static constexpr int kQuantGemvMaxTokens = 32;
  // Q4_K / Q5_K / Q6_K batches from this many tokens up to kQuantMmaMaxTokens take the tensor-core block GEMV
  // (quant_mma.h) instead.
  static constexpr int kQuantMmaMinTokens = 2;
  // ... and from one token for matrices of at least this many rows (the vocabulary heads; quant_mma.h's bound).
  static constexpr int64_t kQuantMmaTallRows = kQuantMmaTallMatrixRows;
  // Largest tile (in values) of a GGUF block matrix dequantised to bf16 for a prefill-sized product (32 MB).
  static constexpr int64_t kDequantTileFloats = int64_t{16} << 20;

  // Throws k3::Error for a weight format without a kernel here.
  void run(const DeviceLinear& W, const float* x, int64_t n, float* y);
  // y[m] = x . W[m]^T for `count` matrices that read the same x (graph::Backend::linear_group): one grouped
  // launch when every matrix would take the same kernel in run() (skinny or GEMV; <= kLinearGroupMax,
  // same width), each y[m] bit-equal to run()'s; otherwise run() for each. GGUF block matrices: one launch per
  // format at one token where run() would take the v3 GEMV, one shared prep of x on the tensor cores.
  void run_group(const DeviceLinear* const* W, float* const* y, int count, const float* x, int64_t n);
  // The plain cuBLAS handle (on stream()), for the SGEMMs of callers; run() itself uses cuBLASLt.
  cublasHandle_t cublas() const { return handle_; }
  cudaStream_t stream() const { return stream_; }
  // Changes whenever a buffer that enqueued work refers to is reallocated (captured graphs go stale).
  uint64_t generation() const { return generation_; }

 private:
  // One cublasLtMatmul configuration: layouts of A (W), B (x), C == D (y) and the heuristic's algorithm.
  struct LtPlan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  // (m, n, k, beta != 0, weight type, alignment in bytes of A, B, C/D (power of two <= 256))
  using LtKey = std::array<int64_t, 8>;

  const LtPlan& lt_plan(WeightFormat type, int64_t m, int64_t n, int64_t k, bool accumulate, const void* a, const void* b,
                        const void* c);
  void lt_matmul(WeightFormat type, int64_t m, int64_t n, int64_t k, const void* a, const void* b, float beta, float* y);
  // run()'s path for a BF16 matrix past the skinny / GEMV sizes when x's halves are not merged: true where run() would
  // convert x and call lt_bf16 (so that run_group can convert x once for several such matrices).
  bool takes_lt_bf16(const DeviceLinear& W, int64_t n) const;
  // Bf16x2 batches that run ONE GEMM over x's halves side by side ([hi | lo], kMergedMaxTokens): run()'s choice.
  bool merges_halves(const DeviceLinear& W, int64_t n) const;
  // x as the precision's bf16 operands: hi and lo (Bf16x2) or hi rounded (Bf16).
  void convert_x(const float* x, int64_t count, uint16_t* hi, uint16_t* lo);
  // y = W . x^T from x's bf16 halves (lo only under Bf16x2: D += W . lo).
  void lt_bf16(const DeviceLinear& W, const uint16_t* hi, const uint16_t* lo, int64_t n, float* y);
  void release() noexcept;
  // run() for a GGUF block format (quant_linear.cpp).
  void run_blocks(const DeviceLinear& W, const float* x, int64_t n, float* y);
  // run_blocks on the tensor cores (quant_mma.h): x split (or rounded) and summed per 32 columns, then the
  // block GEMV; false (nothing enqueued) where it does not apply. Its steps: whether it applies (the rule), the
  // scratch sized (may synchronise), x's prep, one product.
  bool run_blocks_mma(const DeviceLinear& W, const float* x, int64_t n, float* y);
  bool blocks_mma_applies(const DeviceLinear& W, const float* x, int64_t n) const;
  QuantMmaForm blocks_mma_form(int n) const;
  void reserve_blocks_mma(const DeviceLinear& W, int n);
  QuantMmaActs prep_blocks_mma(const float* x, int n, int64_t cols);
  void product_blocks_mma(const DeviceLinear& W, const QuantMmaActs& acts, float* y);
  // run_group for GGUF block matrices (quant_linear.cpp): one token, one v3 launch per format (quant_gemv_group);
  // tensor-core batches, one prep of x for the matrices of one width; the rest run() one by one.
  void run_group_blocks(const DeviceLinear* const* W, float* const* y, int count, const float* x, int64_t n);
  // x's bf16 hi and lo staging for `count` values (xb_, grown on demand: bumps generation_); lo right after
  // hi when back_to_back (one [2n][k] matrix), else at the next 256-byte boundary.
  std::pair<uint16_t*, uint16_t*> bf16_halves(const float* x, int64_t count, bool back_to_back);

  cudaStream_t stream_;
  GemmPrecision precision_;
  cublasHandle_t handle_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cublasLtMatmulDesc_t op_ = nullptr;  // fp32 compute and scale, A transposed; the same for every plan
  std::map<LtKey, LtPlan> plans_;
  DeviceBuffer xb_;  // bf16 copy of x (hi, then lo at a 256-byte aligned offset)
  DeviceBuffer workspace_;  // shared by handle_ and the Lt matmuls (both stream-ordered on stream_)
  uint64_t generation_ = 0;
  bool skinny_ = true;  // the tensor-core skinny path for 2..32 tokens (K3_CUDA_SKINNY=0: off)
  bool fused_split_ = true;  // the skinny path splits x itself (K3_CUDA_SKINNY_FUSED=0: a split kernel first)
  bool merged_ = true;  // one GEMM over [hi | lo] up to kMergedMaxTokens (K3_CUDA_MERGED_X2=0: off)
  bool grouped_ = true;  // run_group's one launch (K3_CUDA_LINEAR_GROUP=0: run() for each, A/B)
  bool mma_grouped_ = true;  // GGUF groups on the tensor cores in one launch per format (K3_QUANT_MMA_GROUP=0: off)
  DeviceBuffer ys_;     // the merged GEMM's [2n][rows] products
  DeviceBuffer wq_;     // a GGUF block matrix's dequantised bf16 row tile (run_blocks)
  DeviceBuffer xsum_;   // run_blocks_mma: x's sums over 32 columns
  DeviceBuffer qwork_;  // run_blocks_mma: the Rows form's k-slice partial sums
  int quant_mma_min_tokens_ = kQuantMmaMinTokens;  // K3_QUANT_MMA
  QuantMmaForm quant_mma_form_ = QuantMmaForm::Auto;  // K3_QUANT_MMA_FORM
  int64_t dequant_tile_floats_ = kDequantTileFloats;  // K3_CUDA_DEQUANT_TILE (floats; tests force many tiles)
};

// The GEMV kernel alone (n <= 8; BF16, F32 and the GGUF block formats), exposed for tests and benchmarks;
// cudaErrorInvalidValue for a format without a kernel.
cudaError_t linear_gemv(const DeviceLinear& W, const float* x, int n, float* y, cudaStream_t s);
// The GEMV over 1..kLinearGroupMax matrices of one format (BF16 or F32) and width in one launch; each y[m]
// bit-equal to linear_gemv's for W[m] alone.
cudaError_t linear_gemv_group(const DeviceLinear* const* W, float* const* y, int count, const float* x, int n,
                              cudaStream_t s);
// One bf16 token through a given form of the one-token kernel (tests and timings; session 47): Loop = the
// per-chunk loop (gemv_kernel), Batch = a lane's chunks loaded up to `batch` (1..9; 0: the rule's) at a time
// (gemv1_batch_kernel); both with the weight prefetch before the wait, both the same bits. Auto = linear_gemv.
enum class Gemv1Form { Auto, Loop, Batch };
cudaError_t linear_gemv1_form(const DeviceLinear& W, const float* x, float* y, cudaStream_t s, Gemv1Form form, int batch = 0);

}  // namespace k3::cuda
