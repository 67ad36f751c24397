// CudaBackend's collectives (tensor / expert parallel): the activations are device memory, so they go
// to the communicator as device pointers; NcclComm queues each collective on the stream it was made
// with, which must be this backend's (CudaLoadOptions::communicator is called with it), so the
// collectives are ordered with the kernels and captured into the decode CUDA graphs with them. A
// strided tensor goes through one packed scratch copy (cudaMemcpy2DAsync) each way.
#include <algorithm>
#include <string>
#include <vector>

#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/core/error.h"
#include "k3/dist/shard_plan.h"

namespace k3::cuda {

using graph::Tensor;

void CudaBackend::embed_rows(const WeightMatrix& table, int64_t first, Tensor out) {
  if (table.device == kHostDevice || table.format != WeightFormat::BF16)
    throw Error("CUDA backend: a vocab-parallel embedding needs a bf16 table on the GPU");
  K3_CUDA_CHECK(cuda::embed_rows_shard(static_cast<const uint16_t*>(table.data), table.cols, staged<const int32_t>(sd_.tokens),
                                       static_cast<int>(out.rows), first, table.rows, out.stride, out.f(), stream_));
}

void CudaBackend::all_reduce_sum(Tensor x) {
  dist::Communicator& comm = dist::need_communicator(comm_, "the CUDA backend");
  prof_.begin("all-reduce", stream_);
  if (x.contiguous()) {
    comm.all_reduce_sum(x.f(), static_cast<size_t>(x.count()));
  } else {
    graph::ScratchScope scope(*this);
    const Tensor packed = scratch(x.rows, x.cols, graph::ElemType::F32);
    const size_t w = static_cast<size_t>(x.cols) * 4;
    K3_CUDA_CHECK(cudaMemcpy2DAsync(packed.f(), w, x.f(), static_cast<size_t>(x.stride) * 4, w, static_cast<size_t>(x.rows),
                                    cudaMemcpyDeviceToDevice, stream_));
    comm.all_reduce_sum(packed.f(), static_cast<size_t>(x.count()));
    K3_CUDA_CHECK(cudaMemcpy2DAsync(x.f(), static_cast<size_t>(x.stride) * 4, packed.f(), w, w, static_cast<size_t>(x.rows),
                                    cudaMemcpyDeviceToDevice, stream_));
  }
  prof_.end(stream_);
}

// As the CPU backend's: every rank sends [n][chunk] (zero padding past its columns), rank 0 receives
// [P][n][chunk] and places rank p's columns at p * chunk.
void CudaBackend::gather_cols(Tensor local, int64_t chunk, Tensor out) {
  dist::Communicator& comm = dist::need_communicator(comm_, "the CUDA backend");
  const int64_t n = out.rows, P = comm.size();
  dist::check_gather_cols(local.rows, local.cols, chunk, P, n, out.cols);
  const bool root = comm.is_root();
  graph::ScratchScope scope(*this);
  const Tensor send = scratch(n, chunk, graph::ElemType::F32);
  const Tensor recv = root ? scratch(P * n, chunk, graph::ElemType::F32) : Tensor{};
  const size_t cb = static_cast<size_t>(chunk) * 4;
  K3_CUDA_CHECK(cudaMemsetAsync(send.f(), 0, static_cast<size_t>(n) * cb, stream_));
  K3_CUDA_CHECK(cudaMemcpy2DAsync(send.f(), cb, local.f(), static_cast<size_t>(local.stride) * 4,
                                  static_cast<size_t>(local.cols) * 4, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
  prof_.begin("gather logits", stream_);
  comm.gather(send.f(), static_cast<size_t>(n) * cb, root ? recv.f() : nullptr, 0);
  prof_.end(stream_);
  if (!root) return;
  for (int64_t p = 0; p < P; ++p) {
    const int64_t c0 = p * chunk, w = std::min(chunk, out.cols - c0);
    if (w <= 0) break;
    K3_CUDA_CHECK(cudaMemcpy2DAsync(out.f() + c0, static_cast<size_t>(out.stride) * 4, recv.f() + p * n * chunk, cb,
                                    static_cast<size_t>(w) * 4, static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream_));
  }
}

// The expert id -> local index table is uploaded once per plan, outside any stream capture (the first
// sharded step runs eagerly: a prefill, or CudaModel's warm-up).
void CudaBackend::moe_keep_experts(Tensor idx, const dist::ShardPlan& shard) {
  if (expert_map_of_ != &shard) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    K3_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing != cudaStreamCaptureStatusNone)
      throw Error("CUDA backend: the expert map must be uploaded before a decode step is captured");
    std::vector<int32_t> map(shard.expert_slot.size());
    for (size_t e = 0; e < map.size(); ++e) map[e] = shard.local_expert(static_cast<int32_t>(e));
    expert_map_d_ = DeviceBuffer(std::max<size_t>(map.size(), 1) * sizeof(int32_t));
    K3_CUDA_CHECK(cudaMemcpy(expert_map_d_.get<int32_t>(), map.data(), map.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    expert_map_of_ = &shard;
  }
  if (!idx.contiguous()) throw Error("CUDA backend: moe_keep_experts over a strided routing table");
  K3_CUDA_CHECK(cuda::map_ids(idx.i(), idx.count(), expert_map_d_.get<int32_t>(),
                              static_cast<int64_t>(shard.expert_slot.size()), stream_));
}

}  // namespace k3::cuda
