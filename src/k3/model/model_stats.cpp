#include "k3/model/model_stats.h"

namespace k3 {

ModelStats compute_stats(const ModelConfig& c) {
  ModelStats s;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const int64_t Hk = c.kda_heads, D = c.kda_head_dim, C = Hk * D, W = c.conv_kernel, r = c.kda_gate_rank;
  const int64_t nh = c.mla_heads, dn = c.qk_nope_dim, dr = c.qk_rope_dim, dv = c.v_head_dim, kr = c.kv_lora_rank;
  const int64_t X = c.expert_in_dim(), Im = c.moe_intermediate_size, E = c.num_experts, K = c.top_k;
  const bool attn_res = c.attn_res_block_size > 0;

  s.params_embedding = V * H;
  int64_t total = V * H + (c.tie_word_embeddings ? 0 : V * H) + H + (attn_res ? 2 * H : 0);
  int64_t inactive = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    total += 2 * H + (attn_res ? 4 * H : 0);
    if (c.is_kda[static_cast<size_t>(l)]) {
      total += 3 * C * H + 3 * C * W + r * H + C * r + C + Hk + Hk * H + D + H * C;
      total += c.kda_full_rank_gate ? C * H : r * H + C * r;
    } else {
      total += c.q_lora_rank > 0 ? c.q_lora_rank * H + c.q_lora_rank + nh * (dn + dr) * c.q_lora_rank
                                 : nh * (dn + dr) * H;
      total += (kr + dr) * H + kr + nh * (dn + dv) * kr + H * nh * dv;
      if (c.mla_output_gate) total += nh * dv * H;
    }
    if (c.is_moe_layer(l)) {
      const int64_t routed = E * 3 * X * Im;
      total += E * H + E + routed + 3 * H * Im * c.num_shared_experts;
      if (c.routed_hidden_size > 0) total += 2 * X * H + (c.latent_moe_norm ? X : 0);
      s.params_routed_experts += routed;
      inactive += (E - K) * 3 * X * Im;
    } else {
      total += 3 * H * c.intermediate_size;
    }
  }
  s.params_total = total;
  // The input embedding is a row lookup, not a matmul: excluded from active parameters, which is
  // the convention behind K3's published 104B (2.78T total).
  s.params_active = total - inactive - s.params_embedding;
  s.mla_cache_values_per_token = c.num_mla_layers() * c.mla_cache_dim();
  s.kda_state_bytes_f32 = c.num_kda_layers() * Hk * D * D * 4;
  s.kda_conv_state_values = c.num_kda_layers() * 3 * C * (W - 1);
  return s;
}

}  // namespace k3
