// Expert pruning (issue 15 item 5): REAP, router-weighted expert activation pruning (Lasby et al., Cerebras,
// 2025): over calibration tokens, an expert's saliency is the mean, over the tokens routed to it, of its
// routing weight times the L2 norm of its output, S_j = mean_{x routed to j} g_j(x) ||f_j(x)||; each MoE layer
// keeps its n highest-saliency experts. ("frequency", the baseline, scores by how often an expert is routed.)
// The pruned checkpoint keeps the kept experts' tensors byte for byte, renumbered 0..n-1 in their old order,
// the router's rows and correction-bias entries of the same experts, and config.json's num_experts = n, so
// routing among the kept experts is unchanged (a token whose top-k were all kept is computed exactly as
// before: ExpertPrune.UnusedExpertsPrunedLeaveLogitsIdentical).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/weights.h"

namespace k3 {

enum class PruneMethod { Reap, Frequency };
// "reap" / "frequency"; throws k3::Error naming the choices.
PruneMethod parse_prune_method(const std::string& s);

// Accumulates per (MoE layer, expert): count of routed tokens, sum of g ||f||.
class ExpertSaliency final : public cpu::ActivationObserver {
 public:
  explicit ExpertSaliency(const ModelWeights& w);
  void on_expert_outputs(const MoeWeights& w, int64_t expert, std::span<const std::pair<int64_t, float>> toks,
                         const float* y, int64_t cols) override;
  // Per model layer (empty for dense layers): each expert's score under `m` (0 for an expert never routed).
  std::vector<std::vector<double>> scores(PruneMethod m) const;
  int64_t routed(int64_t layer, int64_t expert) const { return count_[static_cast<size_t>(layer)][static_cast<size_t>(expert)]; }

 private:
  std::unordered_map<const MoeWeights*, int64_t> layer_of_;
  std::vector<std::vector<double>> sum_;
  std::vector<std::vector<int64_t>> count_;
};

// The experts each layer keeps: the n_keep highest scores (ties: the lower id), in ascending id order;
// layers with no scores (dense) stay empty.
std::vector<std::vector<int64_t>> experts_to_keep(const std::vector<std::vector<double>>& scores, int64_t n_keep);

// Writes `out_dir` from the checkpoint in `src_dir`: per MoE layer only `keep[layer]`'s experts (renumbered),
// the router rows / bias entries of those experts, num_experts updated in config.json, every other tensor and
// file as it was (shards as in the source). `progress(done_bytes, total_bytes)` after each shard.
// Throws k3::Error (out_dir equal to src_dir or holding a config.json, unwritable, inconsistent keep lists).
struct PruneWriteResult {
  int64_t tensors_in = 0, tensors_out = 0, bytes_in = 0, bytes_out = 0;
};
PruneWriteResult write_pruned_checkpoint(const std::string& src_dir, const Checkpoint& ckpt, const ModelConfig& cfg,
                                         const std::vector<std::vector<int64_t>>& keep, const std::string& out_dir,
                                         const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace k3
