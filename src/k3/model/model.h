// A loaded Kimi K3 / Kimi-Linear model on the CPU: config + mapped checkpoint + bound weights, run by the
// one forward graph (model/graph/forward.h) over the CPU backend. One call runs a batch of sequences,
// each appending its tokens.
#pragma once
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/decode_layout.h"
#include "k3/core/moe_activation.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/model_files.h"
#include "k3/model/sequence_state.h"
#include "k3/model/weights.h"
#include "k3/runtime/expert_residency.h"
#include "k3/runtime/model_runner.h"

namespace k3 {

class Model final : public ModelRunner {
 public:
  // Reads config.json, maps the safetensors, validates and binds every tensor; the cache holds MLA rows
  // as `kv` and the KDA state as `ssm` (runtime/cache_spec.h); routed experts stay file-backed, their
  // residency managed as `experts` says (runtime/expert_residency.h). Throws k3::Error.
  static std::unique_ptr<Model> load(const std::string& dir, CacheDType kv = CacheDType::F32,
                                     CacheDType ssm = CacheDType::F32, ExpertResidencyOptions experts = {});
  // The same over files already opened (an HF dir, a GGUF, or model/dummy_checkpoint.h's random weights).
  static std::unique_ptr<Model> load(ModelFiles files, CacheDType kv = CacheDType::F32, CacheDType ssm = CacheDType::F32,
                                     ExpertResidencyOptions experts = {});

  const ModelConfig& config() const override { return cfg_; }
  const CacheSpec& cache_spec() const override { return spec_; }
  std::string device_name() const override { return "cpu"; }
  std::unique_ptr<SequenceCache> new_cache() const override { return std::make_unique<SequenceState>(spec_); }
  std::shared_ptr<CacheMemory> cache_memory() const override { return host_cache_memory(); }
  int64_t memory_available() const override;
  std::optional<ExpertCacheStats> expert_cache_stats() const override;
  // The CPU backend's KDA ops save the state mid-step (BatchItem::snapshot_after).
  bool supports_state_snapshots() const override { return true; }
  bool supports_taps() const override { return true; }
  const ModelWeights& weights() const { return w_; }
  // Second copies of the dense Q4_K matrices in the CPU's decode layout (backend/cpu/decode_layout.h: +2.8% of their
  // bytes, the same bits, a cheaper one-token product; opt-in) and of the MXFP4 routed experts (mxfp4_rowblocks.h: the
  // same bytes, a product ~2x as fast a core, llama.cpp's activation class: the stored experts' pages released as each
  // layer's copies are written, and the expert residency rebuilt over the stored bytes still read -- none when every
  // expert has its copy); once, before the forwards that decode. Not at load: `k3 info`, imatrix and prune load models
  // they never decode. `experts` false: the dense copies only (--no-repack). `release_stored` false: the stored experts'
  // pages stay (the tests' reference: releasing them must change no result).
  void add_decode_layouts(bool experts = true, bool release_stored = true);
  // Bytes of the MXFP4 experts' copies add_decode_layouts made (0: none), and of the stored experts' pages it gave back.
  int64_t expert_copy_bytes() const { return expert_layouts_.bytes; }
  int64_t expert_released_bytes() const { return expert_layouts_.released; }
  // Observes the activations of later forwards (null: stop); see cpu::ActivationObserver.
  void set_activation_observer(cpu::ActivationObserver* o) {
    std::lock_guard lk(mu_);
    backend_.set_activation_observer(o);
  }
  // --moe-activation-dtype: the routed experts' activation precision in later forwards (CpuBackend's; default F32).
  void set_moe_activation_dtype(MoeActivationDType t) {
    std::lock_guard lk(mu_);
    backend_.set_moe_activation_dtype(t);
  }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  SequenceState new_sequence() const { return SequenceState(spec_); }

  using ModelRunner::forward;
  void forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                     const ForwardOptions& opt = {}) const override;

 private:
  ModelConfig cfg_;
  CacheSpec spec_;
  std::unique_ptr<Checkpoint> ckpt_;
  ModelWeights w_;
  cpu::DecodeLayouts decode_layouts_;  // second copies of w_'s dense Q4_K matrices for the one-token products
  cpu::DecodeLayouts expert_layouts_;  // and of its MXFP4 routed experts
  std::unique_ptr<ExpertResidency> residency_;  // null without MoE layers or when turned off
  ExpertResidencyOptions residency_opt_;        // what it was made with (add_decode_layouts remakes it)
  // The graph's ops run on the CPU backend; its scratch is reused across steps (one step at a time).
  mutable std::mutex mu_;
  mutable cpu::CpuBackend backend_;
  mutable std::vector<float> tap_major_;  // the graph's taps [T * rows][H], before taps_to_rows
};

}  // namespace k3
