// Block-drafter proposer (method "block_drafter", docs/block-drafter.md): each sequence's k drafts come
// from ONE forward of the drafter over the target's taps of the row that produced the sequence's last
// token (DraftSlot::ctx, kept by the engine) and that token; all sequences asking in one batched forward.
// Stateless between calls: nothing to roll back when drafts are rejected.
//
// Greedy drafts (each block position's argmax) are one-hot proposals, so the engine's acceptance rule
// keeps sampled output exact, as with the other proposers.
#pragma once
#include <cstdint>
#include <vector>

#include "k3/engine/proposer.h"
#include "k3/model/drafter/block_drafter.h"

namespace k3::engine {

class BlockDrafterProposer final : public Proposer {
 public:
  // `k`: num_speculative_tokens. Throws k3::Error when k exceeds the drafter's block_size or the
  // drafter's vocabulary is not the target's (`target_vocab`).
  BlockDrafterProposer(const drafter::BlockDrafter& d, int64_t k, int64_t target_vocab);
  // A slot without taps (ctx empty or of the wrong size) gets no drafts.
  void propose(std::span<const DraftSlot> batch) override;
  std::span<const int32_t> tap_layers() const override { return drafter_.tap_layers(); }

  int64_t forwards() const { return forwards_; }  // drafter forwards run (tests: one per call with work)

 private:
  const drafter::BlockDrafter& drafter_;
  int64_t k_;
  std::vector<float> ctx_;        // the batch's taps [R][T * H]
  std::vector<int32_t> last_, out_;
  int64_t forwards_ = 0;
};

}  // namespace k3::engine
