// RankDevice: where one rank of a sharded model runs its shard of the one forward graph -- the CPU
// backend over host memory (make_cpu_rank_device) or a GPU (backend/cuda/cuda_rank_device.h). TpModel
// (tp_model.h) owns the group's protocol (the step broadcast, the journaled cache memory, failures) and
// drives one RankDevice per rank; the device owns its backend, its copy of the shard's weights and the
// memory the rank's caches live in. Ranks of one group may sit on different kinds of device (a GPU rank
// and a CPU rank): every rank's CacheSpec is the same, so rank 0's cache journal replays on any of them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "k3/core/moe_activation.h"
#include "k3/dist/communicator.h"
#include "k3/dist/shard_plan.h"
#include "k3/model/config.h"
#include "k3/model/graph/step.h"
#include "k3/model/weights.h"
#include "k3/runtime/cache_memory.h"
#include "k3/runtime/cache_spec.h"

namespace k3::dist {

// What a device is given to build one rank: the rank's shard (config, weights in host memory, plan) and
// the group's communicator (host memory; a device that computes elsewhere makes its own view of it).
struct RankShard {
  const ModelConfig& config;   // the rank's shard of the config (shard_config)
  const ModelWeights& weights;  // the rank's shard, host memory (views into the mapping + copies)
  const ShardPlan& plan;
  const CacheSpec& spec;       // one rank's cache spec (the same on every rank)
  Communicator& comm;          // outlives the device
  MoeActivationDType moe_activation = MoeActivationDType::F32;  // --moe-activation-dtype
};

class RankDevice {
 public:
  virtual ~RankDevice() = default;
  // "cpu", "cuda:0 (NVIDIA H200)": for device_name() and the start-up lines.
  virtual std::string name() const = 0;
  // Whether the forward reads RankShard::weights after construction (the CPU does; a GPU has its copy, so
  // the host mapping and the column slices can be dropped).
  virtual bool reads_host_weights() const = 0;
  // The memory this rank's caches live in (the journal's target on rank 0, the mirror's elsewhere).
  virtual std::shared_ptr<CacheMemory> cache_memory() const = 0;
  // Bytes this rank's caches may take (its share of what it has).
  virtual int64_t memory_available() const = 0;
  // One step of the sharded graph over `plan`'s caches (this rank's memory). Rank 0 gets the
  // [plan.n_logits()][V] logits in host memory at `logits`; the other ranks pass null. Caches are not
  // advanced here (TpModel does that on rank 0).
  virtual void forward(const graph::StepPlan& plan, float* logits) = 0;
};

using RankDeviceFactory = std::function<std::unique_ptr<RankDevice>(const RankShard&)>;

// The CPU backend over host memory; `ranks_on_host` processes share this host's RAM.
std::unique_ptr<RankDevice> make_cpu_rank_device(const RankShard& s, int ranks_on_host);

}  // namespace k3::dist
