// The block drafter's config.json (docs/block-drafter.md, "Files"): its shapes, the target layers it reads
// and the target it was trained for. Parsed and validated once; every hyper-parameter is required.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "k3/model/config.h"

namespace k3::drafter {

struct DrafterConfig {
  std::string source;  // path of config.json, for messages
  int64_t hidden_size = 0, num_layers = 0, num_heads = 0, head_dim = 0, intermediate_size = 0, block_size = 0;
  std::vector<int32_t> target_layer_ids;  // tap ids (ForwardOptions::tap_layers), in ctx order
  float rms_norm_eps = 0;
  int64_t target_hidden_size = 0, target_vocab_size = 0, target_num_layers = 0;

  int64_t num_taps() const { return static_cast<int64_t>(target_layer_ids.size()); }
  int64_t ctx_dim() const { return num_taps() * hidden_size; }  // T * H floats per draft
  int64_t attn_dim() const { return num_heads * head_dim; }
};

// Parses config.json text (source names it in messages). Throws k3::Error naming the file and the field:
// a missing or mistyped field, a value out of range, an architecture other than K3BlockDrafter,
// hidden_size != target_hidden_size, a tap id outside [0, target_num_layers].
DrafterConfig parse_drafter_config(const std::string& json_text, const std::string& source);
// Reads <dir>/config.json.
DrafterConfig load_drafter_config(const std::string& dir);
// Throws k3::Error unless the drafter was made for this target (hidden size, vocabulary, layer count).
void check_drafter_target(const DrafterConfig& d, const ModelConfig& target);

}  // namespace k3::drafter
