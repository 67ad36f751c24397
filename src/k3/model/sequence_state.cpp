#include "k3/model/sequence_state.h"

#include "k3/model/config.h"

namespace k3 {

namespace {
size_t blocks_for(int64_t bytes) { return static_cast<size_t>((bytes + 255) / 256); }
}  // namespace

SequenceState::SequenceState(const ModelConfig& c) : SequenceState(make_cache_spec(c)) {}

SequenceState::SequenceState(const CacheSpec& spec) : spec_(spec), initialised_(true) {
  kda_.assign(blocks_for(spec_.slot_bytes()), Block{});  // zero state
}

KdaStateView SequenceState::kda_state(int64_t i) {
  uint8_t* b = kda_.data()->b + i * spec_.kda_layer_bytes();
  float* conv = reinterpret_cast<float*>(b + spec_.kda_state_bytes());
  const int64_t cf = spec_.kda_conv_floats;
  return {b, conv, conv + cf, conv + 2 * cf};
}

MlaPageTable SequenceState::mla_pages() {
  page_ptrs_.resize(pages_.size());
  for (size_t j = 0; j < pages_.size(); ++j) page_ptrs_[j] = pages_[j].data()->b;
  return MlaPageTable{page_ptrs_, kPageTokens, kPageTokens * spec_.mla_row_bytes(), spec_.mla_row_bytes()};
}

void SequenceState::reserve(int64_t n) {
  if (spec_.mla_layers == 0) return;
  while (static_cast<int64_t>(pages_.size()) * kPageTokens < n_past_ + n)
    pages_.emplace_back(blocks_for(spec_.page_bytes(kPageTokens)));
}

std::unique_ptr<SequenceCache> SequenceState::clone() const { return std::make_unique<SequenceState>(*this); }

int64_t SequenceState::bytes() const {
  int64_t b = static_cast<int64_t>(kda_.size() * sizeof(Block));
  for (auto& p : pages_) b += static_cast<int64_t>(p.size() * sizeof(Block));
  return b;
}

}  // namespace k3
