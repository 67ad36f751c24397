// Capacity planning for a Kimi K3 / Kimi-Linear deployment from a config alone: weight bytes per
// GPU, MLA latent cache and KDA state sizes, whether it fits, how many sequences fit, roofline
// upper bounds on decode and prefill speed, and cost per million output tokens.
// Every formula is explained in docs/planning.md.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3/core/cache_dtype.h"
#include "k3/model/config.h"
#include "k3/runtime/cache_spec.h"

namespace k3::plan {

// One device from resources/hardware.json. Units: GB = 1e9 B, TB/s = 1e12 B/s, TFLOP/s dense.
struct Hardware {
  std::string key, name, source;
  double memory_gb = 0, hbm_tb_s = 0, bf16_tflops = 0;
  std::optional<double> fp8_tflops, fp4_tflops, nvlink_gb_s, pcie_gb_s, price_usd_per_hour;
};

// Parses a hardware file ({"devices": {key: {...}}}); throws k3::Error naming the entry and field.
std::vector<Hardware> parse_hardware(const std::string& json_text, const std::string& source);
// The built-in table (resources/hardware.json, compiled in).
const std::vector<Hardware>& builtin_hardware();
// Looks a key up ("h200", "b300", ...); throws k3::Error listing the known keys.
Hardware find_hardware(const std::vector<Hardware>& table, const std::string& key);

// Built-in model presets (resources/presets/*.json). Accepts the file stem ("kimi-linear-48b-a3b") or a
// short alias ("kimi-linear-48b", "kimi-linear", "k3").
std::vector<std::string> preset_names();
ModelConfig load_preset(const std::string& name);

// Cache dtypes are the runtime's (core/cache_dtype.h): the plan's per-token and per-sequence bytes are
// the CacheSpec's (runtime/cache_spec.h), i.e. what `k3 run/serve --kv-cache-dtype ...` allocates.

struct PlanInput {
  ModelConfig config;
  Hardware hw;
  int count = 8;             // GPUs (or CPU sockets-as-one-device: count 1)
  int tp = 0;                // tensor parallel size for attention / dense / shared / embeddings; 0: count
  int ep = 0;                // expert parallel size for routed experts; 0: count
  int64_t context = 8192;    // tokens per sequence (prompt + output) the capacity is computed for
  CacheDType kv_dtype = CacheDType::BF16;         // --kv-cache-dtype
  CacheDType state_dtype = CacheDType::F32;       // --mamba-ssm-cache-dtype
  double mem_util = 0.90;    // fraction of device memory the engine may use (rest: runtime, NCCL, fragmentation)
  int64_t prefill_chunk = 8192;  // tokens per prefill chunk: sizes the activation workspace
  int64_t batch = 0;         // concurrent decoding sequences for the aggregate bound; 0: max that fit
  std::optional<double> price_per_gpu_hour;   // overrides the hardware table's illustrative price
  std::optional<double> measured_tokens_per_s;  // aggregate output tok/s from `k3 bench`
  std::string measured_source;
  // TP all-reduce costs measured (--measured: allreduce_latency_us, allreduce_busbw_gb_s); unset: assumed
  // from the device (plan/collectives.h).
  std::optional<double> allreduce_latency_us, allreduce_busbw_gb_s;
};

struct WeightBreakdown {  // whole model, bytes as stored
  double embedding = 0, lm_head = 0, routed_experts = 0, other_bf16 = 0, other_f32 = 0;
  double total() const { return embedding + lm_head + routed_experts + other_bf16 + other_f32; }
  double non_expert() const { return embedding + lm_head + other_bf16 + other_f32; }
};

struct Plan {
  PlanInput in;
  int tp = 1, ep = 1, replicas = 1;  // replicas: count / tp attention groups (data parallel)
  // model
  int64_t params_total = 0, params_active = 0;
  WeightBreakdown weights;
  double expert_bytes_per_expert_layer = 0;  // one routed expert in one layer, as stored
  double kv_bytes_per_token = 0;        // MLA latent, all MLA layers, one sequence (not split by TP)
  double state_bytes_per_seq = 0;       // KDA recurrent state, all KDA layers (unsharded)
  double conv_state_bytes_per_seq = 0;  // KDA short-conv state (unsharded, fp32 whatever the state dtype)
  double crossover_context = 0;         // tokens where KV bytes = state bytes, per sequence, unsharded
  double crossover_context_per_gpu = 0; // the same per GPU under this layout (state split by TP, latent not)
  // memory per GPU
  double usable_bytes = 0, runtime_reserve_bytes = 0, workspace_bytes = 0;
  double weight_bytes_per_gpu = 0, weight_non_expert_per_gpu = 0, weight_experts_per_gpu = 0;
  double free_for_cache_per_gpu = 0;    // usable - weights - workspace (may be negative)
  double bytes_per_seq_per_gpu = 0;     // context * kv + (state + conv) / tp
  bool fits = false;
  std::string why_not;                  // empty when it fits
  std::vector<std::string> notes;       // layout warnings (heads not divisible, ...)
  // capacity
  int64_t max_seqs_per_replica = 0, max_seqs = 0;
  int64_t max_context_one_seq = 0;      // longest context one sequence per replica could have
  // speed (upper bounds)
  int64_t batch = 0;                    // B used for the aggregate bound
  double decode_bytes_per_token_b1 = 0; // per GPU, batch 1
  double decode_tok_s_user_b1 = 0;      // batch 1, bandwidth bound
  double decode_step_s_batch = 0;       // one decode step at batch B (max of bandwidth and compute time)
  double decode_tok_s_user_batch = 0, decode_tok_s_aggregate = 0;
  bool decode_batch_compute_bound = false;
  // TP's all-reduces per decode step (plan/collectives.h), added to both decode bounds when tp > 1.
  int64_t allreduces_per_step = 0;
  double allreduce_bytes_per_token = 0, allreduce_latency_s = 0, allreduce_busbw = 0;
  std::string collectives_origin;
  double collectives_s_b1 = 0, collectives_s_batch = 0;
  double prefill_flops_per_token = 0;   // at mean position context/2
  double prefill_tok_s_aggregate = 0;   // all GPUs, compute bound
  // cost
  std::optional<double> price_per_gpu_hour;
  std::string price_origin;             // "--price-per-gpu-hour", "hardware table (illustrative)"
  double cost_throughput_tok_s = 0;
  std::string cost_throughput_origin;   // "decode bound at batch B" or "measured (FILE)"
  std::optional<double> usd_per_million_output_tokens;
};

// Routed-expert arithmetic shared with the offload planner (offload_plan.h).
int64_t num_moe_layers(const ModelConfig& c);
// Quantised experts as their format stores them (MXFP4: 4.25 bits, scales included), else BF16.
double expert_bytes_per_param(const ModelConfig& c);
// Attention FLOPs for one token at position t (decode: absorbed MLA; prefill: materialised MLA, chunked KDA).
double attention_flops(const ModelConfig& c, double t, bool prefill);
// Expected distinct experts of one layer that `tokens` tokens pick (uniform routing, top-k without replacement
// approximated per pick): E (1 - (1 - k/E)^tokens).
double distinct_experts(const ModelConfig& c, double tokens);

// What one token costs in FLOPs, split the way the planners need it.
struct TokenCosts {
  double other_flops_decode = 0;   // everything but the routed experts and attention (incl. the LM head)
  double other_flops_prefill = 0;  // the same for a prefill token (the LM head runs for the last token only)
  double attn_decode = 0;          // attention of a token at position `context` (absorbed MLA, KDA recurrence)
  double attn_prefill = 0;         // of a prefill token at the mean position context / 2
  double expert_flops = 0;         // one token through one routed expert of one layer
  double expert_in = 0;            // expert input width (the latent dim on K3)
};
TokenCosts token_costs(const ModelConfig& c, int64_t context);
// FLOPs of one prompt token whose attention spans `mean_position` earlier tokens (materialised MLA, chunked KDA),
// its top-k routed experts included and the LM head not (a prompt runs it for its last token only): the
// numerator of the prefill roofline (`k3 bench offline --peak-tflops`, the plan's prefill bound).
double prefill_flops_per_token(const ModelConfig& c, double mean_position);

// Activation workspace of one prefill chunk of `chunk` tokens on one of `tp` GPUs.
double workspace_bytes(const ModelConfig& c, int64_t chunk, int tp);

// Whole-model stored weight bytes: routed experts in their quantised format (MXFP4: 4.25 bits/param) when the config says so,
// F32 for the KDA conv / dt_bias / A_log and router bias tensors, BF16 for everything else.
WeightBreakdown weight_bytes(const ModelConfig& c);

// What one decode step must read from memory on one device holding the whole model (the roofline's
// numerator; docs/planning.md, docs/perf/cpu.md): every non-routed weight once (not the embedding table:
// one row per token), the routed experts the batch's picks touch, each sequence's KDA state (S and conv
// tails, read + written back) and its MLA latent rows (`context` cached tokens, read once per layer).
struct DecodeStepBytes {
  double non_routed = 0, routed = 0, kda_state = 0, mla_rows = 0;
  double distinct_experts = 0;  // per MoE layer, as counted in `routed`
  double total() const { return non_routed + routed + kda_state + mla_rows; }
};
// Distinct experts per layer that `tokens` top-K picks over E experts touch, picks uniform and
// independent: E (1 - (1 - K/E)^tokens); exactly K for one token.
double expected_distinct_experts(double E, double K, double tokens);
// The weight bytes of a step as loaded, where they are not what the config implies (a GGUF's block formats):
// the non-routed matrices one token reads (the token table excluded) and one expert's matrices summed over the
// MoE layers (bench::loaded_weight_bytes counts them from a model's bound weights).
struct LoadedWeightBytes {
  double non_routed = 0, per_expert = 0;
};
// A step of `batch` sequences with `context` cached tokens each (the cache dtypes from `spec`);
// `distinct_experts` < 0: expected_distinct_experts(E, K, batch). `loaded`: its weight bytes replace the
// config's (the KDA state and MLA rows stay the cache spec's).
DecodeStepBytes decode_step_bytes(const ModelConfig& c, const CacheSpec& spec, int64_t batch, double context,
                                  double distinct_experts = -1, const LoadedWeightBytes* loaded = nullptr);

Plan make_plan(const PlanInput& in);

// $ per million output tokens: price * gpus / (tok/s * 3600) * 1e6.
double usd_per_million_tokens(double price_per_gpu_hour, int gpus, double tokens_per_s);

// Reads an aggregate output throughput from a `k3 bench` result: the first of the keys
// output_tokens_per_s, output_tok_s, output_throughput, decode_tokens_per_s, tokens_per_s found at any depth.
double read_measured_throughput(const std::string& json_text, const std::string& source);
// A measured result for `k3 plan --measured`: the throughput above and / or TP all-reduce costs
// (allreduce_latency_us, allreduce_busbw_gb_s, at any depth). Throws k3::Error when it holds none of them
// or a value is not a positive number.
struct Measured {
  std::optional<double> tokens_per_s, allreduce_latency_us, allreduce_busbw_gb_s;
};
Measured read_measured(const std::string& json_text, const std::string& source);

std::string format_table(const Plan& p);
nlohmann::json to_json(const Plan& p);

}  // namespace k3::plan
