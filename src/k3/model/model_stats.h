// Sizes derived from a ModelConfig alone: parameter counts, cache and state bytes. Used by
// `k3 info` now and by capacity planning later; no checkpoint needed.
#pragma once
#include <cstdint>

#include "k3/model/config.h"

namespace k3 {

struct ModelStats {
  int64_t params_total = 0;
  int64_t params_active = 0;        // per token: all but unselected routed experts and the embedding table
  int64_t params_routed_experts = 0;
  int64_t params_embedding = 0;     // input embedding table (a lookup, not a matmul)
  int64_t mla_cache_values_per_token = 0;  // over all MLA layers (576 per layer on the real models)
  int64_t kda_state_bytes_f32 = 0;         // recurrent state per sequence, fp32
  int64_t kda_conv_state_values = 0;       // conv state values per sequence
};

ModelStats compute_stats(const ModelConfig& c);

}  // namespace k3
