// LinearRunner::run_blocks (linear.h): dense projections over GGUF block matrices. Up to
// kQuantGemvMaxTokens tokens: quant_gemv per chunk of kGemvMaxTokens (the blocks read once per chunk,
// decoded in registers; the crossover to tiles is a byte count, not a measurement yet). More: the rows in tiles of at most
// kDequantTileFloats fp32 values (fewer with K3_CUDA_DEQUANT_TILE), each dequantised into the runner's scratch (exact: the CPU's values)
// and multiplied by cublasSgemm (true fp32: the handle keeps the default math mode, no TF32), writing
// its rows of y in place (ldc = rows). Cost per call: one fp32 write + read of the matrix (4 bytes per
// weight, vs ~0.5 stored) and SIMT fp32 FLOPs instead of tensor cores: correct first; a bf16 tile +
// tensor-core GEMM would be the faster path (docs/kernels-cuda.md).
#include <algorithm>
#include <string>

#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/quant_kernels.h"

namespace k3::cuda {

void LinearRunner::run_blocks(const DeviceLinear& W, const float* x, int64_t n, float* y) {
  if (n <= 0 || W.rows <= 0) return;
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
  const int64_t tile = std::clamp<int64_t>(dequant_tile_floats_ / k, 1, m);
  const size_t need = static_cast<size_t>(tile * k) * sizeof(float);
  if (wq_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // a queued GEMM may still read the old tile
    wq_ = DeviceBuffer(need);
    ++generation_;
  }
  const float one = 1.0f, zero = 0.0f;
  for (int64_t r0 = 0; r0 < m; r0 += tile) {
    const int64_t mr = std::min(tile, m - r0);
    K3_CUDA_CHECK(quant_dequant_rows(W, r0, nullptr, mr, wq_.get<float>(), k, stream_));
    // Column-major: y^T[r0 .. r0 + mr) x n (ld m) = tile^T (tile stored [mr][k], ld k, transposed) . x^T [k x n] (ld k)
    check_cublas(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(mr), static_cast<int>(n), static_cast<int>(k), &one,
                             wq_.get<float>(), static_cast<int>(k), x, static_cast<int>(k), &zero, y + r0, static_cast<int>(m)),
                 "cublasSgemm (dequantised GGUF blocks)");
  }
}

}  // namespace k3::cuda
