// cuda_rank_device.h: a CudaModel shard behind the RankDevice interface.
#include "k3/backend/cuda/cuda_rank_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/host_staged_comm.h"
#include "k3/core/error.h"
#include "k3/dist/nccl_comm.h"

namespace k3::cuda {

namespace {

class CudaRankDevice final : public dist::RankDevice {
 public:
  CudaRankDevice(const dist::RankShard& s, const CudaRankOptions& o) : share_(o.ranks_on_device) {
    CudaLoadOptions lo = o.load;
    lo.moe_activation = s.moe_activation;
    const bool shared = o.group_shares_a_gpu || o.ranks_on_device > 1;
    const bool nccl = o.collectives == CudaRankOptions::Collectives::Nccl ||
                      (o.collectives == CudaRankOptions::Collectives::Auto && !shared);
    if (nccl && shared)  // every rank of the group sees `shared` alike, so every rank stops here
      throw Error("K3_TP_COLLECTIVES=nccl: " + std::to_string(o.ranks_on_device) + " ranks share cuda:" +
                  std::to_string(o.load.device) + (o.ranks_on_device > 1 ? "" : " (and another GPU of the group holds two)") +
                  ", and NCCL needs a GPU per rank (unset it: the group's collectives then go through host memory)");
    collectives_ = nccl ? "nccl" : s.comm.name() + " staged through host memory";
    dist::Communicator& host = s.comm;
    const int dev = o.load.device;
    lo.communicator = [&host, dev, nccl](void* stream) {
      return nccl ? dist::make_nccl_comm(host, dev, stream) : make_host_staged_comm(host, stream);
    };
    if (!nccl) lo.enforce_eager = true;  // a host collective cannot sit in a captured graph
    model_ = CudaModel::load_shard(s.config, s.weights, s.plan, lo);
  }
  std::string name() const override { return model_->device_name() + ", collectives " + collectives_; }
  bool reads_host_weights() const override { return false; }
  std::shared_ptr<CacheMemory> cache_memory() const override { return model_->cache_memory(); }
  // What is free on the GPU, shared by the ranks on it (each holds the same caches).
  int64_t memory_available() const override { return model_->memory_available() / std::max(share_, 1); }
  void forward(const graph::StepPlan& plan, float* logits) override { model_->forward_plan(plan, logits); }

 private:
  int share_;
  std::string collectives_;
  std::unique_ptr<CudaModel> model_;
};

}  // namespace

dist::RankDeviceFactory cuda_rank_device(const CudaRankOptions& o) {
  return [o](const dist::RankShard& s) -> std::unique_ptr<dist::RankDevice> { return std::make_unique<CudaRankDevice>(s, o); };
}

int visible_cuda_devices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

CudaRankOptions::Collectives collectives_from_env() {
  const char* e = std::getenv("K3_TP_COLLECTIVES");
  if (e == nullptr || e[0] == 0) return CudaRankOptions::Collectives::Auto;
  if (std::strcmp(e, "nccl") == 0) return CudaRankOptions::Collectives::Nccl;
  if (std::strcmp(e, "host") == 0) return CudaRankOptions::Collectives::HostStaged;
  throw Error(std::string("K3_TP_COLLECTIVES='") + e + "': expected nccl or host");
}

}  // namespace k3::cuda
