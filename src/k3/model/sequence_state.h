// What the forward pass needs from memory for one sequence: KDA recurrent + conv state per KDA layer
// (fixed size) and one MLA latent row per token per MLA layer (grows with the sequence).
// `SequenceCache` is the interface; `SequenceState` owns plain vectors (CLI, tests, single-sequence
// generation) and the serving cache manager implements it over its page pool and state slots.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

namespace k3 {

struct ModelConfig;

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
