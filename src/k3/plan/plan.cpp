#include "k3/plan/plan.h"

#include "k3/plan/collectives.h"

#include "k3/runtime/cache_spec.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <functional>

#include "k3/core/error.h"
#include "k3/model/model_stats.h"
#include "k3/plan/embedded_data.h"
#include "k3/plan/text_format.h"

namespace k3::plan {

using nlohmann::json;

// ---------------------------------------------------------------- hardware and presets

namespace {

std::optional<double> opt_number(const json& e, const char* key, const std::string& where) {
  if (!e.contains(key) || e[key].is_null()) return std::nullopt;
  if (!e[key].is_number()) throw Error(where + ": field '" + key + "' must be a number or null");
  return e[key].get<double>();
}

double req_number(const json& e, const char* key, const std::string& where) {
  auto v = opt_number(e, key, where);
  if (!v || !(*v > 0)) throw Error(where + ": field '" + key + "' is required and must be a positive number");
  return *v;
}

}  // namespace

std::vector<Hardware> parse_hardware(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error(source + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("devices") || !j["devices"].is_object())
    throw Error(source + ": expected an object with a 'devices' object");
  std::vector<Hardware> out;
  for (auto& [key, e] : j["devices"].items()) {
    const std::string where = source + ": device '" + key + "'";
    Hardware h;
    h.key = key;
    h.name = e.value("name", key);
    if (!e.contains("source") || !e["source"].is_string() || e["source"].get<std::string>().empty())
      throw Error(where + ": field 'source' (where the numbers come from) is required");
    h.source = e["source"].get<std::string>();
    h.memory_gb = req_number(e, "memory_gb", where);
    h.hbm_tb_s = req_number(e, "hbm_tb_s", where);
    h.bf16_tflops = req_number(e, "bf16_tflops", where);
    h.fp8_tflops = opt_number(e, "fp8_tflops", where);
    h.fp4_tflops = opt_number(e, "fp4_tflops", where);
    h.nvlink_gb_s = opt_number(e, "nvlink_gb_s", where);
    h.pcie_gb_s = opt_number(e, "pcie_gb_s", where);
    h.price_usd_per_hour = opt_number(e, "price_usd_per_hour", where);
    out.push_back(std::move(h));
  }
  return out;
}

const std::vector<Hardware>& builtin_hardware() {
  static const std::vector<Hardware> table = parse_hardware(std::string(embedded_hardware_json()), "resources/hardware.json");
  return table;
}

Hardware find_hardware(const std::vector<Hardware>& table, const std::string& key) {
  std::string known;
  for (auto& h : table) {
    if (h.key == key) return h;
    known += (known.empty() ? "" : ", ") + h.key;
  }
  throw Error("unknown --gpu '" + key + "' (known: " + known + ")");
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (auto& p : embedded_presets()) names.emplace_back(p.name);
  return names;
}

ModelConfig load_preset(const std::string& name) {
  std::string stem = name;
  if (name == "kimi-linear-48b" || name == "kimi-linear") stem = "kimi-linear-48b-a3b";
  if (name == "k3") stem = "kimi-k3";
  for (auto& p : embedded_presets())
    if (p.name == stem) return parse_model_config(std::string(p.config_json), "preset " + stem + " (resources/presets/" + stem + ".json)");
  std::string known;
  for (auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown --preset '" + name + "' (known: " + known + ", kimi-linear-48b)");
}

// ---------------------------------------------------------------- model sizes

namespace {
constexpr int64_t kKdaChunk = 64;  // chunk length of the chunked KDA prefill
}  // namespace

int64_t num_moe_layers(const ModelConfig& c) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) n += c.is_moe_layer(l) ? 1 : 0;
  return n;
}

double expert_bytes_per_param(const ModelConfig& c) {
  return c.expert_quant_format ? bits_per_weight(*c.expert_quant_format) / 8 : 2.0;
}

// Attention FLOPs for one token at position t (causal, so it attends to t cached positions).
// MLA decode uses the absorbed form (scores and output in the 512-dim latent); prefill the
// materialised form (192-dim q.k, 128-dim v). KDA: ~3 D x D products per head per token for the
// recurrence, plus (prefill) the intra-chunk terms, ~3 C x D per head.
double attention_flops(const ModelConfig& c, double t, bool prefill) {
  const double nh = (double)c.mla_heads, kr = (double)c.kv_lora_rank, dr = (double)c.qk_rope_dim;
  const double qk = (double)c.mla_qk_dim(), dv = (double)c.v_head_dim;
  const double mla = prefill ? 2.0 * nh * t * (qk + dv) : 2.0 * nh * t * (2 * kr + dr);
  const double D = (double)c.kda_head_dim, Hk = (double)c.kda_heads;
  const double kda = 2.0 * Hk * (3 * D * D + (prefill ? 3.0 * kKdaChunk * D : 0.0));
  return (double)c.num_mla_layers() * mla + (double)c.num_kda_layers() * kda;
}

double distinct_experts(const ModelConfig& c, double tokens) {
  return c.num_experts > 0 ? expected_distinct_experts((double)c.num_experts, (double)c.top_k, tokens) : 0;
}

double workspace_bytes(const ModelConfig& c, int64_t chunk, int tp) {
  // The residual stream and its block summaries (attention residuals), plus the widest per-token
  // intermediate on this GPU, in BF16.
  const double H = (double)c.hidden_size, C = (double)c.kda_heads * (double)c.kda_head_dim;
  const double Im = (double)c.moe_intermediate_size, K = (double)c.top_k;
  const double sources = c.attn_res_block_size > 0 ? std::ceil((double)c.num_layers / (double)c.attn_res_block_size) + 1 : 0;
  const double widest = std::max({2.0 * (double)c.intermediate_size, 4.0 * C, K * 2.0 * Im,
                                  (double)c.mla_heads * (double)(c.mla_qk_dim() + c.v_head_dim)}) / tp;
  return (double)chunk * 2.0 * (H * (sources + 4) + widest);
}

WeightBreakdown weight_bytes(const ModelConfig& c) {
  const auto s = compute_stats(c);
  const double VH = (double)c.vocab_size * (double)c.hidden_size;
  WeightBreakdown w;
  w.embedding = VH * 2;
  w.lm_head = c.tie_word_embeddings ? 0 : VH * 2;
  w.routed_experts = (double)s.params_routed_experts * expert_bytes_per_param(c);
  // F32 as stored: KDA q/k/v conv1d, dt_bias, A_log; router e_score_correction_bias.
  const double C = (double)c.kda_heads * (double)c.kda_head_dim;
  const double f32_params = (double)c.num_kda_layers() * (3 * C * (double)c.conv_kernel + C + (double)c.kda_heads) +
                            (double)num_moe_layers(c) * (double)c.num_experts;
  w.other_f32 = f32_params * 4;
  const double other_params = (double)s.params_total - (double)s.params_routed_experts - VH -
                              (c.tie_word_embeddings ? 0 : VH) - f32_params;
  w.other_bf16 = other_params * 2;
  return w;
}

double usd_per_million_tokens(double price_per_gpu_hour, int gpus, double tokens_per_s) {
  if (!(tokens_per_s > 0)) throw Error("throughput must be positive to compute a cost");
  return price_per_gpu_hour * gpus / (tokens_per_s * 3600.0) * 1e6;
}

namespace {
json parse_measured(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    throw Error(source + ": not valid JSON: " + e.what());
  }
}

// The first number under one of `keys` (in that order) at any depth; it must be positive.
std::optional<double> find_positive(const json& j, std::initializer_list<const char*> keys, const std::string& source) {
  for (const char* key : keys) {
    std::optional<double> found;
    std::function<void(const json&)> walk = [&](const json& n) {
      if (found) return;
      if (n.is_object()) {
        if (n.contains(key) && n[key].is_number()) {
          found = n[key].get<double>();
          return;
        }
        for (auto& [k, v] : n.items()) walk(v);
      } else if (n.is_array()) {
        for (auto& v : n) walk(v);
      }
    };
    walk(j);
    if (found) {
      if (!(*found > 0) || !std::isfinite(*found)) throw Error(source + ": '" + key + "' must be a positive number");
      return found;
    }
  }
  return std::nullopt;
}

std::optional<double> find_throughput(const json& j, const std::string& source) {
  return find_positive(j, {"output_tokens_per_s", "output_tok_s", "output_throughput", "decode_tokens_per_s", "tokens_per_s"},
                       source);
}
}  // namespace

double read_measured_throughput(const std::string& text, const std::string& source) {
  if (const auto t = find_throughput(parse_measured(text, source), source)) return *t;
  throw Error(source + ": no throughput found (expected a number under output_tokens_per_s, output_tok_s, "
              "output_throughput, decode_tokens_per_s or tokens_per_s)");
}

Measured read_measured(const std::string& text, const std::string& source) {
  const json j = parse_measured(text, source);
  Measured m;
  m.tokens_per_s = find_throughput(j, source);
  m.allreduce_latency_us = find_positive(j, {"allreduce_latency_us"}, source);
  m.allreduce_busbw_gb_s = find_positive(j, {"allreduce_busbw_gb_s"}, source);
  // Plausible ranges (a unit slip, e.g. seconds for microseconds or B/s for GB/s, is an error, not a plan).
  if (m.allreduce_latency_us && (*m.allreduce_latency_us < 0.1 || *m.allreduce_latency_us > 1e5))
    throw Error(source + ": allreduce_latency_us " + std::to_string(*m.allreduce_latency_us) + " is outside 0.1 .. 100000");
  if (m.allreduce_busbw_gb_s && (*m.allreduce_busbw_gb_s < 0.01 || *m.allreduce_busbw_gb_s > 1e5))
    throw Error(source + ": allreduce_busbw_gb_s " + std::to_string(*m.allreduce_busbw_gb_s) + " is outside 0.01 .. 100000");
  if (!m.tokens_per_s && !m.allreduce_latency_us && !m.allreduce_busbw_gb_s)
    throw Error(source + ": nothing measured found (expected a throughput under output_tokens_per_s, output_tok_s, "
                "output_throughput, decode_tokens_per_s or tokens_per_s, or allreduce_latency_us / allreduce_busbw_gb_s)");
  return m;
}

double expected_distinct_experts(double E, double K, double tokens) {
  if (E <= 0 || K <= 0 || tokens <= 0) return 0;
  if (tokens == 1) return K;
  return E * (1 - std::pow(1 - K / E, tokens));
}

DecodeStepBytes decode_step_bytes(const ModelConfig& c, const CacheSpec& spec, int64_t batch, double context,
                                  double distinct_experts, const LoadedWeightBytes* loaded) {
  const WeightBreakdown w = weight_bytes(c);
  const double B = (double)batch;
  DecodeStepBytes d;
  d.non_routed = loaded ? loaded->non_routed : w.non_expert() - w.embedding;
  if (c.num_experts > 0 && c.top_k > 0) {
    d.distinct_experts =
        distinct_experts >= 0 ? distinct_experts : expected_distinct_experts((double)c.num_experts, (double)c.top_k, B);
    const double per_expert_layer = 3 * (double)c.expert_in_dim() * (double)c.moe_intermediate_size * expert_bytes_per_param(c);
    d.routed = d.distinct_experts * (loaded ? loaded->per_expert : (double)num_moe_layers(c) * per_expert_layer);
  }
  const double seq_state = (double)(spec.kda_layers * (spec.kda_state_bytes() + 3 * spec.kda_conv_floats * 4));
  d.kda_state = B * 2.0 * seq_state;
  d.mla_rows = B * context * (double)spec.bytes_per_token();
  return d;
}

TokenCosts token_costs(const ModelConfig& c, int64_t context) {
  const auto s = compute_stats(c);
  const double X = (double)c.expert_in_dim(), Im = (double)c.moe_intermediate_size, K = (double)c.top_k;
  TokenCosts t;
  t.expert_flops = 2.0 * 3 * X * Im;
  t.expert_in = X;
  // params_active counts the top-k routed experts; split it into the expert part and the rest.
  t.other_flops_decode = 2.0 * ((double)s.params_active - K * 3 * X * Im * (double)num_moe_layers(c));
  t.other_flops_prefill = t.other_flops_decode - 2.0 * (double)c.vocab_size * (double)c.hidden_size;
  t.attn_decode = attention_flops(c, (double)context, false);
  t.attn_prefill = attention_flops(c, (double)context / 2, true);
  return t;
}

double prefill_flops_per_token(const ModelConfig& c, double mean_position) {
  const TokenCosts t = token_costs(c, 0);
  return t.other_flops_prefill + attention_flops(c, mean_position, true) +
         (double)c.top_k * t.expert_flops * (double)num_moe_layers(c);
}

// ---------------------------------------------------------------- the plan

// Why the weights, workspace and one sequence of --context tokens do not fit a GPU ("" when they do).
static std::string why_it_does_not_fit(const Plan& p, double seq_state, double memory_gb) {
  char buf[512];
  auto gb = [](double b) { return b / 1e9; };
  if (p.free_for_cache_per_gpu < 0) {
    std::snprintf(buf, sizeof buf, "weights %.1f GB/GPU + workspace %.1f GB > %.1f GB usable (%.0f GB x %.2f)",
                  gb(p.weight_bytes_per_gpu), gb(p.workspace_bytes), gb(p.usable_bytes), memory_gb, p.in.mem_util);
    return buf;
  }
  if (p.bytes_per_seq_per_gpu > p.free_for_cache_per_gpu) {
    std::snprintf(buf, sizeof buf,
                  "one sequence of %lld tokens needs %.2f GB/GPU (KV %.2f GB + state %.2f GB) but only %.2f GB/GPU is "
                  "left after weights and workspace",
                  (long long)p.in.context, gb(p.bytes_per_seq_per_gpu), gb((double)p.in.context * p.kv_bytes_per_token),
                  gb(seq_state / p.tp), gb(p.free_for_cache_per_gpu));
    return buf;
  }
  return "";
}

// Price per GPU-hour (given or the hardware table's), the throughput it is divided by, $ per million tokens.
static void add_cost(Plan& p) {
  const PlanInput& in = p.in;
  if (in.price_per_gpu_hour) {
    p.price_per_gpu_hour = in.price_per_gpu_hour;
    p.price_origin = "--price-per-gpu-hour";
  } else if (in.hw.price_usd_per_hour) {
    p.price_per_gpu_hour = in.hw.price_usd_per_hour;
    p.price_origin = "hardware table default (illustrative, not a quote)";
  }
  if (in.measured_tokens_per_s) {
    p.cost_throughput_tok_s = *in.measured_tokens_per_s;
    p.cost_throughput_origin = "measured (" + in.measured_source + ")";
  } else if (p.decode_tok_s_aggregate > 0) {
    p.cost_throughput_tok_s = p.decode_tok_s_aggregate;
    p.cost_throughput_origin = "decode upper bound at batch " + std::to_string(p.batch);
  }
  if (p.price_per_gpu_hour && p.cost_throughput_tok_s > 0)
    p.usd_per_million_output_tokens = usd_per_million_tokens(*p.price_per_gpu_hour, in.count, p.cost_throughput_tok_s);
}

Plan make_plan(const PlanInput& in) {
  const ModelConfig& c = in.config;
  const Hardware& hw = in.hw;
  if (in.count < 1) throw Error("--count must be at least 1");
  if (in.context < 1) throw Error("--context must be at least 1");
  if (!(in.mem_util > 0 && in.mem_util <= 1)) throw Error("--mem-util must be in (0, 1]");
  Plan p;
  p.in = in;
  p.tp = in.tp > 0 ? in.tp : in.count;
  p.ep = in.ep > 0 ? in.ep : in.count;
  if (in.count % p.tp) throw Error("--tp " + std::to_string(p.tp) + " must divide --count " + std::to_string(in.count));
  if (in.count % p.ep) throw Error("--ep " + std::to_string(p.ep) + " must divide --count " + std::to_string(in.count));
  p.replicas = in.count / p.tp;
  if (c.mla_heads % p.tp || c.kda_heads % p.tp)
    p.notes.push_back("attention heads (MLA " + std::to_string(c.mla_heads) + ", KDA " + std::to_string(c.kda_heads) +
                      ") do not divide by tp " + std::to_string(p.tp) + ": real shards are uneven");
  if (c.num_experts % p.ep)
    p.notes.push_back(std::to_string(c.num_experts) + " experts do not divide by ep " + std::to_string(p.ep) +
                      ": the fullest GPU holds ceil(E/ep) experts per layer (counted)");

  // Model sizes.
  const auto s = compute_stats(c);
  p.params_total = s.params_total;
  p.params_active = s.params_active;
  p.weights = weight_bytes(c);
  const double X = (double)c.expert_in_dim(), Im = (double)c.moe_intermediate_size, E = (double)c.num_experts,
               K = (double)c.top_k;
  const double n_moe = (double)num_moe_layers(c);
  p.expert_bytes_per_expert_layer = 3 * X * Im * expert_bytes_per_param(c);
  const CacheSpec spec = make_cache_spec(c, in.kv_dtype, in.state_dtype);
  p.kv_bytes_per_token = (double)spec.bytes_per_token();
  p.state_bytes_per_seq = (double)(spec.kda_layers * spec.kda_state_bytes());
  p.conv_state_bytes_per_seq = (double)(spec.kda_layers * 3 * spec.kda_conv_floats * 4);
  const double seq_state = p.state_bytes_per_seq + p.conv_state_bytes_per_seq;
  if (p.kv_bytes_per_token > 0) {
    p.crossover_context = p.state_bytes_per_seq / p.kv_bytes_per_token;
    p.crossover_context_per_gpu = seq_state / p.tp / p.kv_bytes_per_token;
  }

  // Memory per GPU.
  const double mem = hw.memory_gb * 1e9;
  p.usable_bytes = mem * in.mem_util;
  p.runtime_reserve_bytes = mem - p.usable_bytes;
  p.workspace_bytes = workspace_bytes(c, in.prefill_chunk, p.tp);
  p.weight_non_expert_per_gpu = p.weights.non_expert() / p.tp;
  const double experts_per_gpu_per_layer = std::ceil(E / p.ep);
  p.weight_experts_per_gpu = c.num_experts > 0 ? experts_per_gpu_per_layer * n_moe * p.expert_bytes_per_expert_layer : 0;
  p.weight_bytes_per_gpu = p.weight_non_expert_per_gpu + p.weight_experts_per_gpu;
  p.free_for_cache_per_gpu = p.usable_bytes - p.weight_bytes_per_gpu - p.workspace_bytes;
  p.bytes_per_seq_per_gpu = (double)in.context * p.kv_bytes_per_token + seq_state / p.tp;

  p.why_not = why_it_does_not_fit(p, seq_state, hw.memory_gb);
  p.fits = p.why_not.empty();

  // Capacity.
  if (p.fits) {
    p.max_seqs_per_replica = (int64_t)std::floor(p.free_for_cache_per_gpu / p.bytes_per_seq_per_gpu);
    p.max_seqs = p.max_seqs_per_replica * p.replicas;
    p.max_context_one_seq =
        p.kv_bytes_per_token > 0 ? (int64_t)std::floor((p.free_for_cache_per_gpu - seq_state / p.tp) / p.kv_bytes_per_token) : 0;
  }

  // Speed bounds. MXFP4 experts run at the FP8 rate where the device has one (MXFP4 weights x
  // MXFP8 activations, as K3 was trained); BF16 experts (Kimi-Linear) and everything else at the
  // BF16 rate.
  const double bw = hw.hbm_tb_s * 1e12;
  const double bf16_rate = hw.bf16_tflops * 1e12;
  const double expert_rate = ((c.expert_quant_format == WeightFormat::MXFP4 || c.expert_quant_format == WeightFormat::MXFP4_GGML) && hw.fp8_tflops) ? *hw.fp8_tflops * 1e12 : bf16_rate;
  const TokenCosts tc = token_costs(c, in.context);
  const double expert_flops_per_token = K * tc.expert_flops * n_moe;
  const double other_flops_decode = tc.other_flops_decode, attn_decode = tc.attn_decode;

  // Batch 1: one GPU reads its non-expert shard (not the embedding table: one row), its share of
  // the top-k experts of every MoE layer, the whole latent cache of the sequence and (read+write)
  // its KDA state shard.
  const DecodeStepBytes one = decode_step_bytes(c, spec, 1, (double)in.context);
  const double non_expert_read = one.non_routed / p.tp;
  const double cache_read_per_seq = one.mla_rows + one.kda_state / p.tp;
  p.decode_bytes_per_token_b1 = non_expert_read + one.routed / p.ep + cache_read_per_seq;
  // TP's all-reduces come on top (not overlapped with the weight reads: each waits for its layer's matmul).
  const TpCollectives coll = tp_collectives(c);
  CollectiveCosts costs = assumed_collective_costs(hw);
  if (in.allreduce_latency_us || in.allreduce_busbw_gb_s) {
    if (in.allreduce_latency_us) costs.latency_s = *in.allreduce_latency_us * 1e-6;
    if (in.allreduce_busbw_gb_s) costs.busbw = *in.allreduce_busbw_gb_s * 1e9;
    costs.origin = "measured (" + in.measured_source + ")" +
                   (in.allreduce_latency_us && in.allreduce_busbw_gb_s ? "" : "; the other " + costs.origin);
  }
  if (p.tp > 1) {
    p.allreduces_per_step = coll.allreduces;
    p.allreduce_bytes_per_token = coll.bytes_per_token;
    p.allreduce_latency_s = costs.latency_s;
    p.allreduce_busbw = costs.busbw;
    p.collectives_origin = costs.origin;
    p.collectives_s_b1 = collectives_seconds(coll, costs, p.tp, 1);
  }
  p.decode_tok_s_user_b1 = 1.0 / (p.decode_bytes_per_token_b1 / bw + p.collectives_s_b1);

  p.batch = in.batch > 0 ? in.batch : p.max_seqs;
  if (p.batch > 0) {
    const double B = (double)p.batch;
    const double seqs_per_replica = std::ceil(B / p.replicas);
    const double tokens_per_ep_group = B * p.ep / in.count;
    const double distinct = distinct_experts(c, tokens_per_ep_group);
    const double experts_read = std::min(distinct / p.ep, experts_per_gpu_per_layer) * n_moe * p.expert_bytes_per_expert_layer;
    const double bytes = non_expert_read + experts_read + seqs_per_replica * cache_read_per_seq;
    const double t_mem = bytes / bw;
    const double t_compute = B / in.count * (expert_flops_per_token / expert_rate + (other_flops_decode + attn_decode) / bf16_rate);
    if (p.tp > 1) p.collectives_s_batch = collectives_seconds(coll, costs, p.tp, seqs_per_replica);
    p.decode_step_s_batch = std::max(t_mem, t_compute) + p.collectives_s_batch;
    p.decode_batch_compute_bound = t_compute > t_mem;
    p.decode_tok_s_user_batch = 1.0 / p.decode_step_s_batch;
    p.decode_tok_s_aggregate = B / p.decode_step_s_batch;
  }

  // Prefill: compute bound over all GPUs; the LM head runs for the last token only.
  const double other_flops_prefill = tc.other_flops_prefill + tc.attn_prefill;
  p.prefill_flops_per_token = prefill_flops_per_token(c, (double)in.context / 2);  // the same sum
  p.prefill_tok_s_aggregate = in.count / (expert_flops_per_token / expert_rate + other_flops_prefill / bf16_rate);

  add_cost(p);
  return p;
}

// ---------------------------------------------------------------- output

namespace {

const char* kv_name(CacheDType d) { return cache_dtype_name(d); }
const char* st_name(CacheDType d) { return cache_dtype_name(d); }

}  // namespace

std::string format_table(const Plan& p) {
  const auto& c = p.in.config;
  const auto& hw = p.in.hw;
  std::string o;
  auto row = [&](const std::string& k, const std::string& v) { o += fmt("  %-34s %s\n", k.c_str(), v.c_str()); };
  o += fmt("k3 plan: %s on %d x %s\n", c.source.c_str(), p.in.count, hw.name.c_str());
  o += fmt("  layout: tp %d (attention, dense, shared experts, embeddings, lm_head), ep %d (routed experts), %d attention replica%s\n",
           p.tp, p.ep, p.replicas, p.replicas == 1 ? "" : "s");
  o += fmt("  context %lld tokens, KV %s, KDA state %s, memory utilisation %.2f\n", (long long)p.in.context,
           kv_name(p.in.kv_dtype), st_name(p.in.state_dtype), p.in.mem_util);
  for (auto& n : p.notes) o += "  note: " + n + "\n";

  o += "\nMODEL\n";
  row("params total / active per token", count_h((double)p.params_total) + " / " + count_h((double)p.params_active));
  row("weights as stored (all GPUs)", bytes_h(p.weights.total()) + fmt("  (routed experts %s %s, other %s)",
      c.expert_quant_format ? weight_format_name(*c.expert_quant_format) : "BF16", bytes_h(p.weights.routed_experts).c_str(),
      bytes_h(p.weights.non_expert()).c_str()));
  row(fmt("KV per token (MLA latent, %s)", kv_name(p.in.kv_dtype)),
      fmt("%.2f KiB (%.0f B; %lld MLA layers x %lld values = %lld B per row)", p.kv_bytes_per_token / 1024,
          p.kv_bytes_per_token, (long long)c.num_mla_layers(), (long long)c.mla_cache_dim(),
          (long long)mla_row_bytes(p.in.kv_dtype, c.kv_lora_rank, c.qk_rope_dim)));
  row(fmt("KDA state per sequence (%s)", st_name(p.in.state_dtype)),
      bytes_h(p.state_bytes_per_seq) + " + conv state " + bytes_h(p.conv_state_bytes_per_seq) +
          fmt(" (%lld KDA layers x %lld heads x %lld^2)", (long long)c.num_kda_layers(), (long long)c.kda_heads, (long long)c.kda_head_dim));
  row("KV overtakes state at", fmt("%.0f tokens per sequence (per GPU under tp %d: %.0f)", p.crossover_context, p.tp,
                                   p.crossover_context_per_gpu));

  o += "\nMEMORY PER GPU\n";
  row("device memory", fmt("%.0f GB (usable %.1f GB, runtime reserve %.1f GB)", hw.memory_gb, p.usable_bytes / 1e9, p.runtime_reserve_bytes / 1e9));
  row("weights", bytes_h(p.weight_bytes_per_gpu) + fmt("  (experts %s, rest %s)", bytes_h(p.weight_experts_per_gpu).c_str(),
                                                          bytes_h(p.weight_non_expert_per_gpu).c_str()));
  row(fmt("activation workspace (chunk %lld)", (long long)p.in.prefill_chunk), bytes_h(p.workspace_bytes));
  row("left for KV + state", bytes_h(p.free_for_cache_per_gpu));
  row(fmt("one sequence at %lld tokens", (long long)p.in.context),
      bytes_h(p.bytes_per_seq_per_gpu) + fmt("  (KV %s + state/tp %s)", bytes_h((double)p.in.context * p.kv_bytes_per_token).c_str(),
                                               bytes_h((p.state_bytes_per_seq + p.conv_state_bytes_per_seq) / p.tp).c_str()));
  row("verdict", p.fits ? "FITS" : "DOES NOT FIT: " + p.why_not);

  o += "\nCAPACITY\n";
  if (p.fits) {
    row(fmt("max concurrent sequences @ %lld", (long long)p.in.context),
        fmt("%lld (%lld per replica x %d)", (long long)p.max_seqs, (long long)p.max_seqs_per_replica, p.replicas));
    row("longest single sequence", fmt("%lld tokens (memory only; the model's position limit is separate)", (long long)p.max_context_one_seq));
  } else {
    row("max concurrent sequences", "0 (does not fit)");
  }

  o += "\nSPEED (UPPER BOUNDS: roofline plus TP all-reduces, no kernel overheads)\n";
  row("decode bytes/token/GPU, batch 1", bytes_h(p.decode_bytes_per_token_b1));
  if (p.allreduces_per_step > 0)
    row(fmt("TP%d all-reduces per decode step", p.tp),
        fmt("%lld, %s per token: %.2f ms at batch 1%s (%.0f us each, bus %.0f GB/s; %s)", (long long)p.allreduces_per_step,
            bytes_h(p.allreduce_bytes_per_token).c_str(), p.collectives_s_b1 * 1e3,
            p.batch > 0 ? fmt(", %.2f ms at batch %lld", p.collectives_s_batch * 1e3, (long long)p.batch).c_str() : "",
            p.allreduce_latency_s * 1e6, p.allreduce_busbw / 1e9, p.collectives_origin.c_str()));
  row("decode per user, batch 1", fmt("<= %.1f tok/s (HBM %.2f TB/s%s)", p.decode_tok_s_user_b1, hw.hbm_tb_s,
                                      p.allreduces_per_step > 0 ? " + all-reduces" : ""));
  if (p.batch > 0) {
    row(fmt("decode at batch %lld", (long long)p.batch),
        fmt("<= %.1f tok/s per user, <= %.0f tok/s aggregate (%s bound)", p.decode_tok_s_user_batch, p.decode_tok_s_aggregate,
            p.decode_batch_compute_bound ? "compute" : "bandwidth"));
  }
  row("prefill (all GPUs)", fmt("<= %.0f tok/s (%.1f GFLOP/token)", p.prefill_tok_s_aggregate, p.prefill_flops_per_token / 1e9));

  o += "\nCOST\n";
  if (p.usd_per_million_output_tokens) {
    row("price", fmt("$%.2f per GPU-hour (%s)", *p.price_per_gpu_hour, p.price_origin.c_str()));
    row("throughput", fmt("%.0f tok/s (%s)", p.cost_throughput_tok_s, p.cost_throughput_origin.c_str()));
    row("$ per million output tokens", fmt("$%.3f%s", *p.usd_per_million_output_tokens,
                                           p.in.measured_tokens_per_s ? "" : " (lower bound: throughput is an upper bound)"));
  } else if (!p.price_per_gpu_hour) {
    row("$ per million output tokens", "n/a (no price: pass --price-per-gpu-hour)");
  } else {
    row("$ per million output tokens", "n/a (no throughput: does not fit; pass --measured RESULT.json)");
  }
  o += "\nhardware source: " + hw.source + "\n";
  return o;
}

json to_json(const Plan& p) {
  const auto& c = p.in.config;
  const auto& hw = p.in.hw;
  auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
  json j;
  j["model"] = {{"source", c.source}, {"arch", c.arch_name()}, {"params_total", p.params_total}, {"params_active", p.params_active},
                {"num_mla_layers", c.num_mla_layers()}, {"num_kda_layers", c.num_kda_layers()}};
  j["hardware"] = {{"key", hw.key}, {"name", hw.name}, {"memory_gb", hw.memory_gb}, {"hbm_tb_s", hw.hbm_tb_s},
                   {"bf16_tflops", hw.bf16_tflops}, {"fp8_tflops", opt(hw.fp8_tflops)}, {"fp4_tflops", opt(hw.fp4_tflops)},
                   {"nvlink_gb_s", opt(hw.nvlink_gb_s)}, {"source", hw.source}};
  j["layout"] = {{"count", p.in.count}, {"tp", p.tp}, {"ep", p.ep}, {"replicas", p.replicas}, {"context", p.in.context},
                 {"kv_dtype", kv_name(p.in.kv_dtype)}, {"state_dtype", st_name(p.in.state_dtype)}, {"mem_util", p.in.mem_util},
                 {"prefill_chunk", p.in.prefill_chunk}, {"notes", p.notes}};
  j["memory"] = {{"weights_total_bytes", p.weights.total()},
                 {"weights_routed_experts_bytes", p.weights.routed_experts},
                 {"weights_non_expert_bytes", p.weights.non_expert()},
                 {"kv_bytes_per_token", p.kv_bytes_per_token},
                 {"state_bytes_per_seq", p.state_bytes_per_seq},
                 {"conv_state_bytes_per_seq", p.conv_state_bytes_per_seq},
                 {"usable_bytes_per_gpu", p.usable_bytes},
                 {"runtime_reserve_bytes_per_gpu", p.runtime_reserve_bytes},
                 {"workspace_bytes_per_gpu", p.workspace_bytes},
                 {"weight_bytes_per_gpu", p.weight_bytes_per_gpu},
                 {"weight_expert_bytes_per_gpu", p.weight_experts_per_gpu},
                 {"weight_non_expert_bytes_per_gpu", p.weight_non_expert_per_gpu},
                 {"free_for_cache_bytes_per_gpu", p.free_for_cache_per_gpu},
                 {"bytes_per_seq_per_gpu", p.bytes_per_seq_per_gpu},
                 {"fits", p.fits},
                 {"why_not", p.why_not}};
  j["capacity"] = {{"max_seqs", p.max_seqs}, {"max_seqs_per_replica", p.max_seqs_per_replica},
                   {"max_context_one_seq", p.max_context_one_seq}, {"kv_overtakes_state_at_tokens", p.crossover_context},
                   {"kv_overtakes_state_at_tokens_per_gpu", p.crossover_context_per_gpu}};
  j["speed_upper_bounds"] = {{"decode_bytes_per_token_batch1_per_gpu", p.decode_bytes_per_token_b1},
                             {"decode_tok_s_per_user_batch1", p.decode_tok_s_user_b1},
                             {"batch", p.batch},
                             {"decode_tok_s_per_user_at_batch", p.decode_tok_s_user_batch},
                             {"decode_tok_s_aggregate_at_batch", p.decode_tok_s_aggregate},
                             {"decode_at_batch_compute_bound", p.decode_batch_compute_bound},
                             {"prefill_flops_per_token", p.prefill_flops_per_token},
                             {"prefill_tok_s_aggregate", p.prefill_tok_s_aggregate}};
  j["tp_collectives"] = {{"allreduces_per_decode_step", p.allreduces_per_step},
                         {"allreduce_bytes_per_token", p.allreduce_bytes_per_token},
                         {"allreduce_latency_us", p.allreduce_latency_s * 1e6},
                         {"allreduce_busbw_gb_s", p.allreduce_busbw / 1e9},
                         {"origin", p.collectives_origin},
                         {"seconds_per_decode_step_batch1", p.collectives_s_b1},
                         {"seconds_per_decode_step_at_batch", p.collectives_s_batch}};
  j["cost"] = {{"price_per_gpu_hour", opt(p.price_per_gpu_hour)}, {"price_origin", p.price_origin},
               {"throughput_tok_s", p.cost_throughput_tok_s}, {"throughput_origin", p.cost_throughput_origin},
               {"usd_per_million_output_tokens", opt(p.usd_per_million_output_tokens)}};
  return j;
}

}  // namespace k3::plan
