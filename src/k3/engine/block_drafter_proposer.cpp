#include "k3/engine/block_drafter_proposer.h"

#include <algorithm>
#include <string>

#include "k3/core/error.h"

namespace k3::engine {

BlockDrafterProposer::BlockDrafterProposer(const drafter::BlockDrafter& d, int64_t k, int64_t target_vocab)
    : drafter_(d), k_(k) {
  const drafter::DrafterConfig& c = d.config();
  if (k < 1 || k > c.block_size)
    throw Error("--speculative-config: num_speculative_tokens " + std::to_string(k) + " exceeds the block drafter's block_size " +
                std::to_string(c.block_size) + " (" + c.source + ")");
  if (d.vocab_size() != target_vocab)
    throw Error("--speculative-config: the block drafter's target_vocab_size (" + std::to_string(d.vocab_size()) +
                ") differs from the target's vocab_size (" + std::to_string(target_vocab) + ")");
}

void BlockDrafterProposer::propose(std::span<const DraftSlot> batch) {
  const size_t dim = static_cast<size_t>(drafter_.config().ctx_dim());
  std::vector<size_t> owner;
  ctx_.clear();
  last_.clear();
  int64_t n_out = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DraftSlot& s = batch[i];
    s.drafts->clear();
    if (s.max_drafts <= 0 || s.tokens.empty() || s.ctx.size() != dim) continue;
    owner.push_back(i);
    ctx_.insert(ctx_.end(), s.ctx.begin(), s.ctx.end());
    last_.push_back(s.tokens.back());
    n_out = std::max(n_out, std::min(s.max_drafts, k_));
  }
  if (owner.empty()) return;
  // Every block position is computed anyway (attention inside the block is not causal); the head runs on
  // the first n_out only.
  drafter_.draft(ctx_, last_, n_out, out_);
  ++forwards_;
  for (size_t r = 0; r < owner.size(); ++r) {
    const DraftSlot& s = batch[owner[r]];
    const auto first = out_.begin() + static_cast<int64_t>(r) * n_out;
    s.drafts->assign(first, first + std::min(s.max_drafts, k_));
  }
}

}  // namespace k3::engine
