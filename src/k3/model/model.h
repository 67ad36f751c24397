// A loaded Kimi K3 / Kimi-Linear model on the CPU: config + mapped checkpoint + bound weights, and the
// forward graph (model-spec section 3). One forward call appends n tokens to one sequence.
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
enum class AttnPath { Auto, Prefill /*chunked KDA + MHA MLA*/, Decode /*KDA recurrence + absorbed MLA*/ };

struct ForwardOptions {
  AttnPath path = AttnPath::Auto;
  int kda_chunk = 64;
  bool all_logits = false;  // logits for every token ([n][V]) or only the last ([V])
};

class Model {
 public:
  // Reads config.json, maps the safetensors, validates and binds every tensor. Throws k3::Error.
  static std::unique_ptr<Model> load(const std::string& dir);

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  const Checkpoint& checkpoint() const { return *ckpt_; }

  SequenceState new_sequence() const;
  // Runs `tokens` after the sequence's past; resizes `logits` to [n][V] or [V].
  void forward(std::span<const int32_t> tokens, SequenceState& st, std::vector<float>& logits,
               const ForwardOptions& opt = {}) const;

 private:
  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  ModelWeights w_;
};

}  // namespace k3
