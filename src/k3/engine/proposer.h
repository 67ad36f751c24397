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

namespace k3::engine {

// One sequence's draft request.
struct DraftSlot {
  std::span<const int32_t> tokens;  // prompt + generated so far (the last one not yet run)
  int64_t max_drafts = 0;           // at most this many (<= num_speculative_tokens; 0: none wanted)
  std::vector<int32_t>* drafts = nullptr;  // out: cleared, then the proposed tokens
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Fills every slot's drafts (possibly none). Must not throw for any token content.
  virtual void propose(std::span<const DraftSlot> batch) = 0;
};

// The proposer a config asks for (throws k3::Error for a method not built yet).
std::unique_ptr<Proposer> make_proposer(const SpeculativeConfig& cfg);

}  // namespace k3::engine
