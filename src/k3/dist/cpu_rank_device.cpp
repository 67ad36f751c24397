// The CPU rank of a sharded model (rank_device.h): the CPU backend with the group's communicator, over
// the shard's weights in host memory (borrowed: TpModel keeps them) and caches in host memory.
#include <unistd.h>

#include <algorithm>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/dist/rank_device.h"
#include "k3/model/graph/forward.h"

namespace k3::dist {

namespace {

class CpuRankDevice final : public RankDevice {
 public:
  CpuRankDevice(const RankShard& s, int ranks_on_host)
      : cfg_(s.config), w_(s.weights), plan_(s.plan), ranks_on_host_(ranks_on_host) {
    backend_.set_communicator(&s.comm);
    backend_.set_moe_activation_dtype(s.moe_activation);
  }
  std::string name() const override { return "cpu"; }
  bool reads_host_weights() const override { return true; }
  std::shared_ptr<CacheMemory> cache_memory() const override { return host_cache_memory(); }
  // The ranks of one host share its RAM; a rank's cache gets its share.
  int64_t memory_available() const override {
    const int64_t ram = static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
    return ram / std::max(ranks_on_host_, 1);
  }
  void forward(const graph::StepPlan& plan, float* logits) override {
    graph::forward(cfg_, w_, backend_, plan, graph::Tensor::f32(logits, plan.n_logits(), cfg_.vocab_size), &plan_);
  }

 private:
  ModelConfig cfg_;
  const ModelWeights& w_;
  const ShardPlan& plan_;
  int ranks_on_host_;
  cpu::CpuBackend backend_;
};

}  // namespace

std::unique_ptr<RankDevice> make_cpu_rank_device(const RankShard& s, int ranks_on_host) {
  return std::make_unique<CpuRankDevice>(s, ranks_on_host);
}

}  // namespace k3::dist
