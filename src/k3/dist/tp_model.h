// TpModel: one rank of a tensor / expert parallel group (issue 16). Every rank maps the checkpoint, binds
// its shard (shard_plan.h, shard_weights.h) and runs the one forward graph over it on its RankDevice (the
// CPU, or a GPU: rank_device.h); collectives go through the Communicator (MPI between processes; a GPU
// rank's device makes its own view of it: NCCL, or MPI staged through host memory). Rank 0 is the
// ModelRunner the engine sees: its forward_batch plans the step, sends it with the cache operations
// since the last step (step_wire.h, mirrored_memory.h), then runs its own shard; the other ranks wait in
// run_worker() and run the same steps. The logits are gathered on rank 0, which returns them.
#pragma once
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "k3/dist/communicator.h"
#include "k3/dist/mirrored_memory.h"
#include "k3/dist/rank_device.h"
#include "k3/dist/shard_plan.h"
#include "k3/dist/shard_weights.h"
#include "k3/io/safetensors.h"
#include "k3/runtime/model_runner.h"

namespace k3::dist {

struct TpLoadOptions {
  bool expert_parallel = false;  // --enable-expert-parallel: routed experts whole, a block per rank
  ExpertPlacement placement;     // EP: which experts each rank holds (a permutation), all-to-all dispatch
  CacheDType kv = CacheDType::F32, ssm = CacheDType::F32;
  // --moe-activation-dtype (CPU ranks only: with `device` set, anything but F32 is an error).
  MoeActivationDType moe_activation = MoeActivationDType::F32;
  bool print_plan = true;        // one line per rank on stderr: what it owns
  bool collectives_at_one_rank = false;  // ShardPlan::collectives_at_one_rank (a check of the collective path)
  // Where this rank runs (called once, on every rank, with its shard); empty: the CPU, the host's RAM
  // shared by all ranks of the group.
  RankDeviceFactory device;
  // The home the shard's weights are bound to (WeightMatrix::device): a GPU rank's ordinal, so that its
  // device takes them all (kHostDevice: kept on the host, as the CPU rank reads them).
  int weights_device = kHostDevice;
  // --load-format dummy: this config's random weights (model/dummy_checkpoint.h, the same seed on every rank, so
  // the ranks shard one model) instead of the directory's checkpoint.
  std::optional<ModelConfig> dummy;
  uint64_t dummy_seed = 0;
};

class TpModel final : public ModelRunner {
 public:
  // Collective: every rank of `comm` calls it. When any rank fails, every rank throws k3::Error (the
  // failing one its own message), so that no rank is left waiting for the others.
  static std::unique_ptr<TpModel> load(const std::string& dir, std::unique_ptr<Communicator> comm,
                                       const TpLoadOptions& opt = {});
  ~TpModel() override;  // rank 0: tells the other ranks to stop

  const ModelConfig& config() const override { return cfg_; }      // the whole model's
  const CacheSpec& cache_spec() const override { return spec_; }   // one rank's (the same on every rank)
  std::string device_name() const override;
  std::unique_ptr<SequenceCache> new_cache() const override;
  std::shared_ptr<CacheMemory> cache_memory() const override { return memory_; }
  int64_t memory_available() const override;
  // Rank 0. When another rank is lost during the step (PeerLost), throws k3::Error and the model is
  // failed for good (failure()): the engine fails the step's requests instead of waiting forever.
  void forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                     const ForwardOptions& opt = {}) const override;
  // Empty while the group can run steps; else why it never will again (a lost rank). Thread-safe.
  std::string failure() const;

  const ShardPlan& shard_plan() const { return plan_; }
  const ModelConfig& shard_config() const { return local_cfg_; }
  Communicator& comm() const { return *comm_; }
  int64_t copied_weight_bytes() const { return copied_bytes_; }
  // Ranks other than 0: runs rank 0's steps until rank 0 stops (its TpModel destroyed). A failure here
  // ends the whole job (Communicator::abort): rank 0 would otherwise wait in the next collective.
  void run_worker();

 private:
  TpModel() = default;
  void load_shard(const std::string& dir, const TpLoadOptions& opt);
  [[noreturn]] void fail(const char* where, const std::exception& e) const;

  std::unique_ptr<Communicator> comm_;
  ModelConfig cfg_, local_cfg_;
  ShardPlan plan_;
  CacheSpec spec_;
  std::unique_ptr<Checkpoint> ckpt_;
  ModelWeights full_;  // views into the mapping the shard borrows from (dropped when the device has its copy)
  ShardedWeights shard_;
  int64_t copied_bytes_ = 0;
  std::unique_ptr<RankDevice> device_;  // borrows comm_ and (on the CPU) shard_: declared after them
  std::shared_ptr<JournaledMemory> memory_;
  bool ready_ = false;
  mutable std::mutex mu_;                // one step at a time
  mutable std::mutex failure_mu_;
  mutable std::string failure_;          // failure(); set once
};

}  // namespace k3::dist
