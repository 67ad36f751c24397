// `k3 plan`: the published K3 / Kimi-Linear sizes come out of the config, and the planner's
// invariants hold (more GPUs, smaller dtypes, longer context, cost formula).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/model/model_stats.h"
#include "k3/cache/hybrid_cache.h"
#include "k3/core/weight.h"
#include "k3/model/placement.h"
#include "k3/plan/collectives.h"
#include "k3/plan/offload_plan.h"
#include "k3/plan/plan.h"

using namespace k3::plan;

namespace {

Plan plan_for(const std::string& preset, const std::string& gpu, int count, int64_t context = 8192,
              k3::CacheDType kv = k3::CacheDType::BF16, k3::CacheDType st = k3::CacheDType::F32) {
  PlanInput in;
  in.config = load_preset(preset);
  in.hw = find_hardware(builtin_hardware(), gpu);
  in.count = count;
  in.context = context;
  in.kv_dtype = kv;
  in.state_dtype = st;
  return make_plan(in);
}

std::string run_cli(const std::string& args) {
  std::string out;
  FILE* p = ::popen((std::string(K3_BINARY) + " " + args + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int st = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << args << "\n" << out;
  return out;
}

// Bytes of each safetensors tensor as stored, by dtype class, read straight from the file header:
// a measurement of the checkpoint that shares nothing with the planner's parameter counting.
std::map<std::string, double> stored_bytes_by_class(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string header(n, '\0');
  f.read(header.data(), (std::streamsize)n);
  std::map<std::string, double> out;
  const auto tensors = nlohmann::json::parse(header);
  for (auto& [name, t] : tensors.items()) {
    if (name == "__metadata__") continue;
    const double bytes = t["data_offsets"][1].get<double>() - t["data_offsets"][0].get<double>();
    std::string cls = t["dtype"].get<std::string>();
    if (name.find("embed_tokens") != std::string::npos) cls = "embedding";
    else if (name.find(".experts.") != std::string::npos) cls = "routed_experts";
    else if (name.find("A_log") != std::string::npos) cls = "A_log";
    out[cls] += bytes;
  }
  return out;
}

}  // namespace

TEST(Plan, HardwareTableHasEveryDeviceWithASource) {
  for (const char* k : {"h200", "h100", "b200", "b300", "gb300", "a100-80g", "cpu"}) {
    auto h = find_hardware(builtin_hardware(), k);
    EXPECT_FALSE(h.source.empty()) << k;
    EXPECT_GT(h.memory_gb, 0) << k;
  }
  EXPECT_EQ(find_hardware(builtin_hardware(), "h200").memory_gb, 141);
  EXPECT_EQ(find_hardware(builtin_hardware(), "b300").memory_gb, 288);
  EXPECT_DOUBLE_EQ(find_hardware(builtin_hardware(), "h100").hbm_tb_s, 3.35);
  EXPECT_THROW(find_hardware(builtin_hardware(), "tpu"), k3::Error);
  EXPECT_THROW(load_preset("gpt"), k3::Error);
  EXPECT_THROW(parse_hardware(R"({"devices": {"x": {"memory_gb": 1, "hbm_tb_s": 1, "bf16_tflops": 1}}})", "t"), k3::Error);
}

TEST(Plan, K3CacheAndStateSizes) {
  auto bf = plan_for("kimi-k3", "b300", 8);
  auto f8 = plan_for("kimi-k3", "b300", 8, 8192, k3::CacheDType::FP8_E4M3);
  EXPECT_DOUBLE_EQ(f8.kv_bytes_per_token, 24.0 * 644);  // 24 x (512 e4m3 + 64 bf16 k_pe + 4 B scale)
  EXPECT_DOUBLE_EQ(bf.kv_bytes_per_token, 27.0 * 1024);
  EXPECT_NEAR(bf.state_bytes_per_seq / 1e6, 434, 0.5);  // 69 x 96 x 128 x 128 x 4 B
  EXPECT_EQ(bf.state_bytes_per_seq, 69.0 * 96 * 128 * 128 * 4);
  EXPECT_NEAR(bf.crossover_context, 434110464.0 / 27648, 1);
}

// What `k3 plan` predicts per token and per sequence is what the serving cache lays out for the same dtypes
// (HybridCache built from the runner's CacheSpec; pages and slots round up to 256-byte units), for K3 and
// Kimi-Linear. The caches are constructed for real (one slot, a page or two: reserved, never touched).
TEST(Plan, PredictsWhatTheCacheAllocates) {
  for (const char* preset : {"kimi-k3", "kimi-linear-48b"})
    for (k3::CacheDType kv : {k3::CacheDType::F32, k3::CacheDType::BF16, k3::CacheDType::FP8_E4M3})
      for (k3::CacheDType st : {k3::CacheDType::F32, k3::CacheDType::BF16}) {
        const Plan p = plan_for(preset, "b300", 8, 8192, kv, st);
        const k3::CacheSpec spec = k3::make_cache_spec(p.in.config, kv, st);
        k3::cache::CacheOptions opt;
        opt.page_tokens = 16;
        opt.max_num_seqs = 1;
        opt.prefix_caching = false;
        opt.budget_bytes = k3::cache::HybridCache::budget_for(spec, opt.page_tokens, 1, 32);
        const k3::cache::HybridCache cache(spec, opt);
        const std::string what = std::string(preset) + " " + k3::cache_dtype_name(kv) + " / " + k3::cache_dtype_name(st);
        const double per_token = static_cast<double>(cache.page_bytes()) / 16;
        EXPECT_GE(per_token, p.kv_bytes_per_token) << what;
        EXPECT_LT(per_token, p.kv_bytes_per_token + 256.0 / 16) << what;
        const double seq = p.state_bytes_per_seq + p.conv_state_bytes_per_seq;
        EXPECT_GE(static_cast<double>(cache.slot_bytes()), seq) << what;
        EXPECT_LT(static_cast<double>(cache.slot_bytes()), seq + 256.0 * static_cast<double>(spec.kda_layers + 1)) << what;
      }
}

TEST(Plan, K3WeightsAndActiveParams) {
  auto w = weight_bytes(load_preset("kimi-k3"));
  EXPECT_NEAR(w.total() / 1e12, 1.56, 1.56 * 0.03);
  auto p = plan_for("kimi-k3", "b300", 8);
  EXPECT_NEAR(p.params_active / 1e9, 104, 104 * 0.03);
  EXPECT_NEAR(p.params_total / 1e12, 2.78, 2.78 * 0.03);
  EXPECT_TRUE(p.fits) << p.why_not;
  auto h = plan_for("kimi-k3", "h200", 8);
  EXPECT_FALSE(h.fits);
  EXPECT_NE(h.why_not.find("weights"), std::string::npos) << h.why_not;
  EXPECT_NEAR(h.weight_bytes_per_gpu / 1e9, 195, 6);
  EXPECT_TRUE(plan_for("kimi-k3", "h200", 16).fits);
}

TEST(Plan, KimiLinearNumbers) {
  auto c = load_preset("kimi-linear-48b");
  auto w = weight_bytes(c);
  EXPECT_NEAR(w.total() / 1e9, 98, 98 * 0.03);  // ~49B params, all BF16
  auto p = plan_for("kimi-linear-48b", "h100", 1);
  EXPECT_NEAR(p.params_total / 1e9, 48, 48 * 0.05);
  EXPECT_NEAR(p.params_active / 1e9, 3, 3 * 0.25);
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 7.0 * 576 * 2);
  EXPECT_NEAR(p.state_bytes_per_seq / 1e6, 42, 0.5);  // 20 x 32 x 128 x 128 x 4 B
  EXPECT_FALSE(p.fits);  // 98 GB on one 80 GB H100
  EXPECT_TRUE(plan_for("kimi-linear-48b", "h200", 1).fits);
  EXPECT_TRUE(plan_for("kimi-linear-48b", "h100", 2).fits);
}

TEST(Plan, Invariants) {
  // more GPUs, more capacity
  EXPECT_GT(plan_for("kimi-k3", "h200", 32).max_seqs, plan_for("kimi-k3", "h200", 16).max_seqs);
  EXPECT_GT(plan_for("kimi-linear-48b", "h100", 4).max_seqs, plan_for("kimi-linear-48b", "h100", 2).max_seqs);
  // fp8 KV: 512 e4m3 c_kv + 64 bf16 k_pe + a 4-byte scale = 644 B per row (vs 1152 bf16); a bf16 state
  // halves the state bytes (the conv tails stay fp32)
  auto base = plan_for("kimi-k3", "b300", 8);
  const int64_t mla = base.in.config.num_mla_layers();
  EXPECT_DOUBLE_EQ(base.kv_bytes_per_token, 1152.0 * static_cast<double>(mla));
  EXPECT_DOUBLE_EQ(plan_for("kimi-k3", "b300", 8, 8192, k3::CacheDType::FP8_E4M3).kv_bytes_per_token, 644.0 * static_cast<double>(mla));
  auto st = plan_for("kimi-k3", "b300", 8, 8192, k3::CacheDType::BF16, k3::CacheDType::BF16);
  EXPECT_DOUBLE_EQ(st.state_bytes_per_seq * 2, base.state_bytes_per_seq);
  EXPECT_DOUBLE_EQ(st.conv_state_bytes_per_seq, base.conv_state_bytes_per_seq);
  EXPECT_GE(st.max_seqs, base.max_seqs);
  // decode bound decreases with context
  double prev = 1e30;
  for (int64_t ctx : {1024, 8192, 32768, 131072}) {
    auto p = plan_for("kimi-k3", "b300", 8, ctx);
    EXPECT_LT(p.decode_tok_s_user_b1, prev) << ctx;
    prev = p.decode_tok_s_user_b1;
  }
  // capacity falls with context
  EXPECT_GT(plan_for("kimi-k3", "b300", 8, 4096).max_seqs, plan_for("kimi-k3", "b300", 8, 65536).max_seqs);
}

// The batch-1 decode bound and the cost, recomputed here from the config's sizes and the checkpoint's
// bytes (not from the planner), on the committed models/k3-tiny: 12 layers, 9 KDA (2 heads x 64) and
// 3 MLA (kv_lora 64 + rope 16), 11 MoE layers (first_k_dense 1) of 32 MXFP4 experts, top 4, latent
// width 128, moe_intermediate 96, short conv 4, vocab 8192 x hidden 256, untied lm_head.
TEST(Plan, DecodeBoundAndCostFromFirstPrinciples) {
  const std::string dir = std::string(K3_SOURCE_DIR) + "/models/k3-tiny";
  PlanInput in;
  in.config = k3::load_model_config(dir);
  in.hw = find_hardware(builtin_hardware(), "h200");  // 4.8 TB/s
  in.count = 1;
  in.context = 1000;
  in.batch = 1;
  in.price_per_gpu_hour = 3.0;
  const auto p = make_plan(in);

  // MLA latent per token: 3 layers x (64 + 16) values x 2 B (bf16) = 480 B.
  EXPECT_DOUBLE_EQ(p.kv_bytes_per_token, 480);
  // KDA state per sequence: 9 layers x 2 heads x 64 x 64 x 4 B (fp32) = 294912 B.
  EXPECT_DOUBLE_EQ(p.state_bytes_per_seq, 294912);
  // short-conv state: the last (4 - 1) inputs of q, k, v: 9 x 3 x (2 x 64) x 3 x 4 B = 41472 B.
  EXPECT_DOUBLE_EQ(p.conv_state_bytes_per_seq, 41472);
  // one routed expert in one layer: gate, up, down = 3 x 128 x 96 params x 4.25 bits / 8 = 19584 B
  // (MXFP4: 4-bit codes + one 8-bit scale per 32); 11 layers x 32 experts x 19584 = 6893568 B,
  // which is exactly what the checkpoint stores for them.
  const auto stored = stored_bytes_by_class(dir + "/model.safetensors");
  EXPECT_DOUBLE_EQ(p.expert_bytes_per_expert_layer, 19584);
  EXPECT_DOUBLE_EQ(stored.at("routed_experts"), 11 * 32 * 19584.0);
  // Weights a decode step reads: everything but the embedding table (one row is gathered) and the
  // routed experts that are not selected = the checkpoint's bf16 + f32 bytes (lm_head included), with
  // A_log counted as its 2 live heads per KDA layer (the file pads it to 128 values), plus top-4 x 11
  // layers x 19584 B of experts.
  const double a_log_live = 9 * 2 * 4.0;
  const double non_expert_read = stored.at("BF16") + stored.at("F32") + a_log_live;
  const double experts_read = 4 * 11 * 19584.0;
  // KV cache read for 1000 tokens + the KDA and conv states read and written once each.
  const double cache_read = 1000 * 480.0 + 2 * (294912.0 + 41472.0);
  const double bytes = non_expert_read + experts_read + cache_read;
  EXPECT_NEAR(p.decode_bytes_per_token_b1, bytes, 0.5);
  EXPECT_NEAR(p.decode_tok_s_user_b1, 4.8e12 / bytes, 4.8e12 / bytes * 1e-12);
  // At batch 1 this tiny model is far from compute bound, so one step = bytes / bandwidth, and the
  // cost is $3 per GPU-hour / (tok/s x 3600 s) per token, x 1e6 per million.
  ASSERT_FALSE(p.decode_batch_compute_bound);
  ASSERT_TRUE(p.usd_per_million_output_tokens);
  const double usd_per_mtok = 3.0 / (4.8e12 / bytes * 3600) * 1e6;
  EXPECT_NEAR(*p.usd_per_million_output_tokens, usd_per_mtok, usd_per_mtok * 1e-12);
}

// The K3 preset's per-token decode terms from its published sizes (b300 x 8, tp 8, ep 8).
TEST(Plan, K3DecodeTermsFromFirstPrinciples) {
  auto at = [](int64_t context) {
    PlanInput in;
    in.config = load_preset("kimi-k3");
    in.hw = find_hardware(builtin_hardware(), "b300");
    in.count = 8;
    in.context = context;
    return make_plan(in);
  };
  const auto a = at(8192), b = at(16384);
  // one routed expert-layer: 3 x 3584 (latent width) x 3072 params x 4.25 bits / 8 = 17547264 B.
  EXPECT_DOUBLE_EQ(a.expert_bytes_per_expert_layer, 17547264);
  // 8192 more tokens of context add 8192 x 24 MLA layers x 576 x 2 B = 226492416 B to a batch-1 step
  // (the latent is not split by TP: every GPU of the group reads all of it).
  EXPECT_DOUBLE_EQ(b.decode_bytes_per_token_b1 - a.decode_bytes_per_token_b1, 8192 * 24 * 576 * 2.0);
  // the rest of a step at context 8192: non-expert weights / 8 + 16 experts x 92 MoE layers x
  // 17547264 B / 8 GPUs (= 3228696576 B) + the latent + the KDA state (69 x 96 x 128 x 128 x 4 B) and
  // conv state (69 x 3 x 96 x 128 x 3 x 4 B), read and written, split over 8
  const double experts = 16 * 92 * 17547264.0 / 8;
  const double cache = 8192 * 24 * 576 * 2.0 + 2 * (69 * 96 * 128 * 128 * 4.0 + 69 * 3 * 96 * 128 * 3 * 4.0) / 8;
  const double non_expert = (a.weights.non_expert() - a.weights.embedding) / 8;
  EXPECT_DOUBLE_EQ(a.decode_bytes_per_token_b1, non_expert + experts + cache);
}

TEST(Plan, CostFormula) {
  // $3/GPU-hour on 8 GPUs = $24/hour; 1000 tok/s = 3.6e6 tokens/hour -> 24 / 3.6 = $6.667 per million.
  EXPECT_NEAR(usd_per_million_tokens(3.0, 8, 1000), 24.0 / 3.6, 1e-12);
  PlanInput in;
  in.config = load_preset("kimi-k3");
  in.hw = find_hardware(builtin_hardware(), "b300");
  in.count = 8;
  in.price_per_gpu_hour = 6.0;
  auto p = make_plan(in);
  ASSERT_TRUE(p.usd_per_million_output_tokens);
  // without a measurement the planner prices its aggregate decode bound (checked above).
  EXPECT_NEAR(*p.usd_per_million_output_tokens, 6.0 * 8 / (p.decode_tok_s_aggregate * 3600) * 1e6, 1e-9);
  in.measured_tokens_per_s = read_measured_throughput(R"({"results": {"output_tokens_per_s": 2500.0}})", "bench.json");
  in.measured_source = "bench.json";
  p = make_plan(in);
  // $6 x 8 = $48/hour; 2500 tok/s = 9e6 tokens/hour -> 48 / 9 = $5.333 per million.
  EXPECT_NEAR(*p.usd_per_million_output_tokens, 48.0 / 9.0, 1e-12);
  EXPECT_THROW(read_measured_throughput(R"({"x": 1})", "b.json"), k3::Error);
}

// TP's all-reduces (docs/multi-gpu.md's table): K3 279 per step, 4 x (7168 x 187 + 3584 x 92) bytes per token;
// Kimi-Linear-48B 55, 4 x 2304 x 55. They lower both decode bounds by exactly the model's seconds, only at
// TP > 1, and measured costs replace the assumed ones.
TEST(Plan, TpAllReducesInTheDecodeBounds) {
  const TpCollectives k3c = tp_collectives(load_preset("kimi-k3"));
  EXPECT_EQ(k3c.allreduces, 279);
  EXPECT_DOUBLE_EQ(k3c.bytes_per_token, 4.0 * (7168.0 * 187 + 3584.0 * 92));
  const TpCollectives kl = tp_collectives(load_preset("kimi-linear-48b"));
  EXPECT_EQ(kl.allreduces, 55);
  EXPECT_DOUBLE_EQ(kl.bytes_per_token, 4.0 * 2304 * 55);

  PlanInput in;
  in.config = load_preset("kimi-k3");
  in.hw = find_hardware(builtin_hardware(), "h200");
  in.count = 16;
  in.batch = 64;
  const Plan p = make_plan(in);
  ASSERT_EQ(p.tp, 16);
  EXPECT_EQ(p.allreduces_per_step, 279);
  const double bw = in.hw.hbm_tb_s * 1e12;
  const double coll_b1 = 279 * 8e-6 + 2.0 * 15 / 16 * k3c.bytes_per_token / (0.4 * *in.hw.nvlink_gb_s * 1e9);
  EXPECT_NEAR(p.collectives_s_b1, coll_b1, 1e-12);
  EXPECT_NEAR(1.0 / p.decode_tok_s_user_b1, p.decode_bytes_per_token_b1 / bw + coll_b1, 1e-12);
  EXPECT_GT(p.collectives_s_batch, p.collectives_s_b1);  // the payload grows with the batch, the latency does not

  // Measured costs (an nccl-tests figure, say) replace the assumed ones.
  const Measured m = read_measured(R"({"nccl": {"allreduce_latency_us": 20, "allreduce_busbw_gb_s": 100}})", "coll.json");
  EXPECT_FALSE(m.tokens_per_s);
  in.allreduce_latency_us = m.allreduce_latency_us;
  in.allreduce_busbw_gb_s = m.allreduce_busbw_gb_s;
  in.measured_source = "coll.json";
  const Plan q = make_plan(in);
  EXPECT_NEAR(q.collectives_s_b1, 279 * 20e-6 + 2.0 * 15 / 16 * k3c.bytes_per_token / 100e9, 1e-12);
  EXPECT_NE(q.collectives_origin.find("measured (coll.json)"), std::string::npos);
  EXPECT_LT(q.decode_tok_s_user_b1, p.decode_tok_s_user_b1);
  EXPECT_THROW(read_measured(R"({"allreduce_latency_us": -1})", "c.json"), k3::Error);
  EXPECT_THROW(read_measured(R"({"x": 1})", "c.json"), k3::Error);
  EXPECT_THROW(read_measured(R"({"allreduce_busbw_gb_s": 1e-300})", "c.json"), k3::Error);  // a unit slip
  EXPECT_THROW(read_measured(R"({"allreduce_latency_us": 8e6})", "c.json"), k3::Error);

  // One GPU (TP1): no all-reduces, the plain bandwidth bound.
  in.count = 1;
  in.config = load_preset("kimi-linear-48b");
  const Plan one = make_plan(in);
  EXPECT_EQ(one.allreduces_per_step, 0);
  EXPECT_EQ(one.collectives_s_b1, 0);
  EXPECT_NEAR(one.decode_tok_s_user_b1, bw / one.decode_bytes_per_token_b1, 1e-9);
}

TEST(Plan, LayoutChoices) {
  PlanInput in;
  in.config = load_preset("kimi-k3");
  in.hw = find_hardware(builtin_hardware(), "b300");
  in.count = 8;
  in.tp = 3;
  EXPECT_THROW(make_plan(in), k3::Error);
  in.tp = 1;  // DP attention: non-expert weights replicated on every GPU, 8 attention replicas
  auto dp = make_plan(in);
  EXPECT_EQ(dp.replicas, 8);
  in.tp = 8;
  auto tp = make_plan(in);
  EXPECT_GT(dp.weight_bytes_per_gpu, tp.weight_bytes_per_gpu);
  EXPECT_NEAR(dp.weight_experts_per_gpu, tp.weight_experts_per_gpu, 1);
}

TEST(Plan, CliTableAndJson) {
  auto t = run_cli("plan --preset kimi-k3 --gpu h200 --count 8");
  EXPECT_NE(t.find("DOES NOT FIT"), std::string::npos) << t;
  EXPECT_NE(t.find("UPPER BOUNDS"), std::string::npos) << t;
  auto j = nlohmann::json::parse(run_cli("plan --preset kimi-k3 --gpu b300 --count 8 --json --kv-dtype fp8"));
  EXPECT_TRUE(j["memory"]["fits"].get<bool>());
  EXPECT_EQ(j["memory"]["kv_bytes_per_token"].get<double>(), 24 * 644);
  EXPECT_GT(j["capacity"]["max_seqs"].get<int64_t>(), 0);
  EXPECT_GT(j["speed_upper_bounds"]["decode_tok_s_per_user_batch1"].get<double>(), 0);
}

// ---------------------------------------------------------------- one GPU + host RAM + disk (--host)

namespace {

OffloadPlan offload_for(const std::string& preset, const std::string& gpu, const std::string& host, double ram_gb = 0) {
  OffloadInput in;
  in.config = load_preset(preset);
  if (!gpu.empty()) in.gpu = find_hardware(builtin_hardware(), gpu);
  in.host = find_host(builtin_hosts(), host);
  if (ram_gb > 0) in.host.ram_gb = ram_gb;
  return make_offload_plan(in);
}

int flag_value(const OffloadPlan& p, const std::string& flag) {
  for (auto& f : p.flags)
    if (f.rfind(flag + " ", 0) == 0) return std::stoi(f.substr(flag.size() + 1));
  return -1;
}

}  // namespace

TEST(OffloadPlan, EveryExpertIsPlacedExactlyOnce) {
  for (const char* preset : {"kimi-linear-48b", "kimi-k3"})
    for (const char* gpu : {"rtx4090", "h200", ""})
      for (double ram : {64.0, 192.0, 2048.0}) {
        const OffloadPlan p = offload_for(preset, gpu, "epyc-9654-2s", ram);
        SCOPED_TRACE(std::string(preset) + " on '" + gpu + "' + " + std::to_string(ram) + " GB");
        if (!p.fits) continue;
        EXPECT_NEAR(p.vram.experts + p.ram.experts + p.disk_expert_bytes, p.weights.routed_experts, 1.0);
        EXPECT_NEAR(p.vram.non_expert + p.ram.non_expert, p.weights.non_expert(), 1.0);
        EXPECT_EQ(p.gpu_expert_layers + p.cpu_expert_layers, p.moe_layers);
        EXPECT_LE(p.ram.total(), ram * 1e9 * p.in.ram_util + 1);
        if (p.in.gpu) {
          EXPECT_LE(p.vram.total(), p.in.gpu->memory_gb * 1e9 * p.in.mem_util + 1);
        }
        EXPECT_GT(p.decode_tok_s_overlapped, 0);
        EXPECT_GE(p.decode_tok_s_overlapped, p.decode_tok_s_serial);
      }
}

// The --n-cpu-moe N the plan prints, given to the real placement rules, puts exactly the plan's host
// layers' experts on the CPU.
TEST(OffloadPlan, NCpuMoeFlagRealisesThePlacement) {
  const OffloadPlan p = offload_for("kimi-linear-48b", "rtx4090", "ryzen-7950x");
  ASSERT_TRUE(p.fits) << p.why_not;
  ASSERT_GT(p.gpu_expert_layers, 0);
  ASSERT_GT(p.cpu_expert_layers, 0);
  const int n = flag_value(p, "--n-cpu-moe");
  ASSERT_GT(n, 0);
  const k3::Placement rules = k3::Placement::parse({}, false, n);
  int64_t on_host = 0, on_gpu = 0;
  for (int64_t l = 0; l < p.in.config.num_layers; ++l) {
    if (!p.in.config.is_moe_layer(l)) continue;
    const std::string name = "model.layers." + std::to_string(l) + ".block_sparse_moe.experts.0.w1.weight";
    (rules.device_of(name, 0) == k3::kHostDevice ? on_host : on_gpu) += 1;
  }
  EXPECT_EQ(on_host, p.cpu_expert_layers);
  EXPECT_EQ(on_gpu, p.gpu_expert_layers);
}

// CPU only, everything in RAM: a decode step reads the non-expert weights (not the embedding table),
// top-k experts of every MoE layer and the sequence's cache -- computed here from the config by hand.
TEST(OffloadPlan, CpuOnlyDecodeIsBytesOverBandwidth) {
  const OffloadPlan p = offload_for("kimi-linear-48b", "", "ryzen-7950x");
  ASSERT_TRUE(p.fits) << p.why_not;
  const auto& c = p.in.config;
  EXPECT_EQ(p.disk_expert_bytes, 0);
  const double eb = 3.0 * c.expert_in_dim() * c.moe_intermediate_size * 2.0;  // BF16 experts
  const double seq = 8192 * p.kv_bytes_per_token + 2 * p.state_bytes_per_seq;
  const double bytes = p.weights.non_expert() - p.weights.embedding + c.top_k * eb * p.moe_layers + seq;
  EXPECT_NEAR(p.decode.cpu, bytes / 96e9, 1e-9);
  EXPECT_EQ(p.decode.gpu, 0);
  EXPECT_EQ(p.decode.pcie, 0);
}

// Less RAM: experts spill to disk, the uniform-routing hit rate is the RAM share, and the decode bound falls.
TEST(OffloadPlan, SpillingToDiskLowersHitRateAndSpeed) {
  const OffloadPlan big = offload_for("kimi-linear-48b", "", "ryzen-7950x", 192);
  const OffloadPlan small = offload_for("kimi-linear-48b", "", "ryzen-7950x", 48);
  ASSERT_TRUE(big.fits && small.fits) << small.why_not;
  EXPECT_EQ(big.expert_hit_rate, 1);
  EXPECT_GT(small.disk_expert_bytes, 0);
  EXPECT_NEAR(small.expert_hit_rate, small.ram.experts / small.weights.routed_experts, 1e-12);
  EXPECT_GT(small.decode.disk, 0);
  EXPECT_LT(small.decode_tok_s_serial, big.decode_tok_s_serial);
  EXPECT_NE(std::string(format_offload_table(small)).find("bigger than RAM"), std::string::npos);
}

// Streaming the host's experts to the GPU pays for large prefill chunks only, and earlier on a faster link.
TEST(OffloadPlan, StreamingSwitchPointMovesWithPcie) {
  OffloadInput in;
  in.config = load_preset("kimi-linear-48b");
  in.gpu = find_hardware(builtin_hardware(), "h200");
  in.host = find_host(builtin_hosts(), "ryzen-7950x");
  in.gpu->memory_gb = 24;  // most experts on the host
  in.host.pcie_gb_s = 8;
  const OffloadPlan slow = make_offload_plan(in);
  in.host.pcie_gb_s = 63;
  const OffloadPlan fast = make_offload_plan(in);
  ASSERT_TRUE(slow.fits && fast.fits);
  ASSERT_GT(fast.stream_from_tokens, 1);
  EXPECT_TRUE(slow.stream_from_tokens == 0 || slow.stream_from_tokens > fast.stream_from_tokens);
}

TEST(OffloadPlan, BadInputsAreClearErrors) {
  EXPECT_THROW(find_host(builtin_hosts(), "nope"), k3::Error);
  EXPECT_THROW(parse_hosts(R"({"hosts": {"x": {"ram_gb": 1, "source": "s"}}})", "t.json"), k3::Error);
  EXPECT_THROW(parse_hosts(R"({"hosts": {"x": {"ram_gb": 1, "dram_gb_s": 1, "cpu_tflops": 1, "pcie_gb_s": 1, "disk_gb_s": -1, "source": "s"}}})", "t.json"),
               k3::Error);
  EXPECT_TRUE(parse_hosts(R"({"devices": {}})", "t.json").empty());
  OffloadInput in;
  in.config = load_preset("kimi-k3");
  in.host = find_host(builtin_hosts(), "ryzen-7950x");
  in.expert_hit_rate = 1.5;
  EXPECT_THROW(make_offload_plan(in), k3::Error);
  in.expert_hit_rate.reset();
  in.gpu = find_hardware(builtin_hardware(), "rtx4090");  // K3's 113 GB of non-expert weights
  const OffloadPlan p = make_offload_plan(in);
  EXPECT_FALSE(p.fits);
  EXPECT_NE(p.why_not.find("non-expert"), std::string::npos);
  for (const auto& h : builtin_hosts()) EXPECT_FALSE(h.source.empty()) << h.key;
}

TEST(OffloadPlan, CliPrintsPlacementAndFlags) {
  const std::string out = run_cli("plan --preset kimi-linear-48b --host ryzen-7950x --gpu rtx4090");
  EXPECT_NE(out.find("--n-cpu-moe"), std::string::npos) << out;
  EXPECT_NE(out.find("RAM (192 GB)"), std::string::npos) << out;
  const auto j = nlohmann::json::parse(run_cli("plan --preset kimi-linear-48b --host ryzen-7950x --json"));
  EXPECT_TRUE(j["fits"].get<bool>());
  EXPECT_GT(j["speed"]["decode_tok_s_serial"].get<double>(), 0);
}

// NaN and infinities pass CLI11's numeric range checks; the floating-point flags reject them (before, a
// `--ram-gb nan` was silently ignored and `--mem-util nan` reached the planner).
TEST(OffloadPlan, CliRejectsNonFiniteNumbers) {
  for (const char* args : {"--host ryzen-7950x --ram-gb nan", "--host ryzen-7950x --expert-hit-rate nan",
                           "--host ryzen-7950x --disk-gb-s inf", "--gpu h200 --count 8 --price-per-gpu-hour nan"}) {
    std::string out;
    FILE* p = ::popen((std::string(K3_BINARY) + " plan --preset kimi-linear-48b " + args + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = ::pclose(p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << args << "\n" << out;
    EXPECT_NE(out.find("finite"), std::string::npos) << args << "\n" << out;
  }
}
