// A loaded Kimi K3 / Kimi-Linear model on the CPU: config + mapped checkpoint + bound weights, and the
// forward graph (model-spec section 3). One call runs a batch of sequences, each appending its tokens.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/sequence_state.h"
#include "k3/model/weights.h"

namespace k3 {

// Which form the attention layers use. Auto: prefill form for n > 1 tokens, decode form for n == 1.
// Decode forms everywhere make every token's result independent of batching and of how a prompt is
// split into chunks (the serving engine relies on it: batch-invariant, prefix-cache-invariant).
enum class AttnPath { Auto, Prefill /*chunked KDA + MHA MLA*/, Decode /*KDA recurrence + absorbed MLA*/ };

struct ForwardOptions {
  AttnPath path = AttnPath::Auto;
  int kda_chunk = 64;
  bool all_logits = false;  // logits for every token ([n][V]) or only the last ([V])
};

// One sequence's part of a batched forward.
struct BatchItem {
  std::span<const int32_t> tokens;
  SequenceCache* cache = nullptr;
  bool want_logits = true;  // last-token logits (or all tokens' with ForwardOptions::all_logits)
};

class Model {
 public:
  // Reads config.json, maps the safetensors, validates and binds every tensor. Throws k3::Error.
  static std::unique_ptr<Model> load(const std::string& dir);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  SequenceState new_sequence() const { return SequenceState(cfg_); }

  // Runs `tokens` after the sequence's past; resizes `logits` to [n][V] or [V].
  void forward(std::span<const int32_t> tokens, SequenceCache& st, std::vector<float>& logits,
               const ForwardOptions& opt = {}) const;
  // One forward over several sequences. `logits` receives, for each item with want_logits in order,
  // its last-token row [V] (or all its rows with all_logits).
  void forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                     const ForwardOptions& opt = {}) const;

 private:
  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  ModelWeights w_;
};

}  // namespace k3
