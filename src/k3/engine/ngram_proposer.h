// Prompt lookup / n-gram proposer (vLLM's "ngram" method): find the longest n-gram (prompt_lookup_min
// <= n <= prompt_lookup_max) that ends the sequence and occurred earlier in it (prompt or output);
// propose the tokens that followed that earlier occurrence. Hits where text repeats: code edited in
// place, summaries quoting their source, structured output.
#pragma once
#include "k3/engine/proposer.h"

namespace k3::engine {

class NgramProposer final : public Proposer {
 public:
  NgramProposer(int64_t min_n, int64_t max_n) : min_n_(min_n), max_n_(max_n) {}
  void propose(std::span<const DraftSlot> batch) override;

  // One sequence: writes up to max_drafts tokens into `out` (cleared first).
  void propose_one(std::span<const int32_t> tokens, int64_t max_drafts, std::vector<int32_t>& out) const;

 private:
  int64_t min_n_, max_n_;
};

}  // namespace k3::engine
