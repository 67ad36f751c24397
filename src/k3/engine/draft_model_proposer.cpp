#include "k3/engine/draft_model_proposer.h"

#include <algorithm>
#include <string>
#include <unordered_set>

#include "k3/core/error.h"

namespace k3::engine {

DraftModelProposer::DraftModelProposer(const ModelRunner& draft, int64_t target_vocab)
    : draft_(draft), vocab_(draft.config().vocab_size) {
  if (vocab_ != target_vocab)
    throw Error("--speculative-config: the draft model's vocab_size (" + std::to_string(vocab_) +
                ") differs from the target's (" + std::to_string(target_vocab) +
                "): a draft model must share the target's tokenizer");
}

int32_t DraftModelProposer::argmax(const float* row) const {
  // Lowest id among equals: the same guess whatever the row's layout in memory.
  return static_cast<int32_t>(std::max_element(row, row + vocab_) - row);
}

DraftModelProposer::Entry& DraftModelProposer::entry_for(const DraftSlot& s) {
  auto it = caches_.find(s.seq);
  if (it != caches_.end()) {
    const Entry& e = it->second;
    const bool prefix = e.consumed.size() <= s.tokens.size() &&
                        std::equal(e.consumed.begin(), e.consumed.end(), s.tokens.begin()) &&
                        (e.consumed.size() < s.tokens.size() || e.next >= 0);
    if (prefix) return it->second;
  }
  Entry& e = caches_[s.seq];
  e.cache = draft_.new_cache();
  e.consumed.clear();
  e.next = -1;
  return e;
}

// One forward over every sequence's tokens added since its last call: afterwards each cache holds the
// sequence exactly (no draft in it) and `first[i]` is the draft model's guess for what follows.
void DraftModelProposer::catch_up(std::span<const DraftSlot> batch, std::vector<Entry*>& entries,
                                  std::vector<int32_t>& first) {
  std::vector<BatchItem> items;
  std::vector<size_t> owner;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].max_drafts <= 0 || batch[i].tokens.empty()) continue;
    Entry& e = entry_for(batch[i]);
    entries[i] = &e;
    if (e.consumed.size() == batch[i].tokens.size()) {  // nothing new since the last call: its guess stands
      first[i] = e.next;
      continue;
    }
    items.push_back(BatchItem{batch[i].tokens.subspan(e.consumed.size()), e.cache.get(), true});
    owner.push_back(i);
  }
  if (items.empty()) return;
  ForwardOptions opt;
  opt.path = draft_.engine_path();
  std::vector<float> logits;
  draft_.forward_batch(items, logits, opt);
  const int64_t stride = draft_.config().vocab_size;
  for (size_t r = 0; r < items.size(); ++r) {
    Entry& e = *entries[owner[r]];
    e.consumed.insert(e.consumed.end(), items[r].tokens.begin(), items[r].tokens.end());
    tokens_run_ += static_cast<int64_t>(items[r].tokens.size());
    e.next = argmax(logits.data() + static_cast<int64_t>(r) * stride);
    first[owner[r]] = e.next;
  }
}

void DraftModelProposer::propose(std::span<const DraftSlot> batch) {
  std::unordered_set<const void*> live;
  for (const DraftSlot& s : batch) live.insert(s.seq);
  std::erase_if(caches_, [&](const auto& kv) { return !live.count(kv.first); });

  std::vector<Entry*> entries(batch.size(), nullptr);
  std::vector<int32_t> last(batch.size(), -1);
  catch_up(batch, entries, last);
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].drafts->clear();
    if (last[i] >= 0) batch[i].drafts->push_back(last[i]);
  }
  // Further guesses on copies of the caches, one batched forward per position; the copies go away.
  std::vector<std::unique_ptr<SequenceCache>> scratch(batch.size());
  ForwardOptions opt;
  opt.path = draft_.engine_path();
  std::vector<float> logits;
  const int64_t stride = draft_.config().vocab_size;
  for (int64_t j = 1;; ++j) {
    std::vector<BatchItem> items;
    std::vector<size_t> owner;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (last[i] < 0 || batch[i].max_drafts <= j) continue;
      if (!scratch[i]) scratch[i] = entries[i]->cache->clone();
      if (!scratch[i]) continue;  // a cache that cannot be copied drafts one token
      items.push_back(BatchItem{std::span<const int32_t>(&last[i], 1), scratch[i].get(), true});
      owner.push_back(i);
    }
    if (items.empty()) break;
    draft_.forward_batch(items, logits, opt);
    for (size_t r = 0; r < items.size(); ++r) {
      last[owner[r]] = argmax(logits.data() + static_cast<int64_t>(r) * stride);
      batch[owner[r]].drafts->push_back(last[owner[r]]);
    }
  }
}

}  // namespace k3::engine
