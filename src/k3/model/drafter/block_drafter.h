// BlockDrafter: a loaded block drafter (docs/block-drafter.md): its config and weights, the target's token
// embedding and lm_head (views), and one forward over a batch of drafts, on the CPU backend or a device's
// (DrafterRunner). The
// engine's proposer (engine/block_drafter_proposer.h) feeds it the target's taps.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "k3/core/weight.h"
#include "k3/model/config.h"
#include "k3/model/drafter/drafter_config.h"
#include "k3/model/drafter/drafter_weights.h"
#include "k3/model/graph/step.h"

namespace k3::drafter {

// Where a drafter's forward runs: the CPU backend (the default) or a device's (cuda::make_cuda_drafter_runner).
class DrafterRunner {
 public:
  virtual ~DrafterRunner() = default;
  // drafter_forward (drafter_forward.h) of the R drafts whose last tokens are plan.tokens: ctx [R][T * H] and
  // logits [R * n_out][V] on the host (validated by the caller).
  virtual void forward(const graph::StepPlan& plan, std::span<const float> ctx, int64_t n_out, std::vector<float>& logits) = 0;
  // The same forward, then each logits row's argmax (the lowest id among equal maxima) where the logits are:
  // ids [R * n_out]. False when the runner has no such path (the caller takes the logits and picks itself);
  // a GPU's saves copying R * n_out * V floats to the host and scanning them there.
  virtual bool draft_ids(const graph::StepPlan& plan, std::span<const float> ctx, int64_t n_out, std::vector<int32_t>& ids) {
    (void)plan, (void)ctx, (void)n_out, (void)ids;
    return false;
  }
  virtual std::string device_name() const = 0;  // "cpu", "cuda:0"
};

class BlockDrafter {
 public:
  // The drafter in `dir` (config.json + model.safetensors) for a target whose config and [V][H] token
  // embedding and lm_head are given (views that must outlive the drafter: a CPU Model's weights()).
  // Throws k3::Error: bad config, a missing or mis-shaped tensor, a drafter made for another target.
  static std::unique_ptr<BlockDrafter> load(const std::string& dir, const ModelConfig& target, const WeightMatrix& embed,
                                            const WeightMatrix& lm_head);
  // The same, mapping the target's embedding and lm_head from its files (an HF directory or a GGUF) itself:
  // for a target that runs elsewhere (a GPU) or whose host weights are not at hand.
  static std::unique_ptr<BlockDrafter> load(const std::string& dir, const std::string& target_path);
  ~BlockDrafter();

  const DrafterConfig& config() const;
  std::span<const int32_t> tap_layers() const { return config().target_layer_ids; }
  int64_t vocab_size() const { return config().target_vocab_size; }

  // Logits of R drafts: ctx [R][T * H] (each draft's taps), tokens [R] (each draft's last token, in
  // [0, V)); logits -> [R][n_out][V], positions 0 .. n_out - 1 of each block (1 <= n_out <= block_size).
  // One call at a time per drafter (calls are serialised). Throws k3::Error on bad sizes or token ids.
  void forward(std::span<const float> ctx, std::span<const int32_t> tokens, int64_t n_out, std::vector<float>& logits) const;
  // Runs later forwards on `r` (null: back to the CPU); not while a forward runs.
  void set_runner(std::unique_ptr<DrafterRunner> r);
  std::string device_name() const;
  // What a device runner uploads: the drafter's weights and the target's embedding and lm_head (host views).
  const DrafterWeights& weights() const;

  // forward, then each position's argmax (the lowest id among equal maxima): drafts -> [R][n_out].
  void draft(std::span<const float> ctx, std::span<const int32_t> tokens, int64_t n_out, std::vector<int32_t>& drafts) const;

 private:
  struct Impl;
  // The step plan of R drafts (their last tokens), after checking the sizes and ids.
  graph::StepPlan plan_drafts(std::span<const float> ctx, std::span<const int32_t> tokens, int64_t n_out) const;
  explicit BlockDrafter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::drafter
