#include "k3/model/config.h"

#include "k3/core/edit_distance.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "k3/core/error.h"
#include "k3/io/json_depth.h"
#include "k3/io/regular_file.h"

namespace k3 {

using nlohmann::json;

namespace {

using k3::edit_distance;

// Keys the parser looked up, per scope ("", "text_config.", ...): what is not among them (or among the
// known-but-ignored keys) is unknown, and the closest looked-up key is the likely intended spelling.
using KeyLog = std::map<std::string, std::set<std::string>>;

// Field access with messages that name the file and key.
class Fields {
 public:
  Fields(const json& j, std::string source, std::string scope, KeyLog& log)
      : j_(j), source_(std::move(source)), scope_(std::move(scope)), log_(log) {}

  bool has(const char* key) const {
    log_[scope_].insert(key);
    return j_.contains(key) && !j_.at(key).is_null();
  }

  template <typename T>
  T req(const char* key) const {
    if (!has(key)) throw Error(where(key) + ": required field is missing" + near_miss(key));
    return get<T>(key);
  }
  template <typename T>
  T opt(const char* key, T dflt) const {
    return has(key) ? get<T>(key) : dflt;
  }
  // A size: positive and at most `max` (bounds every allocation and product derived from the config;
  // the real models are far below: hidden 7168, vocab 163840, 93 layers, 896 experts).
  int64_t req_pos(const char* key, int64_t max = kMaxDim) const {
    auto v = req<int64_t>(key);
    if (v <= 0 || v > max)
      throw Error(where(key) + ": must be in 1.." + std::to_string(max) + ", got " + std::to_string(v));
    return v;
  }
  int64_t opt_range(const char* key, int64_t dflt, int64_t lo, int64_t hi) const {
    auto v = opt<int64_t>(key, dflt);
    if (v < lo || v > hi)
      throw Error(where(key) + ": must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                  std::to_string(v));
    return v;
  }
  // Flags and keys whose absence means "the Kimi-Linear behaviour" (model-spec section 1): required
  // when the architecture is K3, whose behaviour differs, so that a misspelled key cannot silently
  // select the other model.
  template <typename T>
  T arch_req(bool required, const char* key, T dflt) const {
    return required ? req<T>(key) : opt<T>(key, dflt);
  }
  // The key's value when it is an integer in [lo, hi], else nullopt: for hints that may hold a sentinel (HF writes
  // model_max_length = int(1e30) for "no limit", which JSON readers see as a float).
  std::optional<int64_t> int_in(const char* key, int64_t lo, int64_t hi) const {
    if (!has(key) || !j_.at(key).is_number_integer()) return std::nullopt;
    const json& v = j_.at(key);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) return std::nullopt;
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) return std::nullopt;
    return x;
  }
  static constexpr int64_t kMaxDim = 1 << 20;
  const json& obj(const char* key) const {
    if (!has(key)) throw Error(where(key) + ": required field is missing");  // (has() logs the key)
    if (!j_.at(key).is_object()) throw Error(where(key) + ": must be an object");
    return j_.at(key);
  }
  std::string where(const char* key) const { return "'" + source_ + "': " + scope_ + key; }
  // " (found 'latent_moe_use_noro': misspelled?)" when the object holds a key one or two edits away.
  std::string near_miss(const std::string& key) const {
    if (!j_.is_object()) return "";
    for (const auto& [k, v] : j_.items())
      if (k != key && edit_distance(k, key) <= 2) return " (found '" + scope_ + k + "': misspelled?)";
    return "";
  }

 private:
  template <typename T>
  T get(const char* key) const {
    // nlohmann converts 1.5 or 1e9 to an integer silently; a size must be written as an integer.
    if constexpr (std::is_same_v<T, int64_t>)
      if (!j_.at(key).is_number_integer())
        throw Error(where(key) + ": has the wrong type (" + std::string(j_.at(key).type_name()) +
                    "), must be an integer: " + j_.at(key).dump().substr(0, 40));
    if constexpr (std::is_same_v<T, float>)
      if (!j_.at(key).is_number() || !std::isfinite(j_.at(key).get<double>()) ||
          std::abs(j_.at(key).get<double>()) > 3.0e38)
        throw Error(where(key) + ": must be a finite number, got " + j_.at(key).dump().substr(0, 40));
    try {
      return j_.at(key).get<T>();
    } catch (const json::exception&) {
      throw Error(where(key) + ": has the wrong type (" + std::string(j_.at(key).type_name()) + ")");
    }
  }
  const json& j_;
  std::string source_, scope_;
  KeyLog& log_;
};

void parse_quantization(const json& q, const std::string& source, const std::string& scope, ModelConfig& c,
                        KeyLog& log) {
  Fields f(q, source, scope, log);
  auto method = f.req<std::string>("quant_method");
  if (method != "compressed-tensors")
    throw Error(f.where("quant_method") + ": unsupported '" + method + "' (supported: compressed-tensors)");
  std::string format = f.opt<std::string>("format", "");
  if (format.empty() && q.contains("config_groups") && q["config_groups"].is_object())
    for (auto& [k, g] : q["config_groups"].items())
      if (g.is_object() && g.contains("format") && g["format"].is_string()) format = g["format"].get<std::string>();
  if (format != "mxfp4-pack-quantized")
    throw Error(f.where("format") + ": unsupported '" + format + "' (supported: mxfp4-pack-quantized)");
  c.expert_quant_format = WeightFormat::MXFP4;
}

void parse_text_config(const json& t, const std::string& source, const std::string& scope, ModelConfig& c,
                       KeyLog& log) {
  Fields f(t, source, scope, log);
  const bool k3 = c.arch == Arch::KimiK3;
  c.vocab_size = f.req_pos("vocab_size", 1 << 24);
  c.hidden_size = f.req_pos("hidden_size", 1 << 17);
  c.num_layers = f.req_pos("num_hidden_layers", 4096);
  c.mla_heads = f.req_pos("num_attention_heads", 4096);
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

  c.q_lora_rank = f.opt_range("q_lora_rank", 0, 0, Fields::kMaxDim);
  c.kv_lora_rank = f.req_pos("kv_lora_rank");
  c.qk_nope_dim = f.req_pos("qk_nope_head_dim");
  c.qk_rope_dim = f.req<int64_t>("qk_rope_head_dim");
  if (c.qk_rope_dim < 0 || c.qk_rope_dim > 4096) throw Error(f.where("qk_rope_head_dim") + ": must be in 0..4096");
  c.v_head_dim = f.req_pos("v_head_dim");
  if (!f.opt<bool>("mla_use_nope", true))
    throw Error(f.where("mla_use_nope") + ": rotary MLA is not part of this model family (expected true)");
  c.mla_output_gate = f.arch_req<bool>(k3, "mla_use_output_gate", false);
  c.mla_norm_eps = f.opt<float>("mla_norm_eps", c.rms_norm_eps);

  const json& la = f.obj("linear_attn_config");
  Fields lf(la, source, scope + "linear_attn_config.", log);
  c.kda_heads = lf.req_pos("num_heads", 4096);
  c.kda_head_dim = lf.req_pos("head_dim", 4096);
  c.kda_gate_rank = c.kda_head_dim;
  c.conv_kernel = lf.req_pos("short_conv_kernel_size", 64);
  if (k3 || lf.has("gate_lower_bound")) c.gate_lower_bound = lf.req<float>("gate_lower_bound");
  c.kda_full_rank_gate = lf.arch_req<bool>(k3, "use_full_rank_gate", false);
  auto kda = lf.req<std::vector<int64_t>>("kda_layers");
  auto full = lf.req<std::vector<int64_t>>("full_attn_layers");
  // Every layer is in exactly one list, so the lists (bounded by the file's size) must have
  // num_hidden_layers entries in all: checked before allocating anything per layer.
  if (kda.size() + full.size() != static_cast<uint64_t>(c.num_layers))
    throw Error(lf.where("kda_layers") + ": every layer must be in exactly one of kda_layers / full_attn_layers, "
                "but num_hidden_layers is " + std::to_string(c.num_layers) + " and the lists hold " +
                std::to_string(kda.size() + full.size()) + " entries");
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

  c.attn_res_block_size = f.arch_req<int64_t>(k3, "attn_res_block_size", 0);
  if (c.attn_res_block_size < 0 || c.attn_res_block_size > c.num_layers)
    throw Error(f.where("attn_res_block_size") + ": must be in 0..num_hidden_layers");

  c.num_experts = f.req_pos("num_experts", 1 << 16);
  c.top_k = f.req_pos("num_experts_per_token");
  if (c.top_k > c.num_experts) throw Error(f.where("num_experts_per_token") + ": exceeds num_experts");
  // Present in both HF configs with model-specific values (2 / 1, 1.0 / 2.446): no default is right.
  c.num_shared_experts = f.req<int64_t>("num_shared_experts");
  if (c.num_shared_experts < 0 || c.num_shared_experts > 64) throw Error(f.where("num_shared_experts") + ": must be in 0..64");
  c.moe_intermediate_size = f.req_pos("moe_intermediate_size");
  c.routed_hidden_size = f.arch_req<int64_t>(k3, "routed_expert_hidden_size", 0);
  if (c.routed_hidden_size < 0 || c.routed_hidden_size > Fields::kMaxDim)
    throw Error(f.where("routed_expert_hidden_size") + ": must be in 0.." + std::to_string(Fields::kMaxDim));
  c.latent_moe_norm = f.arch_req<bool>(k3, "latent_moe_use_norm", false);
  c.moe_renormalize = f.opt<bool>("moe_renormalize", true);
  c.routed_scaling_factor = f.req<float>("routed_scaling_factor");
  c.first_k_dense = f.opt_range("first_k_dense_replace", 0, 0, c.num_layers);
  c.moe_layer_freq = f.opt_range("moe_layer_freq", 1, 1, c.num_layers);
  auto router = f.opt<std::string>("moe_router_activation_func", "sigmoid");
  if (router != "sigmoid") throw Error(f.where("moe_router_activation_func") + ": unsupported '" + router + "' (supported: sigmoid)");
  if (f.opt<int64_t>("num_expert_group", 1) != 1 || f.opt<int64_t>("topk_group", 1) != 1)
    throw Error(f.where("num_expert_group") + ": grouped top-k with more than one group is not supported");
  auto topk_method = f.opt<std::string>("topk_method", "noaux_tc");
  if (topk_method != "noaux_tc") throw Error(f.where("topk_method") + ": unsupported '" + topk_method + "'");

  if (f.has("quantization_config"))
    parse_quantization(t["quantization_config"], source, scope + "quantization_config.", c, log);

  c.bos_token_id = f.opt<int64_t>("bos_token_id", -1);
  c.eos_token_id = f.opt<int64_t>("eos_token_id", -1);
  c.pad_token_id = f.opt<int64_t>("pad_token_id", -1);
  c.max_position_embeddings = f.opt<int64_t>("max_position_embeddings", 0);
  if (c.max_position_embeddings < 0) throw Error(f.where("max_position_embeddings") + ": must be >= 0");
  // Else model_max_length, the next key llama.cpp's converter looks for (a GGUF without <arch>.context_length does not
  // load in llama.cpp), when it is a plain context size (1 .. 2^32 - 1, the GGUF key's range); anything else (HF's 1e30
  // sentinel, a negative) is no statement.
  if (!f.has("max_position_embeddings"))
    c.max_position_embeddings = f.int_in("model_max_length", 1, int64_t{0xffffffff}).value_or(0);

  // Shape constraints the kernels rely on.
  if (c.expert_quant_format) {
    const WeightLayout l = weight_layout(*c.expert_quant_format);
    if (c.expert_in_dim() % l.block_elems || c.moe_intermediate_size % l.block_elems)
      throw Error("'" + source + "': " + l.name + " experts need expert input and intermediate sizes divisible by " +
                  std::to_string(l.block_elems));
  }
}

// Keys of HF configs that the engine knowingly does not use (not warned about).
const std::set<std::string>& ignored_keys() {
  static const std::set<std::string> k = {
      "architectures", "auto_map", "transformers_version", "torch_dtype", "dtype", "use_cache", "vision_config",
      "max_position_embeddings", "model_max_length", "use_grouped_topk", "num_nextn_predict_layers", "initializer_range",
      "rope_theta", "rope_scaling", "attention_dropout", "attention_bias", "num_key_value_heads", "head_dim",
      "media_placeholder_token_id", "ignore_index", "pretraining_tp", "tie_word_embeddings",
      // quantization_config (compressed-tensors)
      "config_groups", "ignore", "quantization_status", "kv_cache_scheme", "global_compression_ratio",
      "sparsity_config", "transform_config", "version"};
  return k;
}

// One stderr line per key of `obj` that is neither looked up by the parser nor known to be
// ignored, naming the closest key the parser knows in that scope: a misspelled optional key would
// otherwise load silently with its default and produce garbage text.
void warn_unknown_keys(const json& obj, const std::string& scope, const std::string& source, const KeyLog& log) {
  if (!obj.is_object()) return;
  const auto it = log.find(scope);
  const std::set<std::string> none;
  const std::set<std::string>& known = it == log.end() ? none : it->second;
  for (const auto& [key, value] : obj.items()) {
    if (known.count(key) || ignored_keys().count(key)) continue;
    std::string best;
    size_t best_d = SIZE_MAX;
    for (const auto& k : known)
      if (const size_t d = edit_distance(key, k); d < best_d) best_d = d, best = k;
    std::cerr << "k3: warning: '" << source << "': unknown config key '" << scope << key << "'";
    if (!best.empty() && best_d <= std::max<size_t>(2, key.size() / 3)) std::cerr << " (did you mean '" << scope << best << "'?)";
    std::cerr << ", ignored\n";
  }
}

void check_token_ids(const ModelConfig& c) {
  for (const auto& [name, id] : {std::pair{"bos_token_id", c.bos_token_id}, std::pair{"eos_token_id", c.eos_token_id},
                                 std::pair{"pad_token_id", c.pad_token_id}})
    if (id != -1 && (id < 0 || id >= c.vocab_size))
      throw Error("'" + c.source + "': " + name + " " + std::to_string(id) + " is outside the vocabulary 0.." +
                  std::to_string(c.vocab_size - 1));
}

}  // namespace

int64_t ModelConfig::num_kda_layers() const {
  int64_t n = 0;
  for (bool b : is_kda) n += b;
  return n;
}
int64_t ModelConfig::num_mla_layers() const { return num_layers - num_kda_layers(); }

ModelConfig parse_model_config(const std::string& text, const std::string& source) {
  check_json_depth(text, "'" + source + "'");
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error("'" + source + "': invalid JSON: " + e.what());
  }
  if (!j.is_object()) throw Error("'" + source + "': config must be a JSON object");
  ModelConfig c;
  c.source = source;
  KeyLog log;
  Fields f(j, source, "", log);
  c.model_type = f.req<std::string>("model_type");
  const json* text_json = &j;
  std::string text_scope;
  if (c.model_type == "kimi_linear") {
    c.arch = Arch::KimiLinear;
    c.tensor_prefix = "model.";
    c.lm_head_name = "lm_head.weight";
    parse_text_config(j, source, "", c, log);
  } else if (c.model_type == "kimi_k3") {
    c.arch = Arch::KimiK3;
    c.tensor_prefix = "language_model.model.";
    c.lm_head_name = "language_model.lm_head.weight";
    const json& t = f.obj("text_config");
    text_json = &t;
    text_scope = "text_config.";
    Fields(t, source, text_scope, log).has("model_type");  // text_config.model_type: informative only
    parse_text_config(t, source, text_scope, c, log);
    // Token ids live at the top level on K3.
    c.bos_token_id = f.opt<int64_t>("bos_token_id", c.bos_token_id);
    c.eos_token_id = f.opt<int64_t>("eos_token_id", c.eos_token_id);
    c.pad_token_id = f.opt<int64_t>("pad_token_id", c.pad_token_id);
  } else {
    throw Error("'" + source + "': unknown architecture model_type '" + c.model_type +
                "' (supported: kimi_linear, kimi_k3)");
  }
  check_token_ids(c);
  warn_unknown_keys(j, "", source, log);
  if (text_json != &j) warn_unknown_keys(*text_json, text_scope, source, log);
  if (text_json->contains("linear_attn_config"))
    warn_unknown_keys((*text_json)["linear_attn_config"], text_scope + "linear_attn_config.", source, log);
  if (text_json->contains("quantization_config"))
    warn_unknown_keys((*text_json)["quantization_config"], text_scope + "quantization_config.", source, log);
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec)))
    throw Error("cannot read '" + path + "' (is '" + dir + "' an HF checkpoint directory?)");
  return parse_model_config(read_regular_file(path, 16u << 20, "model config"), path);
}

}  // namespace k3
