// Per-sequence memory of the forward pass: KDA recurrent + conv state (fixed size) and the MLA
// latent cache (grows with the sequence). The serving cache manager will own these in pages and
// slots later; the forward pass only needs this view.
#pragma once
#include <cstdint>
#include <vector>

namespace k3 {

struct KdaLayerState {
  std::vector<float> S;                       // [Hk][D][D]
  std::vector<float> conv_q, conv_k, conv_v;  // [C][W-1]
};

struct MlaLayerState {
  std::vector<float> cache;  // [n_tokens][kv_lora_rank + qk_rope_dim]: [c_kv (normed) | k_pe]
};

struct SequenceState {
  int64_t n_past = 0;
  std::vector<KdaLayerState> kda;  // indexed by layer; empty for MLA layers
  std::vector<MlaLayerState> mla;  // indexed by layer; empty for KDA layers
};

}  // namespace k3
