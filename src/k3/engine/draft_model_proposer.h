// Draft-model proposer (vLLM's "draft_model" method): a smaller model with the target's tokenizer guesses
// the next k tokens greedily, one batched forward per draft position over every sequence asking.
//
// Its own per-sequence caches follow the sequences: each keeps the tokens it has consumed, and a call
// first runs only the tokens added since (the accepted drafts and the target's token), so the draft model
// never sees a rejected draft: the guesses run on a copy of the cache (SequenceCache::clone) that is
// dropped afterwards. A cache whose consumed tokens are not a prefix of the sequence (a new sequence under
// a reused key, or a preempted one whose tokens changed) is rebuilt from the tokens; caches of sequences
// absent from a call are freed, so memory stays bounded by the engine's running sequences.
//
// Greedy drafts are deterministic (a one-hot draft distribution), so the engine's acceptance rule for
// sampled requests keeps the target's distribution exactly, as with n-gram drafts.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "k3/engine/proposer.h"
#include "k3/runtime/model_runner.h"

namespace k3::engine {

class DraftModelProposer final : public Proposer {
 public:
  // `target_vocab`: the target's vocabulary size; drafts are ids below it. Throws k3::Error when the
  // draft model's vocabulary differs (a draft model must share the tokenizer).
  DraftModelProposer(const ModelRunner& draft, int64_t target_vocab);
  void propose(std::span<const DraftSlot> batch) override;

  // Sequences whose draft cache is kept (tests: bounded by the callers' sequences).
  size_t cached_sequences() const { return caches_.size(); }
  // Tokens the draft model has run since construction (tests: catch-up runs only what is new).
  int64_t tokens_run() const { return tokens_run_; }

 private:
  struct Entry {
    std::unique_ptr<SequenceCache> cache;
    std::vector<int32_t> consumed;  // the tokens in `cache`, in order
    int32_t next = -1;              // the draft model's guess after `consumed` (-1: none yet)
  };
  Entry& entry_for(const DraftSlot& s);
  void catch_up(std::span<const DraftSlot> batch, std::vector<Entry*>& entries, std::vector<int32_t>& first);
  int32_t argmax(const float* row) const;

  const ModelRunner& draft_;
  int64_t vocab_;  // min(draft, target): the ids a draft may take
  std::unordered_map<const void*, Entry> caches_;
  int64_t tokens_run_ = 0;
};

}  // namespace k3::engine
