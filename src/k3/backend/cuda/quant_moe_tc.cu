// launch_tc_gguf (moe_tc_tile.cuh): GGUF block experts on the tensor-core expert tiles, the prefill path of
// quantised experts (moe_experts with a GGUF bank; quant_moe.cu's per-pair kernels re-read an expert once per
// token routed to it, these once per 64-pair tile). One instantiation per format and matrix kind (gate+up,
// down), activations plain bf16 (SPLIT off).
#include <atomic>

#include "k3/backend/cuda/moe_tc_tile.cuh"

namespace k3::cuda {

namespace {

// One launch of the tile kernel for format F with its raw-staging ring as dynamic shared memory (above the
// 48 KiB default for the 32-element formats: the opt-in attribute, set once per device and instantiation, not on
// every prefill launch).
template <WeightFormat F, int NMAT, bool GATHER>
cudaError_t launch_one(dim3 grid, const TileArgs& a, cudaStream_t stream) {
  constexpr int smem = raw_smem_bytes<F>();
  static std::atomic<uint64_t> set_on{0};  // bit d: done on device d (devices 0..63; others set it every time)
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (bit == 0 || !(set_on.load(std::memory_order_acquire) & bit)) {
    e = cudaFuncSetAttribute(expert_tc_kernel<F, NMAT, GATHER, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    set_on.fetch_or(bit, std::memory_order_release);
  }
  expert_tc_kernel<F, NMAT, GATHER, false><<<grid, kTcThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_tc_gguf(const ExpertBank& w, int n_tiles_bound, TileArgs a, float* y, cudaStream_t stream) {
  const WeightFormat df = expert_down_format(w);
  a.T = iq_tables();
  a.row_bytes = row_data_bytes(w.format, w.X);
  a.mat_bytes = static_cast<int64_t>(w.E) * w.I * a.row_bytes;
  constexpr int gu_rows = kTcBRows / 2, down_rows = kTcBRows;
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + gu_rows - 1) / gu_rows));
  cudaError_t e = with_gguf_format(w.format, [&](auto f) { return launch_one<decltype(f)::value, 2, true>(g1, a, stream); });
  if (e != cudaSuccess) return e;
  e = round_hidden_mxfp8(a, stream);
  if (e != cudaSuccess) return e;
  float* hidden = a.out;
  to_down_args(a, w, hidden, y);
  a.row_bytes = row_data_bytes(df, w.I);
  a.mat_bytes = static_cast<int64_t>(w.E) * w.X * a.row_bytes;
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + down_rows - 1) / down_rows));
  return with_gguf_format(df, [&](auto f) { return launch_one<decltype(f)::value, 1, false>(g2, a, stream); });
}

}  // namespace k3::cuda
