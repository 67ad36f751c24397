#include "k3/engine/ngram_proposer.h"

#include <algorithm>

namespace k3::engine {

// For each earlier end position e (most recent first), the length of the common suffix of
// tokens[..e] and tokens[..L) is counted up to max_n; the longest wins, the most recent among equals
// (recent text predicts the next tokens best: the code being edited, the sentence being quoted).
// O(L * max_n) per call, a few microseconds for a few thousand tokens.
void NgramProposer::propose_one(std::span<const int32_t> tokens, int64_t max_drafts, std::vector<int32_t>& out) const {
  out.clear();
  const int64_t L = static_cast<int64_t>(tokens.size());
  if (max_drafts <= 0 || L < min_n_ + 1) return;
  int64_t best_len = 0, best_end = -1;
  for (int64_t e = L - 2; e >= 0; --e) {  // the earlier n-gram ends at e; what followed starts at e + 1
    if (tokens[static_cast<size_t>(e)] != tokens[static_cast<size_t>(L - 1)]) continue;
    int64_t n = 1;
    while (n < max_n_ && e - n >= 0 && tokens[static_cast<size_t>(e - n)] == tokens[static_cast<size_t>(L - 1 - n)]) ++n;
    if (n > best_len) {
      best_len = n;
      best_end = e;
      if (n == max_n_) break;
    }
  }
  if (best_len < min_n_) return;
  const int64_t take = std::min(max_drafts, L - 1 - best_end);
  out.assign(tokens.begin() + best_end + 1, tokens.begin() + best_end + 1 + take);
}

void NgramProposer::propose(std::span<const DraftSlot> batch) {
  for (const DraftSlot& s : batch) propose_one(s.tokens, s.max_drafts, *s.drafts);
}



}  // namespace k3::engine
