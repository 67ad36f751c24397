// What the forward pass needs from memory for one sequence: KDA recurrent + conv state per KDA layer
// (fixed size) and one MLA latent row per token per MLA layer (grows with the sequence), laid out as the
// sequence's CacheSpec says (runtime/cache_spec.h: dtypes and bytes). The interface between runners
// (model/, backend/cuda/) and whoever owns the memory: `SequenceState` (model/sequence_state.h: host pages
// for the CLI, tests, single-sequence generation), `cuda::DeviceSequence`, or the serving cache manager
// (cache/hybrid_cache.h: its page pool and state slots).
#pragma once
#include <cstdint>
#include <memory>
#include <span>

#include "k3/runtime/cache_spec.h"

namespace k3 {

struct KdaStateView {
  void* S = nullptr;                                              // [Hk][D][D] in the spec's kda_state_dtype
  float* conv_q = nullptr, *conv_k = nullptr, *conv_v = nullptr;  // [C][W-1] each, fp32
};

// Where one sequence's MLA rows are: pages of page_tokens tokens x all MLA layers, layer-major. Row
// (layer m, position pos) starts at pages[pos / page_tokens] + m * layer_stride + (pos % page_tokens) *
// row_bytes. A backend that needs the whole table (the CUDA kernels) gathers one pointer per page.
struct MlaPageTable {
  std::span<uint8_t* const> pages;
  int64_t page_tokens = 0, layer_stride = 0, row_bytes = 0;
  uint8_t* row(int64_t m, int64_t pos) const {
    return pages[static_cast<size_t>(pos / page_tokens)] + m * layer_stride + (pos % page_tokens) * row_bytes;
  }
};

class SequenceCache {
 public:
  virtual ~SequenceCache() = default;
  // Layout and dtypes of this cache.
  virtual const CacheSpec& spec() const = 0;
  // Tokens already in the cache (the position of the next token).
  virtual int64_t n_past() const = 0;
  // State of the `kda_index`-th KDA layer (0-based among KDA layers).
  virtual KdaStateView kda_state(int64_t kda_index) = 0;
  // The MLA page table (pages for at least n_past + the last reserve(n) tokens); valid until the next
  // reserve(). The forward calls reserve(n) before writing rows n_past .. n_past+n-1.
  virtual MlaPageTable mla_pages() = 0;
  // Make room for n more tokens (throws k3::Error if the cache cannot).
  virtual void reserve(int64_t n) = 0;
  // Called after the forward: the n new tokens are now part of the sequence.
  virtual void advance(int64_t n) = 0;
  // Where the forward saves the KDA state mid-step for speculative decoding (BatchItem::snapshot_after):
  // the j-th extra state of the same layout, or {} when this cache keeps no j-th one.
  virtual KdaStateView kda_snapshot(int64_t kda_index, int64_t j) {
    (void)kda_index;
    (void)j;
    return {};
  }
  // An independent copy (same memory kind), or null when the cache cannot be copied on its own.
  virtual std::unique_ptr<SequenceCache> clone() const = 0;
};

}  // namespace k3
