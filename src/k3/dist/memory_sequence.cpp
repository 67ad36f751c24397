#include "k3/dist/memory_sequence.h"

namespace k3::dist {

KdaStateView kda_view_at(uint8_t* slot, const CacheSpec& spec, int64_t i) {
  uint8_t* b = slot + i * spec.kda_layer_bytes();
  float* conv = reinterpret_cast<float*>(b + spec.kda_state_bytes());
  const int64_t cf = spec.kda_conv_floats;
  return {b, conv, conv + cf, conv + 2 * cf};
}

MemorySequence::MemorySequence(const CacheSpec& spec, std::shared_ptr<CacheMemory> mem) : spec_(spec), mem_(std::move(mem)) {
  if (spec_.slot_bytes() > 0) {
    kda_ = mem_->allocate(static_cast<size_t>(spec_.slot_bytes()));
    mem_->zero(kda_, static_cast<size_t>(spec_.slot_bytes()));  // a new sequence starts from zero state
  }
}

MemorySequence::~MemorySequence() {
  for (uint8_t* p : pages_) mem_->release(p);
  if (kda_) mem_->release(kda_);
}

KdaStateView MemorySequence::kda_state(int64_t i) { return kda_view_at(kda_, spec_, i); }

MlaPageTable MemorySequence::mla_pages() {
  return MlaPageTable{pages_, kPageTokens, kPageTokens * spec_.mla_row_bytes(), spec_.mla_row_bytes()};
}

void MemorySequence::reserve(int64_t n) {
  if (spec_.mla_layers == 0) return;
  while (static_cast<int64_t>(pages_.size()) * kPageTokens < n_past_ + n)
    pages_.push_back(mem_->allocate(static_cast<size_t>(spec_.page_bytes(kPageTokens))));
}

std::unique_ptr<SequenceCache> MemorySequence::clone() const {
  auto c = std::make_unique<MemorySequence>(spec_, mem_);
  if (kda_) mem_->copy(c->kda_, kda_, static_cast<size_t>(spec_.slot_bytes()));
  c->n_past_ = n_past_;
  for (uint8_t* p : pages_) {
    const size_t bytes = static_cast<size_t>(spec_.page_bytes(kPageTokens));
    c->pages_.push_back(mem_->allocate(bytes));
    mem_->copy(c->pages_.back(), p, bytes);
  }
  return c;
}

}  // namespace k3::dist
