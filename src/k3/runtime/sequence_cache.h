// What the forward pass needs from memory for one sequence: KDA recurrent + conv state per KDA layer
// (fixed size) and one MLA latent row per token per MLA layer (grows with the sequence). The interface
// between runners (model/, backend/cuda/) and whoever owns the memory: `SequenceState` (model/
// sequence_state.h: plain vectors for the CLI, tests, single-sequence generation) or the serving cache
// manager (cache/hybrid_cache.h: its page pool and state slots).
#pragma once
#include <cstdint>
#include <memory>

namespace k3 {

struct KdaStateView {
  float* S = nullptr;                                     // [Hk][D][D]
  float* conv_q = nullptr, *conv_k = nullptr, *conv_v = nullptr;  // [C][W-1] each
};

class SequenceCache {
 public:
  virtual ~SequenceCache() = default;
  // Tokens already in the cache (the position of the next token).
  virtual int64_t n_past() const = 0;
  // State of the `kda_index`-th KDA layer (0-based among KDA layers).
  virtual KdaStateView kda_state(int64_t kda_index) = 0;
  // The latent row [c_kv | k_pe] of token `pos` in the `mla_index`-th MLA layer. The forward calls
  // reserve(n) before writing rows n_past .. n_past+n-1.
  virtual float* mla_row(int64_t mla_index, int64_t pos) = 0;
  // Make room for n more tokens (throws k3::Error if the cache cannot).
  virtual void reserve(int64_t n) = 0;
  // Called after the forward: the n new tokens are now part of the sequence.
  virtual void advance(int64_t n) = 0;
  // MLA rows are stored in pages of this many tokens: the rows of positions j*P .. j*P+P-1 of one
  // layer are contiguous, mla_cache_dim() floats apart, starting at mla_row(m, j*P). Backends that
  // need the whole table (the CUDA attention kernels) gather one pointer per page, not per row.
  virtual int64_t mla_page_tokens() const = 0;
  // An independent copy (same memory kind), or null when the cache cannot be copied on its own.
  virtual std::unique_ptr<SequenceCache> clone() const = 0;
};

}  // namespace k3
