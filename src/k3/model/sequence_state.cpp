#include "k3/model/sequence_state.h"

#include "k3/model/config.h"

namespace k3 {

SequenceState::SequenceState(const ModelConfig& c) {
  const int64_t C = c.kda_heads * c.kda_head_dim;
  kda_state_size_ = c.kda_heads * c.kda_head_dim * c.kda_head_dim;
  conv_size_ = C * (c.conv_kernel - 1);
  row_dim_ = c.mla_cache_dim();
  kda_.assign(static_cast<size_t>(c.num_kda_layers()), std::vector<float>(static_cast<size_t>(kda_state_size_ + 3 * conv_size_), 0.f));
  mla_.resize(static_cast<size_t>(c.num_mla_layers()));
}

KdaStateView SequenceState::kda_state(int64_t i) {
  float* b = kda_[static_cast<size_t>(i)].data();
  return {b, b + kda_state_size_, b + kda_state_size_ + conv_size_, b + kda_state_size_ + 2 * conv_size_};
}

float* SequenceState::mla_row(int64_t m, int64_t pos) { return mla_[static_cast<size_t>(m)].data() + pos * row_dim_; }

void SequenceState::reserve(int64_t n) {
  for (auto& v : mla_) v.resize(static_cast<size_t>((n_past_ + n) * row_dim_));
}

int64_t SequenceState::bytes() const {
  int64_t b = 0;
  for (auto& v : kda_) b += static_cast<int64_t>(v.size() * sizeof(float));
  for (auto& v : mla_) b += static_cast<int64_t>(v.size() * sizeof(float));
  return b;
}

}  // namespace k3
