// `k3 plan`: the published K3 / Kimi-Linear sizes come out of the config, and the planner's
// invariants hold (more GPUs, smaller dtypes, longer context, cost formula).
#include <gtest/gtest.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/model/model_stats.h"
#include "k3/plan/plan.h"

using namespace k3::plan;

namespace {

Plan plan_for(const std::string& preset, const std::string& gpu, int count, int64_t context = 8192,
              KvDtype kv = KvDtype::BF16, StateDtype st = StateDtype::FP32) {
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
  auto f8 = plan_for("kimi-k3", "b300", 8, 8192, KvDtype::FP8);
  EXPECT_DOUBLE_EQ(f8.kv_bytes_per_token, 13.5 * 1024);  // 24 x 576 x 1 B
  EXPECT_DOUBLE_EQ(bf.kv_bytes_per_token, 27.0 * 1024);
  EXPECT_NEAR(bf.state_bytes_per_seq / 1e6, 434, 0.5);  // 69 x 96 x 128 x 128 x 4 B
  EXPECT_EQ(bf.state_bytes_per_seq, 69.0 * 96 * 128 * 128 * 4);
  EXPECT_NEAR(bf.crossover_context, 434110464.0 / 27648, 1);
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
  // fp8 KV halves KV bytes; bf16 state halves state bytes
  auto base = plan_for("kimi-k3", "b300", 8);
  EXPECT_DOUBLE_EQ(plan_for("kimi-k3", "b300", 8, 8192, KvDtype::FP8).kv_bytes_per_token * 2, base.kv_bytes_per_token);
  auto st = plan_for("kimi-k3", "b300", 8, 8192, KvDtype::BF16, StateDtype::BF16);
  EXPECT_DOUBLE_EQ(st.state_bytes_per_seq * 2, base.state_bytes_per_seq);
  EXPECT_DOUBLE_EQ(st.conv_state_bytes_per_seq * 2, base.conv_state_bytes_per_seq);
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

TEST(Plan, CostFormula) {
  EXPECT_DOUBLE_EQ(usd_per_million_tokens(3.0, 8, 1000), 3.0 * 8 / (1000 * 3600.0) * 1e6);
  PlanInput in;
  in.config = load_preset("kimi-k3");
  in.hw = find_hardware(builtin_hardware(), "b300");
  in.count = 8;
  in.price_per_gpu_hour = 6.0;
  auto p = make_plan(in);
  ASSERT_TRUE(p.usd_per_million_output_tokens);
  EXPECT_NEAR(*p.usd_per_million_output_tokens, 6.0 * 8 / (p.decode_tok_s_aggregate * 3600) * 1e6, 1e-9);
  in.measured_tokens_per_s = read_measured_throughput(R"({"results": {"output_tokens_per_s": 2500.0}})", "bench.json");
  in.measured_source = "bench.json";
  p = make_plan(in);
  EXPECT_NEAR(*p.usd_per_million_output_tokens, 6.0 * 8 / (2500.0 * 3600) * 1e6, 1e-9);
  EXPECT_THROW(read_measured_throughput(R"({"x": 1})", "b.json"), k3::Error);
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
  EXPECT_EQ(j["memory"]["kv_bytes_per_token"].get<double>(), 13824);
  EXPECT_GT(j["capacity"]["max_seqs"].get<int64_t>(), 0);
  EXPECT_GT(j["speed_upper_bounds"]["decode_tok_s_per_user_batch1"].get<double>(), 0);
}
