// Dense projections (linear.h).
//
// Skinny path (2..32 tokens, bf16 weights with cols % 32 == 0): linear_skinny.cu, tensor cores with x split
// into bf16 hi + lo in either GemmPrecision (decode keeps ~fp32 accuracy), W read once.
//
// GEMM path (the rest of n > 8): cublasLtMatmul in the column-major view y^T [rows x n] = op_T(W) . x^T, i.e.
// A = W stored as a col-major [cols x rows] matrix (ld cols) with TRANSA = T, B = x^T [cols x n]
// (ld cols), C = D = y^T [rows x n] (ld rows); fp32 compute and scale. bf16 weights multiply the bf16
// copy of x (Bf16) or its hi and lo halves (Bf16x2: the lo GEMM accumulates into the same D with
// beta = 1; up to 256 tokens the two halves go back to back through ONE GEMM of 2n columns instead, so W
// is read once, and a small kernel adds the two products). The algorithm of each (shape, beta, weight type, pointer alignments) is chosen once by
// cublasLtMatmulAlgoGetHeuristic and cached with its layouts; every matmul gets the runner's fixed
// workspace, so nothing allocates during run() (CUDA graph capture).
//
// GEMV path (bf16 and fp32 weights): one warp per output row, 8 warps per block. (Session 42 wrote a second bf16
// GEMV -- rows split over warps, a lane's loads all in flight, PDL; measured in session 44 it lost at every size but
// the 256-row router: the 755 MB head 349 vs 245 us, 58 MB 33 vs 24 us, batch 1 -10%; removed, docs/perf/cuda.md.)
// Lane l reads 8 consecutive weights (one
// 16-byte load for bf16, two for fp32) at columns 8l, 8l + 256, ... and applies them to all NT tokens,
// so W is streamed once for the whole group of tokens; x is read through L1 (it is small and shared by
// all warps of the SM). fp32 accumulation, warp-shuffle reduction. cols % 8 != 0 falls back to a
// scalar loop over columns.
// One bf16 token on a grid resident at once (the KDA / MLA projections at batch 1): gemv1_batch_kernel, the same rows
// per warp with a lane's chunks loaded together (session 47: the projection chain 13-33% faster at 576-6144 x 2304-4096).
#include "k3/backend/cuda/linear.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "k3/backend/cuda/bf16_dot.cuh"
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/linear_skinny.h"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_tables.h"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

// The matrices one launch multiplies by the same x (a group, or one matrix): blocks [first_block[m],
// first_block[m + 1]) compute matrix m's rows (kernel parameters, by value).
template <typename WT>
struct GemvGroup {
  const WT* W[kLinearGroupMax];
  float* y[kLinearGroupMax];
  int64_t rows[kLinearGroupMax];
  int64_t first_block[kLinearGroupMax];
  int count;
};

// PRE: launched with pdl::launch (pdl.cuh's contract), each warp requests its row into L2 before it waits for the
// kernel that wrote x, so that the row's first DRAM round trip overlaps that kernel's tail (the GGUF GEMVs' prologue
// since session 32; here from session 45). One token, where the whole grid is resident at once (launch_gemv): the
// prologue costs registers (32 -> 42 at one bf16 token: 8 -> 6 blocks an SM), and a later wave starts after the wait
// anyway. K3_PDL=0: the plain kernel everywhere, the A/B.
template <int NT, typename WT, bool PRE>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const GemvGroup<WT> grp, int64_t cols, const float* __restrict__ x) {
  const int lane = threadIdx.x & 31;
  int m = 0;  // this block's matrix (block-uniform)
  while (m + 1 < grp.count && static_cast<int64_t>(blockIdx.x) >= grp.first_block[m + 1]) ++m;
  const WT* __restrict__ W = grp.W[m];
  float* __restrict__ y = grp.y[m];
  const int64_t rows = grp.rows[m];
  const int64_t row = (static_cast<int64_t>(blockIdx.x) - grp.first_block[m]) * kWarps + (threadIdx.x >> 5);
  const WT* wr = W + row * cols;
  if constexpr (PRE) {
    if (row < rows) pdl::prefetch_l2(wr, cols * static_cast<int64_t>(sizeof(WT)), lane, 32);  // weights only
    pdl::begin();
  } else {
    pdl::begin();
  }
  if (row >= rows) return;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  if ((cols & 7) == 0) {
    for (int64_t c = lane * 8; c < cols; c += 256) {
      float w[8];
      if constexpr (sizeof(WT) == 2) {
        const uint4 v = *reinterpret_cast<const uint4*>(wr + c);
        const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          w[2 * i] = __uint_as_float(u[i] << 16);
          w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
      } else {
        const float4 a = *reinterpret_cast<const float4*>(wr + c);
        const float4 b = *reinterpret_cast<const float4*>(wr + c + 4);
        w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w; w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float4 xa = __ldg(reinterpret_cast<const float4*>(x + t * cols + c));
        const float4 xb = __ldg(reinterpret_cast<const float4*>(x + t * cols + c + 4));
        float s = acc[t];
        s = fmaf(w[0], xa.x, s); s = fmaf(w[1], xa.y, s); s = fmaf(w[2], xa.z, s); s = fmaf(w[3], xa.w, s);
        s = fmaf(w[4], xb.x, s); s = fmaf(w[5], xb.y, s); s = fmaf(w[6], xb.z, s); s = fmaf(w[7], xb.w, s);
        acc[t] = s;
      }
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      float w;
      if constexpr (sizeof(WT) == 2) w = bf(wr[c]); else w = wr[c];
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[t] = fmaf(w, x[t * cols + c], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[t * rows + row] = v;
  }
}

// One bf16 token, a grid resident at once (launch_gemv's PRE case; the rule since call s47-3, gemv1_batch below):
// gemv_kernel's prologue, then a lane's chunks of the row (8 weights, 16 bytes) loaded kB at a time, a batch's weights
// and then its activations all issued before its first multiply (lane_dots2_bf16's pattern: ptxas keeps the loads in
// program order, and with each chunk's x loaded beside its multiplies it sank the weight loads there: 30-38 registers
// for 16 chunks, one or two in flight), addresses clamped into the row. Why: the plain loop's ncu figure (call s45-1:
// 42 launches a step at 7.6 us for 7.2 MB, 953 GB/s) reads as a chain of dependent trips -- a 2304-wide row is 9
// chunks a lane. The cost: registers (kB 9: 123, 2 blocks an SM against the loop's 6). Same chunks, same fmaf order,
// same shuffles: gemv_kernel's bits. Measured (call s47-3): the projection chain 13-33% faster, Kimi-Linear batch 1
// +2.0%. fp32 rows (the GGUF files' router) keep the loop: an fp32 instance of this kernel (two 16-byte loads a chunk)
// came out of ptxas at 34 registers, its loads sunk again (session 47, not measured).
template <int kB>
__global__ void __launch_bounds__(kWarps * 32)
    gemv1_batch_kernel(const GemvGroup<uint16_t> grp, int64_t cols, const float* __restrict__ x) {
  const int lane = threadIdx.x & 31;
  int m = 0;  // this block's matrix (block-uniform)
  while (m + 1 < grp.count && static_cast<int64_t>(blockIdx.x) >= grp.first_block[m + 1]) ++m;
  const int64_t rows = grp.rows[m];
  const int64_t row = (static_cast<int64_t>(blockIdx.x) - grp.first_block[m]) * kWarps + (threadIdx.x >> 5);
  const uint16_t* wr = grp.W[m] + row * cols;
  if (row < rows) pdl::prefetch_l2(wr, cols * 2, lane, 32);  // weights only
  pdl::begin();
  if (row >= rows) return;
  float acc = 0.f;
  for (int64_t base = 0; base < cols; base += 256 * kB) {  // warp-uniform
    uint4 w[kB];
    float4 xa[kB], xb[kB];
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int64_t c = base + lane * 8 + 256 * j, cc = c < cols ? c : cols - 8;
      w[j] = ld_weights16(wr + cc);
    }
#pragma unroll
    for (int j = 0; j < kB; ++j) {
      const int64_t c = base + lane * 8 + 256 * j, cc = c < cols ? c : cols - 8;
      xa[j] = ld_acts16(x + cc);
      xb[j] = ld_acts16(x + cc + 4);
    }
#pragma unroll
    for (int j = 0; j < kB; ++j)
      if (base + lane * 8 + 256 * j < cols) acc = fma8_bf16(w[j], xa[j], xb[j], acc);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) grp.y[m][row] = acc;
}

// The PRE case's bf16 form: gemv1_batch_kernel with this batch cap (9), or 0 = gemv_kernel (K3_GEMV1=loop, A/B;
// K3_GEMV1=batch:N another cap). Rows narrower than one 256-column chunk keep the loop (call s47-3: 4096 x 128 1.69 us
// looped, 1.83 batched). Read once.
int gemv1_batch() {
  static const int cap = [] {
    const char* e = std::getenv("K3_GEMV1");
    if (e != nullptr && std::strcmp(e, "loop") == 0) return 0;
    if (e != nullptr && std::strncmp(e, "batch:", 6) == 0) return std::clamp(std::atoi(e + 6), 1, 9);
    return 9;
  }();
  return cap;
}

// gemv1_batch_kernel<kB> for bf16 rows of C = ceil(cols / 256) chunks a lane: ceil(C / cap) batches, kB the smallest
// instance that covers one (cap 9: ~123 registers, 2 blocks an SM).
cudaError_t launch_gemv1_batch(const GemvGroup<uint16_t>& grp, int64_t cols, const float* x, unsigned grid, int cap,
                               cudaStream_t s) {
  const int64_t C = (cols + 255) / 256, nb = (C + cap - 1) / cap, per = (C + nb - 1) / nb;
  if (per <= 2) return pdl::launch(gemv1_batch_kernel<2>, grid, kWarps * 32, 0, s, grp, cols, x);
  if (per <= 3) return pdl::launch(gemv1_batch_kernel<3>, grid, kWarps * 32, 0, s, grp, cols, x);
  if (per <= 5) return pdl::launch(gemv1_batch_kernel<5>, grid, kWarps * 32, 0, s, grp, cols, x);
  if (per <= 8) return pdl::launch(gemv1_batch_kernel<8>, grid, kWarps * 32, 0, s, grp, cols, x);
  return pdl::launch(gemv1_batch_kernel<9>, grid, kWarps * 32, 0, s, grp, cols, x);
}

template <typename WT>
cudaError_t launch_gemv(GemvGroup<WT> grp, int64_t cols, const float* x, int n, cudaStream_t s) {
  int64_t blocks = 0;
  for (int m = 0; m < grp.count; ++m) {
    grp.first_block[m] = blocks;
    blocks += (grp.rows[m] + kWarps - 1) / kWarps;
  }
  const unsigned grid = static_cast<unsigned>(blocks);
  // One token, and a grid resident at once (the KDA / MLA / shared-expert projections at batch 1): the prefetch
  // before the wait. Taller matrices (the head) and several tokens: the plain kernel (8 blocks an SM at one token).
  if (n == 1 && pdl::enabled()) {
    static const int64_t resident = [] {
      int per_sm = 0;
      if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<1, WT, true>, kWarps * 32, 0) != cudaSuccess)
        per_sm = 1;
      return static_cast<int64_t>(per_sm) * device_sm_count();
    }();
    if (blocks <= resident) {
      if constexpr (sizeof(WT) == 2)
        if (gemv1_batch() > 0 && (cols & 7) == 0 && cols >= 256) return launch_gemv1_batch(grp, cols, x, grid, gemv1_batch(), s);
      return pdl::launch(gemv_kernel<1, WT, true>, grid, kWarps * 32, 0, s, grp, cols, x);
    }
  }
  switch (n) {
    case 1: (void)pdl::launch(gemv_kernel<1, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 2: (void)pdl::launch(gemv_kernel<2, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 3: (void)pdl::launch(gemv_kernel<3, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 4: (void)pdl::launch(gemv_kernel<4, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 5: (void)pdl::launch(gemv_kernel<5, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 6: (void)pdl::launch(gemv_kernel<6, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 7: (void)pdl::launch(gemv_kernel<7, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    case 8: (void)pdl::launch(gemv_kernel<8, WT, false>, grid, kWarps * 32, 0, s, grp, cols, x); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

template <typename WT>
cudaError_t launch_gemv_group(const DeviceLinear* const* W, float* const* y, int count, const float* x, int n,
                              cudaStream_t s) {
  GemvGroup<WT> g{};
  for (int m = 0; m < count; ++m) {
    g.W[m] = static_cast<const WT*>(W[m]->data);
    g.y[m] = y[m];
    g.rows[m] = W[m]->rows;
  }
  g.count = count;
  return launch_gemv(g, W[0]->cols, x, n, s);
}

// y[i] = d[i] + d[count + i]: the hi and lo products of the merged bf16x2 GEMM.
__global__ void add_halves_kernel(const float* __restrict__ d, int64_t count, float* __restrict__ y) {
  pdl::begin();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = d[i] + d[count + i];
}

cudaError_t add_halves(const float* d, int64_t count, float* y, cudaStream_t s) {
  if (count <= 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>((count + 255) / 256, 132 * 16);
  (void)pdl::launch(add_halves_kernel, static_cast<unsigned>(blocks), 256, 0, s, d, count, y);
  return cudaGetLastError();
}

}  // namespace

cudaError_t linear_gemv(const DeviceLinear& W, const float* x, int n, float* y, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (n > LinearRunner::kGemvMaxTokens) return cudaErrorInvalidValue;
  const DeviceLinear* Ws[1] = {&W};
  float* ys[1] = {y};
  switch (W.format) {
    case WeightFormat::BF16: return launch_gemv_group<uint16_t>(Ws, ys, 1, x, n, s);
    case WeightFormat::F32: return launch_gemv_group<float>(Ws, ys, 1, x, n, s);
    default: return is_gguf_block(W.format) ? quant_gemv(W, x, n, y, s) : cudaErrorInvalidValue;
  }
}

cudaError_t linear_gemv1_form(const DeviceLinear& W, const float* x, float* y, cudaStream_t s, Gemv1Form form, int batch) {
  if (form == Gemv1Form::Auto) return linear_gemv(W, x, 1, y, s);
  if (W.format != WeightFormat::BF16 || W.cols % 8 != 0 || W.rows <= 0 || batch < 0 || batch > 9) return cudaErrorInvalidValue;
  GemvGroup<uint16_t> g{};
  g.W[0] = static_cast<const uint16_t*>(W.data);
  g.y[0] = y;
  g.rows[0] = W.rows;
  g.count = 1;
  const unsigned grid = static_cast<unsigned>((W.rows + kWarps - 1) / kWarps);
  if (form == Gemv1Form::Batch) return launch_gemv1_batch(g, W.cols, x, grid, batch == 0 ? 9 : batch, s);
  return pdl::launch(gemv_kernel<1, uint16_t, true>, grid, kWarps * 32, 0, s, g, W.cols, x);
}

cudaError_t linear_gemv_group(const DeviceLinear* const* W, float* const* y, int count, const float* x, int n,
                              cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (n > LinearRunner::kGemvMaxTokens || count < 1 || count > kLinearGroupMax) return cudaErrorInvalidValue;
  for (int m = 0; m < count; ++m)
    if (W[m] == nullptr || y[m] == nullptr || W[m]->format != W[0]->format || W[m]->cols != W[0]->cols)
      return cudaErrorInvalidValue;
  switch (W[0]->format) {
    case WeightFormat::BF16: return launch_gemv_group<uint16_t>(W, y, count, x, n, s);
    case WeightFormat::F32: return launch_gemv_group<float>(W, y, count, x, n, s);
    default: return cudaErrorInvalidValue;
  }
}

namespace {

// Largest power of two (up to 256, cuBLASLt's default assumption) that divides the address.
int64_t ptr_alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  return std::min<int64_t>(static_cast<int64_t>(a & (~a + 1)), 256);
}

struct LtPreference {
  cublasLtMatmulPreference_t p = nullptr;
  LtPreference() { check_cublas(cublasLtMatmulPreferenceCreate(&p), "cublasLtMatmulPreferenceCreate"); }
  ~LtPreference() { cublasLtMatmulPreferenceDestroy(p); }
  LtPreference(const LtPreference&) = delete;
  LtPreference& operator=(const LtPreference&) = delete;
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, T v) {
    check_cublas(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)), "cublasLtMatmulPreferenceSetAttribute");
  }
};

}  // namespace

LinearRunner::LinearRunner(cudaStream_t stream, GemmPrecision precision) : stream_(stream), precision_(precision) {
  // K3_CUDA_SKINNY=0: 2..32-token batches take the old GEMV / cuBLASLt paths (same-binary A/B).
  const char* sk = std::getenv("K3_CUDA_SKINNY");
  skinny_ = sk == nullptr || std::string(sk) != "0";
  // K3_CUDA_SKINNY_FUSED=0: the skinny path splits x in a kernel of its own first (same bits, A/B).
  const char* fu = std::getenv("K3_CUDA_SKINNY_FUSED");
  fused_split_ = fu == nullptr || std::string(fu) != "0";
  // K3_CUDA_MERGED_X2=0: bf16x2 batches above 32 tokens take two accumulating GEMMs again (A/B).
  const char* mg = std::getenv("K3_CUDA_MERGED_X2");
  merged_ = mg == nullptr || std::string(mg) != "0";
  // K3_CUDA_LINEAR_GROUP=0: the projections of a group run one by one (same bits, A/B).
  const char* lg = std::getenv("K3_CUDA_LINEAR_GROUP");
  grouped_ = lg == nullptr || std::string(lg) != "0";
  // A GGUF group's tensor-core products in one launch per format (quant_gemv_mma_group; call s35-1, H200: KDA's six
  // Q4_K projections 36.9 -> 18.9 us at 2 tokens, 54.1 -> 28.4 at 16; Kimi-Linear-dims slice decode +5-10% at batch
  // 2-16, docs/perf/cuda.md session 35). K3_QUANT_MMA_GROUP=0: one launch per matrix after the shared prep (A/B).
  const char* mgr = std::getenv("K3_QUANT_MMA_GROUP");
  mma_grouped_ = mgr == nullptr || std::string(mgr) != "0";
  // K3_CUDA_DEQUANT_TILE=FLOATS: a smaller fp32 tile for GGUF block matrices' prefill products (tests).
  // K3_QUANT_MMA=off: GGUF K-quant batches take the fp32 block GEMV / bf16 tiles again; =N: the tensor-core
  // block GEMV from N tokens (A/B timing).
  if (const char* qm = std::getenv("K3_QUANT_MMA"); qm != nullptr && qm[0] != 0)
    quant_mma_min_tokens_ = std::string(qm) == "off" ? kQuantMmaMaxTokens + 1
                                                     : static_cast<int>(std::clamp<long>(std::strtol(qm, nullptr, 10), 1,
                                                                                         kQuantMmaMaxTokens + 1));
  // K3_QUANT_MMA_FORM=ksplit | rows | staged: one form of the tensor-core block GEMV for every batch (staged: up to
  // kQuantMmaStagedMaxTokens tokens, the rule above; A/B timing).
  if (const char* qf = std::getenv("K3_QUANT_MMA_FORM"); qf != nullptr) {
    const std::string f(qf);
    quant_mma_form_ = f == "rows" ? QuantMmaForm::Rows : f == "ksplit" ? QuantMmaForm::KSplit : f == "staged" ? QuantMmaForm::Staged : QuantMmaForm::Auto;
  }
  if (const char* dt = std::getenv("K3_CUDA_DEQUANT_TILE"); dt != nullptr && std::atoll(dt) > 0)
    dequant_tile_floats_ = std::min<int64_t>(std::atoll(dt), kDequantTileFloats);
  try {
    check_cublas(cublasCreate(&handle_), "cublasCreate");
    check_cublas(cublasSetStream(handle_, stream_), "cublasSetStream");
    // A fixed workspace so that neither cuBLAS nor cuBLASLt allocates during a step (and CUDA graph
    // capture works); 32 MiB is what cuBLAS recommends for Hopper. Shared by the two: all their work
    // is ordered on stream_.
    workspace_ = DeviceBuffer(32u << 20);
    check_cublas(cublasSetWorkspace(handle_, workspace_.get(), workspace_.bytes()), "cublasSetWorkspace");
    check_cublas(cublasLtCreate(&lt_), "cublasLtCreate");
    check_cublas(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const int32_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check_cublas(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
                 "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(cublasLtMatmulDescSetAttribute(op_, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
                 "cublasLtMatmulDescSetAttribute(TRANSB)");
  } catch (...) {
    release();
    throw;
  }
}

LinearRunner::~LinearRunner() { release(); }

void LinearRunner::release() noexcept {
  for (auto& [key, p] : plans_) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
  }
  plans_.clear();
  if (op_) cublasLtMatmulDescDestroy(op_);
  op_ = nullptr;
  if (lt_) cublasLtDestroy(lt_);
  lt_ = nullptr;
  if (handle_) cublasDestroy(handle_);
  handle_ = nullptr;
}

const LinearRunner::LtPlan& LinearRunner::lt_plan(WeightFormat type, int64_t m, int64_t n, int64_t k, bool accumulate,
                                                  const void* a, const void* b, const void* c) {
  // The heuristic assumes 256-byte aligned buffers unless told otherwise, and the algorithm it picks
  // may then fail (or worse) on less aligned ones: weights sub-allocated from a larger buffer, x or y at
  // an offset into an activation buffer. So the actual alignments go into the preference and the key.
  const int64_t al_a = ptr_alignment(a), al_b = ptr_alignment(b), al_c = ptr_alignment(c);
  const LtKey key{m, n, k, accumulate ? 1 : 0, static_cast<int64_t>(type), al_a, al_b, al_c};
  if (const auto it = plans_.find(key); it != plans_.end()) return it->second;

  const cudaDataType_t dt = type == WeightFormat::BF16 ? CUDA_R_16BF : CUDA_R_32F;
  LtPlan p;
  try {
    // Column-major: A = W as [k x m] (ld k, transposed by the op), B = x^T [k x n] (ld k), C = D = y^T [m x n].
    check_cublas(cublasLtMatrixLayoutCreate(&p.a, dt, static_cast<uint64_t>(k), static_cast<uint64_t>(m), k),
                 "cublasLtMatrixLayoutCreate(A)");
    check_cublas(cublasLtMatrixLayoutCreate(&p.b, dt, static_cast<uint64_t>(k), static_cast<uint64_t>(n), k),
                 "cublasLtMatrixLayoutCreate(B)");
    check_cublas(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, static_cast<uint64_t>(m), static_cast<uint64_t>(n), m),
                 "cublasLtMatrixLayoutCreate(C/D)");
    LtPreference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(workspace_.bytes()));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, static_cast<uint32_t>(al_a));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, static_cast<uint32_t>(al_b));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, static_cast<uint32_t>(al_c));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, static_cast<uint32_t>(al_c));
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_, op_, p.a, p.b, p.c, p.c, pref.p, 1, &res, &found);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && (found == 0 || res.state != CUBLAS_STATUS_SUCCESS)))
      throw Error("cuBLASLt: no matmul algorithm for the projection y[" + std::to_string(n) + "][" + std::to_string(m) +
                  "] = x[" + std::to_string(n) + "][" + std::to_string(k) + "] . W^T with " +
                  (type == WeightFormat::BF16 ? "bf16" : "fp32") + " operands, beta " + (accumulate ? "1" : "0") +
                  ", pointer alignments A/B/C " + std::to_string(al_a) + "/" + std::to_string(al_b) + "/" +
                  std::to_string(al_c) + " bytes, workspace " + std::to_string(workspace_.bytes() >> 20) + " MiB");
    check_cublas(st, "cublasLtMatmulAlgoGetHeuristic");
    p.algo = res.algo;
  } catch (...) {
    if (p.a) cublasLtMatrixLayoutDestroy(p.a);
    if (p.b) cublasLtMatrixLayoutDestroy(p.b);
    if (p.c) cublasLtMatrixLayoutDestroy(p.c);
    throw;
  }
  return plans_.emplace(key, p).first->second;
}

void LinearRunner::lt_matmul(WeightFormat type, int64_t m, int64_t n, int64_t k, const void* a, const void* b, float beta,
                             float* y) {
  const LtPlan& p = lt_plan(type, m, n, k, beta != 0.0f, a, b, y);
  const float alpha = 1.0f;
  check_cublas(cublasLtMatmul(lt_, op_, &alpha, a, p.a, b, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_.get(),
                              workspace_.bytes(), stream_),
               beta != 0.0f ? "cublasLtMatmul (accumulating)" : "cublasLtMatmul");
}

std::pair<uint16_t*, uint16_t*> LinearRunner::bf16_halves(const float*, int64_t count, bool back_to_back) {
  const size_t elems = static_cast<size_t>(count);
  // lo starts 256-byte aligned, like hi, unless one GEMM reads both as one matrix
  const size_t lo_off = back_to_back ? elems * 2 : (elems * 2 + 255) & ~size_t{255};
  const size_t need = lo_off + elems * 2;                   // room for hi and lo
  if (xb_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued GEMM may still read the old buffer
    xb_ = DeviceBuffer(need * 2);                   // grows with the largest batch seen
    ++generation_;                                  // captured CUDA graphs that read the old one are stale
  }
  return {xb_.get<uint16_t>(), reinterpret_cast<uint16_t*>(xb_.get<char>() + lo_off)};
}

void LinearRunner::run_group(const DeviceLinear* const* W, float* const* y, int count, const float* x, int64_t n) {
  if (n <= 0) return;
  static_assert(kLinearGroupMax <= kQuantGemvGroupMax, "a group of GGUF matrices fits one quant_gemv_group launch");
  if (grouped_ && count >= 2 && count <= kLinearGroupMax) {  // two or more GGUF matrices (the others: run())
    int blocks = 0;
    for (int m = 0; m < count; ++m) blocks += is_gguf_block(W[m]->format) ? 1 : 0;
    if (blocks >= 2) return run_group_blocks(W, y, count, x, n);
  }
  // The kernel run() would pick for each matrix: the group shares a launch only if all pick the same one.
  enum class Path { Skinny, Gemv, Other };
  auto path_of = [&](const DeviceLinear& w) {
    if (w.rows <= 0 || (w.format != WeightFormat::BF16 && w.format != WeightFormat::F32)) return Path::Other;
    if (skinny_ && linear_skinny_supported(w, n)) return Path::Skinny;
    return n <= kGemvMaxTokens ? Path::Gemv : Path::Other;
  };
  // Prefill-sized batches of BF16 matrices of one width: x converted once for the group, then each matrix's GEMM --
  // run()'s conversion and GEMMs, the same bits; run() per matrix converted x again each time (a KDA layer's six
  // projections: five extra 4096 x 2304 conversions at pp4096).
  bool lt_all = grouped_ && count >= 2;
  for (int m = 0; lt_all && m < count; ++m) lt_all = takes_lt_bf16(*W[m], n) && W[m]->cols == W[0]->cols;
  if (lt_all) {
    const int64_t k = W[0]->cols;
    const auto [hi, lo] = bf16_halves(x, n * k, false);
    convert_x(x, n * k, hi, lo);
    for (int m = 0; m < count; ++m) lt_bf16(*W[m], hi, lo, n, y[m]);
    return;
  }
  bool same = grouped_ && count >= 2 && count <= kLinearGroupMax;
  const Path path = same ? path_of(*W[0]) : Path::Other;
  for (int m = 1; same && m < count; ++m)
    same = path_of(*W[m]) == path && W[m]->format == W[0]->format && W[m]->cols == W[0]->cols;
  if (!same || path == Path::Other) {
    for (int m = 0; m < count; ++m) run(*W[m], x, n, y[m]);
    return;
  }
  const int nt = static_cast<int>(n);
  if (path == Path::Gemv) {
    K3_CUDA_CHECK(linear_gemv_group(W, y, count, x, nt, stream_));
    return;
  }
  if (fused_split_ && n <= kSkinnyFusedMaxTokens && reinterpret_cast<uintptr_t>(x) % 16 == 0) {
    K3_CUDA_CHECK(linear_skinny_group_f32(W, y, count, x, nt, stream_));
    return;
  }
  const auto [hi, lo] = bf16_halves(x, n * W[0]->cols, false);  // split once for the whole group
  K3_CUDA_CHECK(to_bf16_split(x, n * W[0]->cols, hi, lo, stream_));
  K3_CUDA_CHECK(linear_skinny_group(W, y, count, hi, lo, nt, stream_));
}

// The dense projections' one dispatch point on the weight format (the GEMV and the Lt GEMMs below).
void LinearRunner::run(const DeviceLinear& W, const float* x, int64_t n, float* y) {
  if (is_gguf_block(W.format)) return run_blocks(W, x, n, y);
  if (W.format != WeightFormat::BF16 && W.format != WeightFormat::F32)
    throw Error(std::string("CUDA backend: no dense projection kernel for ") + weight_format_name(W.format) + " weights");
  if (n <= 0 || W.rows <= 0) return;
  if (skinny_ && linear_skinny_supported(W, n)) {  // 2..32 tokens, bf16: tensor cores, W read once
    if (fused_split_ && n <= kSkinnyFusedMaxTokens && reinterpret_cast<uintptr_t>(x) % 16 == 0) {  // one launch
      K3_CUDA_CHECK(linear_skinny_f32(W, x, static_cast<int>(n), y, stream_));
      return;
    }
    const auto [hi, lo] = bf16_halves(x, n * W.cols, false);
    K3_CUDA_CHECK(to_bf16_split(x, n * W.cols, hi, lo, stream_));
    K3_CUDA_CHECK(linear_skinny(W, hi, lo, static_cast<int>(n), y, stream_));
    return;
  }
  if (n <= kGemvMaxTokens) {
    K3_CUDA_CHECK(linear_gemv(W, x, static_cast<int>(n), y, stream_));
    return;
  }
  const int64_t m = W.rows, k = W.cols;
  if (k <= 0) {  // an empty sum (Lt layouts need at least one row)
    K3_CUDA_CHECK(cudaMemsetAsync(y, 0, static_cast<size_t>(n * m) * sizeof(float), stream_));
    return;
  }
  if (W.format == WeightFormat::F32) {
    // fp32 weights take the same Lt path with fp32 operands. CUBLAS_COMPUTE_32F is true fp32 (no TF32),
    // so the numerics are those of the cublasSgemm this replaces and Lt brings no speed of its own here
    // (the same SIMT SGEMM kernels); it is used for one code path, the algorithm chosen once per shape,
    // and the explicit handling of unaligned x / y pointers.
    lt_matmul(WeightFormat::F32, m, n, k, W.data, x, 0.0f, y);
    return;
  }
  // Decode-sized batches in bf16x2: one GEMM over the 2n columns [hi | lo] (x's halves stored back to
  // back) reads W once instead of twice; the two products are added after (the same fp32 sum the
  // accumulating second GEMM formed). Bounded so that the [2n][m] scratch stays small.
  const bool merged = merges_halves(W, n);
  const auto [hi, lo] = bf16_halves(x, n * k, merged);
  convert_x(x, n * k, hi, lo);
  if (!merged) return lt_bf16(W, hi, lo, n, y);
  const size_t need = static_cast<size_t>(2 * n * m) * sizeof(float);
  if (ys_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued GEMM may still write the old buffer
    ys_ = DeviceBuffer(need);
    ++generation_;
  }
  lt_matmul(WeightFormat::BF16, m, 2 * n, k, W.data, hi, 0.0f, ys_.get<float>());
  K3_CUDA_CHECK(add_halves(ys_.get<float>(), n * m, y, stream_));
}

bool LinearRunner::takes_lt_bf16(const DeviceLinear& W, int64_t n) const {
  if (W.format != WeightFormat::BF16 || n <= kGemvMaxTokens || W.rows <= 0 || W.cols <= 0) return false;
  if (skinny_ && linear_skinny_supported(W, n)) return false;
  return !merges_halves(W, n);
}

void LinearRunner::convert_x(const float* x, int64_t count, uint16_t* hi, uint16_t* lo) {
  if (precision_ == GemmPrecision::Bf16x2)
    K3_CUDA_CHECK(to_bf16_split(x, count, hi, lo, stream_));
  else
    K3_CUDA_CHECK(to_bf16(x, count, hi, stream_));
}

bool LinearRunner::merges_halves(const DeviceLinear& W, int64_t n) const {
  return precision_ == GemmPrecision::Bf16x2 && merged_ && n <= kMergedMaxTokens && 2 * n * W.rows <= kMergedMaxFloats;
}

void LinearRunner::lt_bf16(const DeviceLinear& W, const uint16_t* hi, const uint16_t* lo, int64_t n, float* y) {
  const int64_t m = W.rows, k = W.cols;
  lt_matmul(WeightFormat::BF16, m, n, k, W.data, hi, 0.0f, y);
  if (precision_ == GemmPrecision::Bf16x2)
    lt_matmul(WeightFormat::BF16, m, n, k, W.data, lo, 1.0f, y);  // D += W . lo (C == D, beta = 1)
}

}  // namespace k3::cuda
