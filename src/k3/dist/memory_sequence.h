// MemorySequence: a growable SequenceCache whose bytes come from a CacheMemory (SequenceState's layout:
// the KDA state of all layers in one region, MLA rows in pages of kPageTokens tokens x all MLA layers).
// A sharded model hands these out from new_cache(), over its journaled memory, so that every rank holds
// the same cache (mirrored_memory.h).
#pragma once
#include <memory>
#include <vector>

#include "k3/runtime/cache_memory.h"
#include "k3/runtime/sequence_cache.h"

namespace k3::dist {

class MemorySequence final : public SequenceCache {
 public:
  static constexpr int64_t kPageTokens = 256;
  MemorySequence(const CacheSpec& spec, std::shared_ptr<CacheMemory> mem);
  ~MemorySequence() override;
  MemorySequence(const MemorySequence&) = delete;
  MemorySequence& operator=(const MemorySequence&) = delete;

  const CacheSpec& spec() const override { return spec_; }
  int64_t n_past() const override { return n_past_; }
  KdaStateView kda_state(int64_t i) override;
  MlaPageTable mla_pages() override;
  void reserve(int64_t n) override;
  void advance(int64_t n) override { n_past_ += n; }
  std::unique_ptr<SequenceCache> clone() const override;

 private:
  CacheSpec spec_;
  std::shared_ptr<CacheMemory> mem_;
  int64_t n_past_ = 0;
  uint8_t* kda_ = nullptr;
  std::vector<uint8_t*> pages_;
};

// The KDA state view of layer i in a block laid out as SequenceState / MemorySequence / HybridCache's slot.
KdaStateView kda_view_at(uint8_t* slot, const CacheSpec& spec, int64_t i);

}  // namespace k3::dist
