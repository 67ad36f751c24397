// `SequenceState`: the owning, growable SequenceCache (runtime/sequence_cache.h) over plain vectors, for the
// CLI, tests and single-sequence generation; the serving cache manager implements the interface over its
// page pool and state slots.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "k3/runtime/sequence_cache.h"

namespace k3 {

struct ModelConfig;

// Owning, growable per-sequence state (vectors).
class SequenceState final : public SequenceCache {
 public:
  SequenceState() = default;
  explicit SequenceState(const ModelConfig& c);

  int64_t n_past() const override { return n_past_; }
  KdaStateView kda_state(int64_t i) override;
  float* mla_row(int64_t m, int64_t pos) override;
  void reserve(int64_t n) override;
  void advance(int64_t n) override { n_past_ += n; }
  int64_t mla_page_tokens() const override { return int64_t{1} << 40; }  // one contiguous vector per layer
  std::unique_ptr<SequenceCache> clone() const override { return std::make_unique<SequenceState>(*this); }

  bool initialised() const { return row_dim_ > 0; }
  int64_t bytes() const;

 private:
  int64_t n_past_ = 0, row_dim_ = 0, kda_state_size_ = 0, conv_size_ = 0;
  std::vector<std::vector<float>> kda_;  // per KDA layer: S, conv_q, conv_k, conv_v back to back
  std::vector<std::vector<float>> mla_;  // per MLA layer: [tokens][row_dim]
};

}  // namespace k3
