#include "k3/model/config.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "k3/core/error.h"

namespace k3 {

using nlohmann::json;

namespace {

// Field access with messages that name the file and key.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string scope) : j_(j), source_(std::move(source)), scope_(std::move(scope)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  template <typename T>
  T req(const char* key) const {
    if (!has(key)) throw Error(where(key) + ": required field is missing");
    return get<T>(key);
  }
  template <typename T>
  T opt(const char* key, T dflt) const {
    return has(key) ? get<T>(key) : dflt;
  }
  int64_t req_pos(const char* key) const {
    auto v = req<int64_t>(key);
    if (v <= 0) throw Error(where(key) + ": must be positive, got " + std::to_string(v));
    return v;
  }
  const json& obj(const char* key) const {
    if (!has(key)) throw Error(where(key) + ": required field is missing");
    if (!j_.at(key).is_object()) throw Error(where(key) + ": must be an object");
    return j_.at(key);
  }
  std::string where(const char* key) const { return "'" + source_ + "': " + scope_ + key; }

 private:
  template <typename T>
  T get(const char* key) const {
    try {
      return j_.at(key).get<T>();
    } catch (const json::exception&) {
      throw Error(where(key) + ": has the wrong type (" + std::string(j_.at(key).type_name()) + ")");
    }
  }
  const json& j_;
  std::string source_, scope_;
};

void parse_quantization(const json& q, const std::string& source, ModelConfig& c) {
  Fields f(q, source, "quantization_config.");
  auto method = f.req<std::string>("quant_method");
  if (method != "compressed-tensors")
    throw Error(f.where("quant_method") + ": unsupported '" + method + "' (supported: compressed-tensors)");
  std::string format = f.opt<std::string>("format", "");
  if (format.empty() && q.contains("config_groups") && q["config_groups"].is_object())
    for (auto& [k, g] : q["config_groups"].items())
      if (g.is_object() && g.contains("format") && g["format"].is_string()) format = g["format"].get<std::string>();
  if (format != "mxfp4-pack-quantized")
    throw Error(f.where("format") + ": unsupported '" + format + "' (supported: mxfp4-pack-quantized)");
  c.experts_mxfp4 = true;
}

void parse_text_config(const json& t, const std::string& source, const std::string& scope, ModelConfig& c) {
  Fields f(t, source, scope);
  c.vocab_size = f.req_pos("vocab_size");
  c.hidden_size = f.req_pos("hidden_size");
  c.num_layers = f.req_pos("num_hidden_layers");
  c.mla_heads = f.req_pos("num_attention_heads");
  c.intermediate_size = f.req_pos("intermediate_size");
  c.rms_norm_eps = f.req<float>("rms_norm_eps");
  if (!(c.rms_norm_eps > 0)) throw Error(f.where("rms_norm_eps") + ": must be positive");
  c.tie_word_embeddings = f.opt<bool>("tie_word_embeddings", false);

  auto act = f.req<std::string>("hidden_act");
  if (act == "silu" || act == "swish") {
    c.act = Activation::SiLU;
  } else if (act == "situ") {
    c.act = Activation::SiTU;
    c.situ_beta = f.opt<float>("activation_situ_beta", 4.0f);
    c.situ_linear_beta = f.opt<float>("activation_situ_linear_beta", 25.0f);
  } else {
    throw Error(f.where("hidden_act") + ": unsupported '" + act + "' (supported: silu, situ)");
  }

  c.q_lora_rank = f.opt<int64_t>("q_lora_rank", 0);
  c.kv_lora_rank = f.req_pos("kv_lora_rank");
  c.qk_nope_dim = f.req_pos("qk_nope_head_dim");
  c.qk_rope_dim = f.req<int64_t>("qk_rope_head_dim");
  c.v_head_dim = f.req_pos("v_head_dim");
  if (!f.opt<bool>("mla_use_nope", true))
    throw Error(f.where("mla_use_nope") + ": rotary MLA is not part of this model family (expected true)");
  c.mla_output_gate = f.opt<bool>("mla_use_output_gate", false);
  c.mla_norm_eps = f.opt<float>("mla_norm_eps", c.rms_norm_eps);

  const json& la = f.obj("linear_attn_config");
  Fields lf(la, source, scope + "linear_attn_config.");
  c.kda_heads = lf.req_pos("num_heads");
  c.kda_head_dim = lf.req_pos("head_dim");
  c.kda_gate_rank = c.kda_head_dim;
  c.conv_kernel = lf.req_pos("short_conv_kernel_size");
  if (lf.has("gate_lower_bound")) c.gate_lower_bound = lf.req<float>("gate_lower_bound");
  c.kda_full_rank_gate = lf.opt<bool>("use_full_rank_gate", false);
  auto kda = lf.req<std::vector<int64_t>>("kda_layers");
  auto full = lf.req<std::vector<int64_t>>("full_attn_layers");
  c.is_kda.assign(static_cast<size_t>(c.num_layers), false);
  std::vector<int> seen(static_cast<size_t>(c.num_layers), 0);
  for (auto l : kda) {
    if (l < 1 || l > c.num_layers) throw Error(lf.where("kda_layers") + ": layer " + std::to_string(l) + " out of 1.." + std::to_string(c.num_layers));
    c.is_kda[static_cast<size_t>(l - 1)] = true;
    seen[static_cast<size_t>(l - 1)]++;
  }
  for (auto l : full) {
    if (l < 1 || l > c.num_layers) throw Error(lf.where("full_attn_layers") + ": layer " + std::to_string(l) + " out of 1.." + std::to_string(c.num_layers));
    seen[static_cast<size_t>(l - 1)]++;
  }
  for (int64_t i = 0; i < c.num_layers; ++i)
    if (seen[static_cast<size_t>(i)] != 1)
      throw Error(lf.where("kda_layers") + ": layer " + std::to_string(i + 1) +
                  " must be in exactly one of kda_layers / full_attn_layers");

  c.attn_res_block_size = f.opt<int64_t>("attn_res_block_size", 0);
  if (c.attn_res_block_size < 0) throw Error(f.where("attn_res_block_size") + ": must be >= 0");

  c.num_experts = f.req_pos("num_experts");
  c.top_k = f.req_pos("num_experts_per_token");
  if (c.top_k > c.num_experts) throw Error(f.where("num_experts_per_token") + ": exceeds num_experts");
  c.num_shared_experts = f.opt<int64_t>("num_shared_experts", 0);
  c.moe_intermediate_size = f.req_pos("moe_intermediate_size");
  c.routed_hidden_size = f.opt<int64_t>("routed_expert_hidden_size", 0);
  c.latent_moe_norm = f.opt<bool>("latent_moe_use_norm", false);
  c.moe_renormalize = f.opt<bool>("moe_renormalize", true);
  c.routed_scaling_factor = f.opt<float>("routed_scaling_factor", 1.0f);
  c.first_k_dense = f.opt<int64_t>("first_k_dense_replace", 0);
  c.moe_layer_freq = f.opt<int64_t>("moe_layer_freq", 1);
  if (c.moe_layer_freq < 1) throw Error(f.where("moe_layer_freq") + ": must be >= 1");
  auto router = f.opt<std::string>("moe_router_activation_func", "sigmoid");
  if (router != "sigmoid") throw Error(f.where("moe_router_activation_func") + ": unsupported '" + router + "' (supported: sigmoid)");
  if (f.opt<int64_t>("num_expert_group", 1) != 1 || f.opt<int64_t>("topk_group", 1) != 1)
    throw Error(f.where("num_expert_group") + ": grouped top-k with more than one group is not supported");
  auto topk_method = f.opt<std::string>("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc") throw Error(f.where("topk_method") + ": unsupported '" + topk_method + "'");

  if (t.contains("quantization_config") && !t["quantization_config"].is_null())
    parse_quantization(t["quantization_config"], source, c);

  c.bos_token_id = f.opt<int64_t>("bos_token_id", -1);
  c.eos_token_id = f.opt<int64_t>("eos_token_id", -1);
  c.pad_token_id = f.opt<int64_t>("pad_token_id", -1);
  c.max_position_embeddings = f.opt<int64_t>("max_position_embeddings", 0);
  if (c.max_position_embeddings < 0) throw Error(f.where("max_position_embeddings") + ": must be >= 0");

  // Shape constraints the kernels rely on.
  if (c.experts_mxfp4 && (c.expert_in_dim() % 32 || c.moe_intermediate_size % 32))
    throw Error("'" + source + "': MXFP4 experts need expert input and intermediate sizes divisible by 32");
}

}  // namespace

int64_t ModelConfig::num_kda_layers() const {
  int64_t n = 0;
  for (bool b : is_kda) n += b;
  return n;
}
int64_t ModelConfig::num_mla_layers() const { return num_layers - num_kda_layers(); }

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("'" + source + "': invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error("'" + source + "': config must be a JSON object");
  ModelConfig c;
  c.source = source;
  Fields f(j, source, "");
  c.model_type = f.req<std::string>("model_type");
  if (c.model_type == "kimi_linear") {
    c.arch = Arch::KimiLinear;
    c.tensor_prefix = "model.";
    c.lm_head_name = "lm_head.weight";
    parse_text_config(j, source, "", c);
  } else if (c.model_type == "kimi_k3") {
    c.arch = Arch::KimiK3;
    c.tensor_prefix = "language_model.model.";
    c.lm_head_name = "language_model.lm_head.weight";
    const json& t = f.obj("text_config");
    parse_text_config(t, source, "text_config.", c);
    // Token ids live at the top level on K3.
    c.bos_token_id = f.opt<int64_t>("bos_token_id", c.bos_token_id);
    c.eos_token_id = f.opt<int64_t>("eos_token_id", c.eos_token_id);
    c.pad_token_id = f.opt<int64_t>("pad_token_id", c.pad_token_id);
  } else {
    throw Error("'" + source + "': unknown architecture model_type '" + c.model_type +
                "' (supported: kimi_linear, kimi_k3)");
  }
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::ifstream f(path);
  if (!f) throw Error("cannot read '" + path + "' (is '" + dir + "' an HF checkpoint directory?)");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_model_config(ss.str(), path);
}

}  // namespace k3
