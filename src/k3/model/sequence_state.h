// `SequenceState`: the owning, growable SequenceCache (runtime/sequence_cache.h) in host memory, for the
// CLI, tests and single-sequence generation: MLA rows in pages of kPageTokens tokens x all MLA layers
// (the serving cache's layout), KDA state of all layers in one block; dtypes as its CacheSpec says. The
// serving cache manager implements the same interface over its page pool and state slots.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "k3/runtime/sequence_cache.h"

namespace k3 {

struct ModelConfig;

class SequenceState final : public SequenceCache {
 public:
  static constexpr int64_t kPageTokens = 256;
  SequenceState() = default;
  explicit SequenceState(const ModelConfig& c);  // fp32 cache
  explicit SequenceState(const CacheSpec& spec);

  const CacheSpec& spec() const override { return spec_; }
  int64_t n_past() const override { return n_past_; }
  KdaStateView kda_state(int64_t i) override;
  MlaPageTable mla_pages() override;
  void reserve(int64_t n) override;
  void advance(int64_t n) override { n_past_ += n; }
  std::unique_ptr<SequenceCache> clone() const override;

  bool initialised() const { return initialised_; }
  int64_t bytes() const;

 private:
  // 256-byte aligned host bytes (vectors of this type keep the alignment through copies).
  struct alignas(256) Block {
    uint8_t b[256];
  };
  CacheSpec spec_;
  bool initialised_ = false;
  int64_t n_past_ = 0;
  std::vector<Block> kda_;                  // slot_bytes of KDA state
  std::vector<std::vector<Block>> pages_;   // page_bytes(kPageTokens) each
  std::vector<uint8_t*> page_ptrs_;
};

}  // namespace k3
