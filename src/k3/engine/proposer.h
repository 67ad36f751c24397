// Draft proposers of speculative decoding: each running sequence gets up to k guessed next tokens,
// which the engine verifies in the target model's next forward pass (batch_engine.cpp). A proposer is
// asked once per engine step for all the sequences about to decode, so a draft model (or a block
// drafter that reads the target's hidden states) can run them as one batch; the n-gram proposer needs
// nothing but the tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "k3/engine/speculative_config.h"

namespace k3 {
class ModelRunner;
namespace drafter {
class BlockDrafter;
}
}

namespace k3::engine {

// One sequence's draft request.
struct DraftSlot {
  std::span<const int32_t> tokens;  // prompt + generated so far (the last one not yet run)
  // Which sequence (stable while it runs): a stateful proposer keeps per-sequence state under it and
  // checks it against `tokens` (a key may be reused by a later sequence).
  const void* seq = nullptr;
  int64_t max_drafts = 0;           // at most this many (<= num_speculative_tokens; 0: none wanted)
  std::vector<int32_t>* drafts = nullptr;  // out: cleared, then the proposed tokens
  // The target's taps (ForwardOptions::tap_layers) of the row whose logits produced the last token:
  // [T * H], T = Proposer::tap_layers().size(); empty when the proposer reads none or the engine holds
  // none for this sequence (then a proposer that needs them drafts nothing).
  std::span<const float> ctx = {};
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Fills every slot's drafts (possibly none). Must not throw for any token content.
  virtual void propose(std::span<const DraftSlot> batch) = 0;
  // The target's hidden states this proposer reads (ForwardOptions::tap_layers; a block drafter's); empty:
  // none, and the engine asks the target for none.
  virtual std::span<const int32_t> tap_layers() const { return {}; }
};

// The proposer a config asks for; `draft`: the loaded draft model of method "draft_model", `block`: the
// loaded drafter of method "block_drafter" (the caller owns them; they must outlive the proposer), whose
// vocabulary must be the target's (`target_vocab`). Throws k3::Error for a method not built yet, a missing
// model or a vocabulary mismatch.
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg, const ModelRunner* draft = nullptr,
                                        int64_t target_vocab = 0, const drafter::BlockDrafter* block = nullptr);

}  // namespace k3::engine
