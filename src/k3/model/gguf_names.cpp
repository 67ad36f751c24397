#include "k3/model/gguf_names.h"

#include <cstdlib>
#include <vector>

namespace k3 {

namespace {

using K = GgufTensorKind;
enum class LayerKind { Any, Kda, Mla };

struct Row {
  const char* gguf;  // after "blk.N." (per layer) or the whole name (global)
  const char* hf;    // after "<prefix>layers.N." (per layer) or after "<prefix>" (global)
  K kind = K::Rename;
  const char* hf_extra = "";
  LayerKind layer = LayerKind::Any;
};

// llama.cpp's names (gguf-py constants.py, MODEL_TENSOR -> TENSOR_NAMES for kimi-k3 / kimi-linear).
const std::vector<Row>& layer_rows() {
  static const std::vector<Row> rows = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_res_score.weight", "self_attention_res_norm.weight", K::ResScore, "self_attention_res_proj.weight"},
      {"ffn_res_score.weight", "mlp_res_norm.weight", K::ResScore, "mlp_res_proj.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ssm_conv1d_q.weight", "self_attn.q_conv1d.weight", K::ConvTaps},
      {"ssm_conv1d_k.weight", "self_attn.k_conv1d.weight", K::ConvTaps},
      {"ssm_conv1d_v.weight", "self_attn.v_conv1d.weight", K::ConvTaps},
      {"ssm_f_a.weight", "self_attn.f_a_proj.weight"},
      {"ssm_f_b.weight", "self_attn.f_b_proj.weight"},
      {"ssm_beta.weight", "self_attn.b_proj.weight"},
      {"ssm_dt.bias", "self_attn.dt_bias"},
      {"ssm_a", "self_attn.A_log", K::NegExpALog},
      {"ssm_g.weight", "self_attn.g_proj.weight", K::Rename, "", LayerKind::Kda},
      {"ssm_g_a.weight", "self_attn.g_a_proj.weight"},
      {"ssm_g_b.weight", "self_attn.g_b_proj.weight"},
      {"ssm_norm.weight", "self_attn.o_norm.weight"},
      {"attn_q_a.weight", "self_attn.q_a_proj.weight"},
      {"attn_q_a_norm.weight", "self_attn.q_a_layernorm.weight"},
      {"attn_q_b.weight", "self_attn.q_b_proj.weight"},
      {"attn_kv_a_mqa.weight", "self_attn.kv_a_proj_with_mqa.weight"},
      {"attn_kv_a_norm.weight", "self_attn.kv_a_layernorm.weight"},
      {"attn_k_b.weight", "self_attn.kv_b_proj.weight", K::KvbK},
      {"attn_v_b.weight", "self_attn.kv_b_proj.weight", K::KvbV},
      {"attn_gate.weight", "self_attn.g_proj.weight", K::Rename, "", LayerKind::Mla},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
      {"ffn_gate_inp.weight", "block_sparse_moe.gate.weight"},
      {"exp_probs_b.bias", "block_sparse_moe.gate.e_score_correction_bias"},
      {"ffn_gate_exps.weight", "block_sparse_moe.experts.{e}.w1.weight", K::Experts},
      {"ffn_up_exps.weight", "block_sparse_moe.experts.{e}.w3.weight", K::Experts},
      {"ffn_down_exps.weight", "block_sparse_moe.experts.{e}.w2.weight", K::Experts},
      {"ffn_gate_shexp.weight", "block_sparse_moe.shared_experts.gate_proj.weight"},
      {"ffn_up_shexp.weight", "block_sparse_moe.shared_experts.up_proj.weight"},
      {"ffn_down_shexp.weight", "block_sparse_moe.shared_experts.down_proj.weight"},
      {"ffn_routed_down.weight", "block_sparse_moe.routed_expert_down_proj.weight"},
      {"ffn_routed_up.weight", "block_sparse_moe.routed_expert_up_proj.weight"},
      {"ffn_routed_norm.weight", "block_sparse_moe.routed_expert_norm.weight"},
  };
  return rows;
}

const std::vector<Row>& global_rows() {
  static const std::vector<Row> rows = {
      {"token_embd.weight", "embed_tokens.weight"},
      {"output_norm.weight", "norm.weight"},
      {"output_res_score.weight", "output_attn_res_norm.weight", K::ResScore, "output_attn_res_proj.weight"},
  };
  return rows;
}

bool layer_matches(const ModelConfig& c, int64_t l, LayerKind k) {
  if (k == LayerKind::Any) return true;
  return c.is_kda[static_cast<size_t>(l)] == (k == LayerKind::Kda);
}

// "12.rest" -> (12, "rest"); -1 when `s` does not start with a layer number below num_layers.
int64_t split_layer(const std::string& s, int64_t num_layers, std::string& rest) {
  size_t i = 0;
  while (i < s.size() && i < 7 && s[i] >= '0' && s[i] <= '9') ++i;
  if (i == 0 || i >= s.size() || s[i] != '.' || (i > 1 && s[0] == '0')) return -1;
  const int64_t l = std::strtoll(s.substr(0, i).c_str(), nullptr, 10);
  if (l >= num_layers) return -1;
  rest = s.substr(i + 1);
  return l;
}

// "block_sparse_moe.experts.7.w1.weight" matches "block_sparse_moe.experts.{e}.w1.weight".
bool expert_pattern_matches(const std::string& pattern, const std::string& name) {
  const size_t at = pattern.find("{e}");
  if (at == std::string::npos || name.compare(0, at, pattern, 0, at) != 0) return false;
  size_t i = at;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') ++i;
  return i > at && name.substr(i) == pattern.substr(at + 3);
}

}  // namespace

std::string gguf_arch_name(Arch a) { return a == Arch::KimiK3 ? "kimi-k3" : "kimi-linear"; }

std::optional<GgufTensorName> gguf_to_hf(const ModelConfig& c, const std::string& name) {
  const std::string& P = c.tensor_prefix;
  if (name == "output.weight") return GgufTensorName{K::Rename, c.lm_head_name, ""};
  for (const Row& r : global_rows())
    if (name == r.gguf) return GgufTensorName{r.kind, P + r.hf, *r.hf_extra ? P + r.hf_extra : ""};
  if (name.rfind("blk.", 0) != 0) return std::nullopt;
  std::string rest;
  const int64_t l = split_layer(name.substr(4), c.num_layers, rest);
  if (l < 0) return std::nullopt;
  const std::string lp = P + "layers." + std::to_string(l) + ".";
  for (const Row& r : layer_rows())
    if (rest == r.gguf && layer_matches(c, l, r.layer))
      return GgufTensorName{r.kind, lp + r.hf, *r.hf_extra ? lp + r.hf_extra : ""};
  return std::nullopt;
}

std::optional<std::string> hf_to_gguf(const ModelConfig& c, const std::string& name) {
  if (name == c.lm_head_name) return std::string("output.weight");
  const std::string& P = c.tensor_prefix;
  if (name.compare(0, P.size(), P) != 0) return std::nullopt;
  const std::string tail = name.substr(P.size());
  for (const Row& r : global_rows())
    if (tail == r.hf || (*r.hf_extra && tail == r.hf_extra)) return std::string(r.gguf);
  if (tail.rfind("layers.", 0) != 0) return std::nullopt;
  std::string rest;
  const int64_t l = split_layer(tail.substr(7), c.num_layers, rest);
  if (l < 0) return std::nullopt;
  for (const Row& r : layer_rows()) {
    if (!layer_matches(c, l, r.layer)) continue;
    const bool hit = r.kind == K::Experts ? expert_pattern_matches(r.hf, rest) : (rest == r.hf || (*r.hf_extra && rest == r.hf_extra));
    if (hit) return "blk." + std::to_string(l) + "." + r.gguf;
  }
  return std::nullopt;
}

}  // namespace k3
