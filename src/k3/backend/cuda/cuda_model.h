// The Kimi K3 / Kimi-Linear forward pass on one CUDA GPU (sm_90): the same graph as the CPU Model
// (model/model.cpp), over weights and caches in device memory. Activations are fp32; dense
// projections run through linear.h (fp32 GEMV for decode-sized batches, cuBLAS bf16 tensor cores for
// prefill), KDA/MLA/MoE through their kernel files. One stream; a forward ends with the logits copied
// to the host, or sampled on the GPU and only the ids copied (the step's only synchronisation). Decode steps (one token per sequence) of a batch size
// seen before replay a captured CUDA graph. K3_CUDA_PROFILE=1 prints GPU time per region (eager only).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "k3/dist/communicator.h"
#include "k3/core/moe_activation.h"
#include "k3/dist/shard_plan.h"
#include "k3/model/config.h"
#include "k3/model/graph/step.h"
#include "k3/model/weights.h"
#include "k3/model/placement.h"
#include "k3/runtime/expert_residency.h"
#include "k3/runtime/model_runner.h"

namespace k3::cuda {

struct CudaLoadOptions {
  int device = 0;
  uint64_t dummy_seed = 0x5eed;  // --load-format dummy
  bool gemm_bf16 = false;        // prefill GEMMs with x rounded to bf16 (faster) instead of split bf16x2
  bool enforce_eager = false;    // no CUDA graphs for decode steps
  CacheDType kv_cache_dtype = CacheDType::F32;   // MLA latent rows (--kv-cache-dtype)
  CacheDType ssm_cache_dtype = CacheDType::F32;  // KDA state (--mamba-ssm-cache-dtype)
  MoeActivationDType moe_activation = MoeActivationDType::F32;  // routed experts' activations (--moe-activation-dtype)
  std::shared_ptr<const Placement> placement;    // -ot / --cpu-moe: weights kept on the host (null: none)
  ExpertResidencyOptions experts;                // residency of host-placed routed experts (as the CPU model's)
  // Set: called once with the model's stream (a cudaStream_t) for a communicator on it (NcclComm, or MPI
  // staged through host memory: host_staged_comm.h); the graph then runs its sharded path (vocab-parallel
  // embedding and head, all-reduces) through it. With load(): one rank, TP1 through the communicator, a
  // check that the collective path changes nothing (tests/cuda/test_tp_nccl.cpp); with load_shard(): the
  // plan's ranks.
  std::function<std::unique_ptr<dist::Communicator>(void* stream)> communicator;
};

class CudaModel final : public ModelRunner {
 public:
  // Loads the checkpoint with the CPU loader (validation included), then uploads it.
  static std::unique_ptr<CudaModel> load(const std::string& dir, const CudaLoadOptions& opt = {});
  // One rank's shard of a tensor / expert parallel group (dist/tp_model.h drives it through
  // cuda_rank_device.h): `shard_cfg` and `shard_weights` (host memory, uploaded here) as shard_config /
  // shard_weights made them for `plan`; opt.communicator must give plan.size ranks, this one plan.rank.
  static std::unique_ptr<CudaModel> load_shard(const ModelConfig& shard_cfg, const ModelWeights& shard_weights,
                                               const dist::ShardPlan& plan, const CudaLoadOptions& opt);
  // Random weights of `cfg`'s shapes generated on the device; no checkpoint needed.
  static std::unique_ptr<CudaModel> load_dummy(const ModelConfig& cfg, const CudaLoadOptions& opt = {});
  ~CudaModel() override;

  const ModelConfig& config() const override;
  std::string device_name() const override;
  std::unique_ptr<SequenceCache> new_cache() const override;
  const CacheSpec& cache_spec() const override;
  std::shared_ptr<CacheMemory> cache_memory() const override;
  AttnPath engine_path() const override { return AttnPath::Auto; }
  // KDA state snapshots for speculative decoding's rollback (cuda_backend_kda.cpp: stage_kda_rounds).
  bool supports_state_snapshots() const override { return true; }
  // Taps come down with the logits (the taps buffer: CudaBackend::taps()).
  bool supports_taps() const override { return true; }
  int64_t memory_available() const override;
  // One throw-away prefill of max_tokens tokens and one decode step.
  void warm_up(int64_t max_tokens) const override;  // free device memory (cudaMemGetInfo)
  void forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                     const ForwardOptions& opt = {}) const override;
  // Samples on the GPU (backend/cuda/sampling_kernels.h): only the ids (and raw rows asked for) come back.
  void forward_sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                      std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits,
                      const ForwardOptions& opt = {}) const override;

  // One step planned elsewhere (a sharded group's rank 0 plans, every rank runs it), over the plan's
  // caches (this device's memory), not advanced. `logits`: host [plan.n_logits()][V], or null (not copied).
  void forward_plan(const graph::StepPlan& plan, float* logits) const;

  // Hits, prefetches and the pinned set of the host-placed routed experts (null without any, or turned off).
  std::optional<ExpertCacheStats> expert_cache_stats() const override;
  int64_t weight_bytes() const;
  // The weights as the device holds them (views into its arena; placed matrices on the host): for a
  // block drafter's runner to share the token table and lm_head instead of a second copy. Valid while
  // the model lives.
  const ModelWeights& device_weights() const;
  // Steps run as CUDA graph launches so far (captured or replayed; tests assert the graph path was taken).
  int64_t graph_replays() const;

  struct Impl;

 private:
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::cuda
