// launch_tc_gguf (moe_tc_tile.cuh): GGUF block experts on the tensor-core expert tiles, the prefill path of
// quantised experts (moe_experts with a GGUF bank; quant_moe.cu's per-pair kernels re-read an expert once per
// token routed to it, these once per 64-pair tile). One instantiation per format and matrix kind (gate+up,
// down), activations plain bf16 (SPLIT off).
#include "k3/backend/cuda/moe_tc_tile.cuh"

namespace k3::cuda {

cudaError_t launch_tc_gguf(const ExpertBank& w, int n_tiles_bound, TileArgs a, float* y, cudaStream_t stream) {
  const WeightFormat df = is_gguf_block(w.down_format) ? w.down_format : w.format;
  a.T = iq_tables();
  a.row_bytes = row_data_bytes(w.format, w.X);
  constexpr int gu_rows = kTcBRows / 2, down_rows = kTcBRows;
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + gu_rows - 1) / gu_rows));
  cudaError_t e = with_gguf_format(w.format, [&](auto f) {
    expert_tc_kernel<decltype(f)::value, 2, true, false><<<g1, kTcThreads, 0, stream>>>(a);
    return cudaGetLastError();
  });
  if (e != cudaSuccess) return e;
  float* hidden = a.out;
  to_down_args(a, w, hidden, y);
  a.row_bytes = row_data_bytes(df, w.I);
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + down_rows - 1) / down_rows));
  return with_gguf_format(df, [&](auto f) {
    expert_tc_kernel<decltype(f)::value, 1, false, false><<<g2, kTcThreads, 0, stream>>>(a);
    return cudaGetLastError();
  });
}

}  // namespace k3::cuda
