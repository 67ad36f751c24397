// ModelConfig: one struct for the Kimi K3 family, parsed from an HF config.json and validated once.
// Hyper-parameters are required: a missing key fails with the key's name rather than guessing.
// Only fields whose absence the spec defines (model-spec.md section 1, "a missing field takes the
// Kimi-Linear behaviour") have defaults.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "k3/core/weight_format.h"

namespace k3 {

enum class Arch { KimiLinear, KimiK3 };
enum class Activation { SiLU, SiTU };

struct ModelConfig {
  Arch arch = Arch::KimiLinear;
  std::string model_type;    // top-level model_type ("kimi_linear" | "kimi_k3")
  std::string source;        // path of config.json, for messages
  std::string tensor_prefix;  // "model." or "language_model.model."
  std::string lm_head_name;   // "lm_head.weight" or "language_model.lm_head.weight"

  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0, intermediate_size = 0;
  float rms_norm_eps = 0;
  bool tie_word_embeddings = false;
  Activation act = Activation::SiLU;
  float situ_beta = 4.0f, situ_linear_beta = 25.0f;

  // MLA (gated on K3)
  int64_t mla_heads = 0, q_lora_rank = 0 /*0: no q-LoRA*/, kv_lora_rank = 0, qk_nope_dim = 0, qk_rope_dim = 0,
          v_head_dim = 0;
  bool mla_output_gate = false;
  // eps of q_a_layernorm / kv_a_layernorm. model-spec: rms_norm_eps. HF's modeling code builds these two
  // norms with 1e-6 (docs/reference.md, deviation 1); the optional config key `mla_norm_eps` selects it.
  float mla_norm_eps = 0;

  // KDA
  std::vector<bool> is_kda;  // per layer (0-based)
  int64_t kda_heads = 0, kda_head_dim = 0, conv_kernel = 0;
  std::optional<float> gate_lower_bound;  // K3: -5 (bounded sigmoid gate); absent: softplus gate
  bool kda_full_rank_gate = false;        // K3 output gate g_proj; else g_a_proj/g_b_proj
  int64_t kda_gate_rank = 0;              // rank of f_a_proj / g_a_proj (read from tensors: head_dim)

  // Residual stream
  int64_t attn_res_block_size = 0;  // 0: plain pre-norm residual

  // MoE
  int64_t num_experts = 0, top_k = 0, num_shared_experts = 0, moe_intermediate_size = 0;
  int64_t routed_hidden_size = 0;  // K3 LatentMoE width; 0: experts run at hidden_size
  bool latent_moe_norm = false;
  bool moe_renormalize = true;
  float routed_scaling_factor = 1.0f;
  int64_t first_k_dense = 0, moe_layer_freq = 1;

  // Format of the routed experts when the checkpoint quantises them (compressed-tensors
  // mxfp4-pack-quantized: MXFP4); nullopt: dense floats, each tensor in its stored dtype.
  std::optional<WeightFormat> expert_quant_format;

  int64_t bos_token_id = -1, eos_token_id = -1, pad_token_id = -1;
  int64_t max_position_embeddings = 0;  // the context the model was trained for; 0: not stated

  int64_t num_kda_layers() const;
  int64_t num_mla_layers() const;
  bool is_moe_layer(int64_t l) const { return l >= first_k_dense && (l % moe_layer_freq) == 0; }
  int64_t expert_in_dim() const { return routed_hidden_size > 0 ? routed_hidden_size : hidden_size; }
  int64_t mla_qk_dim() const { return qk_nope_dim + qk_rope_dim; }
  int64_t mla_cache_dim() const { return kv_lora_rank + qk_rope_dim; }  // 576 on the real models
  std::string arch_name() const { return arch == Arch::KimiK3 ? "kimi_k3" : "kimi_linear"; }
};

// Reads <dir>/config.json. Throws k3::Error naming the file and the field on any problem.
ModelConfig load_model_config(const std::string& dir);
// Parses config.json text (source is used in messages).
ModelConfig parse_model_config(const std::string& json_text, const std::string& source);

}  // namespace k3
