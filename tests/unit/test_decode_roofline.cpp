// The decode roofline of `k3 bench offline` (plan::decode_step_bytes, bench::add_decode_roofline), its prefill
// roofline (plan::prefill_flops_per_token, bench::add_prefill_roofline) and the read-bandwidth measurement of
// `k3 bench memory`.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "k3/bench/memory_bandwidth.h"
#include "k3/bench/offline.h"
#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/io/gguf_writer.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/gguf_export.h"
#include "k3/model/model.h"
#include "k3/model/weights.h"
#include "k3/plan/plan.h"
#include "k3/runtime/cache_spec.h"
#include "test_util.h"

namespace {

k3::ModelConfig tiny_config() { return k3::load_model_config(std::string(K3_SOURCE_DIR) + "/models/k3-tiny"); }

// k3-tiny: 32 MXFP4 experts top-4 in 11 MoE layers, 19584 B per expert-layer; bf16 latent rows of
// 3 x 80 x 2 = 480 B per token; KDA state 294912 B + conv tails 41472 B per sequence (test_plan.cpp).
TEST(DecodeRoofline, StepBytesFromFirstPrinciples) {
  const k3::ModelConfig c = tiny_config();
  const k3::CacheSpec spec = k3::make_cache_spec(c, k3::CacheDType::BF16, k3::CacheDType::F32);
  const auto w = k3::plan::weight_bytes(c);
  const auto one = k3::plan::decode_step_bytes(c, spec, 1, 1000);
  EXPECT_DOUBLE_EQ(one.non_routed, w.non_expert() - w.embedding);
  EXPECT_DOUBLE_EQ(one.distinct_experts, 4);
  EXPECT_DOUBLE_EQ(one.routed, 4 * 11 * 19584.0);
  EXPECT_DOUBLE_EQ(one.mla_rows, 1000 * 480.0);
  EXPECT_DOUBLE_EQ(one.kda_state, 2 * (294912.0 + 41472.0));
  // Batch 8: the weights once, the expected distinct experts of 32 picks, 8 sequences' state and rows.
  const auto eight = k3::plan::decode_step_bytes(c, spec, 8, 10);
  const double distinct = 32 * (1 - std::pow(1 - 4.0 / 32, 8));
  EXPECT_NEAR(eight.distinct_experts, distinct, 1e-12);
  EXPECT_NEAR(eight.routed, distinct * 11 * 19584.0, 1e-6);
  EXPECT_DOUBLE_EQ(eight.non_routed, one.non_routed);
  EXPECT_DOUBLE_EQ(eight.mla_rows, 8 * 10 * 480.0);
  EXPECT_DOUBLE_EQ(eight.kda_state, 8 * one.kda_state);
  // A measured distinct count replaces the expectation.
  EXPECT_DOUBLE_EQ(k3::plan::decode_step_bytes(c, spec, 8, 10, 17).routed, 17 * 11 * 19584.0);
  // The planner's batch-1 bound is the same model (one GPU: no TP/EP split).
  k3::plan::PlanInput in;
  in.config = c;
  in.hw = k3::plan::find_hardware(k3::plan::builtin_hardware(), "h200");
  in.count = 1;
  in.context = 1000;
  EXPECT_DOUBLE_EQ(k3::plan::make_plan(in).decode_bytes_per_token_b1, one.total());
}

TEST(DecodeRoofline, OfflineRowsCarryBytesAndShareOfBandwidth) {
  const k3::ModelConfig c = tiny_config();
  const k3::CacheSpec spec = k3::make_cache_spec(c);
  k3::bench::OfflineResult tg;
  tg.test = {"tg16", false, 16, 4, 2};
  tg.seconds = {0.5, 1.5};  // mean 1 s for 16 steps
  tg.tps_mean = 32;
  k3::bench::add_decode_roofline(tg, c, spec, 40);
  // mean context: depth 4 + (16 + 1) / 2 rows
  const double bytes = k3::plan::decode_step_bytes(c, spec, 2, 4 + 8.5).total();
  EXPECT_DOUBLE_EQ(tg.step_bytes, bytes);
  EXPECT_DOUBLE_EQ(tg.read_gb_s, bytes * 16 / 1.0 / 1e9);
  EXPECT_EQ(tg.to_json().at("of_bandwidth").get<double>(), tg.read_gb_s / 40);
  k3::bench::OfflineResult pp;
  pp.test = {"pp8", true, 8, 0, 1};
  pp.seconds = {1};
  k3::bench::add_decode_roofline(pp, c, spec, 40);
  EXPECT_EQ(pp.step_bytes, 0);  // prefill is not bandwidth-bound: no roofline
  EXPECT_FALSE(pp.to_json().contains("step_bytes"));
  const std::string table = k3::bench::offline_table({pp, tg}, "tiny");
  EXPECT_NE(table.find("% of BW"), std::string::npos) << table;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.0f%%", 100 * tg.read_gb_s / 40);
  EXPECT_NE(table.find(pct), std::string::npos) << table;
  // No bandwidth: the llama-bench table unchanged.
  EXPECT_EQ(k3::bench::offline_table({pp}, "tiny").find("GB/s"), std::string::npos);
}

// A prompt token's FLOPs against the matrices k3-tiny binds: 2 x every weight a token multiplies (the dense walk
// without the token table and the head, the MLA layers' kv_b, which the walk leaves out, the top-k routed
// experts of each MoE layer) plus the attention's at the mean position. Vectors (norms, gates' biases, conv
// taps) are counted by neither side; the config's parameter count includes them, hence the 1% margin.
TEST(PrefillRoofline, FlopsPerTokenFromTheBoundMatrices) {
  const auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  const k3::ModelConfig& c = m->config();
  const k3::ModelWeights& w = m->weights();
  double params = 0;
  k3::for_each_dense_matrix(w, [&](const k3::WeightMatrix& x) {
    if (&x != &w.embed && &x != &w.lm_head) params += static_cast<double>(x.rows * x.cols);
  });
  for (const k3::LayerWeights& L : w.layers) {
    if (!L.is_kda) params += static_cast<double>(L.mla.kv_b_f32.rows * L.mla.kv_b_f32.cols);
    if (!L.is_moe) continue;
    double experts = 0;
    for (const k3::GluMlp& e : L.moe.experts)
      for (const k3::WeightMatrix* x : {&e.gate, &e.up, &e.down}) experts += static_cast<double>(x->rows * x->cols);
    params += experts / static_cast<double>(L.moe.experts.size()) * static_cast<double>(c.top_k);
  }
  ASSERT_GT(params, 0);
  for (double pos : {0.0, 100.0, 4096.0}) {
    const double want = 2 * params + k3::plan::attention_flops(c, pos, true);
    EXPECT_NEAR(k3::plan::prefill_flops_per_token(c, pos), want, 0.01 * want) << pos;
  }
  // Later positions cost more (the MLA layers' attention grows with the position).
  EXPECT_GT(k3::plan::prefill_flops_per_token(c, 4096), k3::plan::prefill_flops_per_token(c, 0));
}

TEST(PrefillRoofline, OfflineRowsCarryTflopsAndShareOfPeak) {
  const k3::ModelConfig c = tiny_config();
  k3::bench::OfflineResult pp;
  pp.test = {"pp64", true, 64, 32, 2};
  pp.seconds = {0.5, 1.5};
  pp.tps_mean = 128;  // 2 x 64 tokens a second
  k3::bench::add_prefill_roofline(pp, c, 0.5);
  const double fpt = k3::plan::prefill_flops_per_token(c, 32 + 32);  // depth 32 + 64 / 2
  EXPECT_DOUBLE_EQ(pp.flops_per_token, fpt);
  EXPECT_DOUBLE_EQ(pp.tflop_s, fpt * 128 / 1e12);
  EXPECT_DOUBLE_EQ(pp.to_json().at("of_peak").get<double>(), pp.tflop_s / 0.5);
  k3::bench::OfflineResult tg;
  tg.test = {"tg16", false, 16, 0, 1};
  tg.seconds = {1};
  tg.tps_mean = 16;
  k3::bench::add_prefill_roofline(tg, c, 0.5);
  EXPECT_EQ(tg.flops_per_token, 0);  // decode is bandwidth-bound: no compute roofline
  EXPECT_FALSE(tg.to_json().contains("tflop_s"));
  k3::bench::OfflineResult none = pp;
  none.flops_per_token = 0;
  k3::bench::add_prefill_roofline(none, c, 0);  // no peak given: no columns
  EXPECT_EQ(none.flops_per_token, 0);
  const std::string table = k3::bench::offline_table({pp, tg}, "tiny");
  EXPECT_NE(table.find("% of peak"), std::string::npos) << table;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.1f%%", 100 * pp.tflop_s / 0.5);
  EXPECT_NE(table.find(pct), std::string::npos) << table;
  EXPECT_EQ(k3::bench::offline_table({tg}, "tiny").find("TFLOP/s"), std::string::npos);
}

// The roofline of a model as loaded (what `k3 bench offline` uses for a GGUF on the CPU): the bound matrices'
// own bytes, checked against the config's count on the HF dir and against the file's own tensor table on a GGUF
// whose dense matrices are Q8_0 blocks.
TEST(DecodeRoofline, LoadedWeightBytesAreTheBoundFormats) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = tiny_config();
  const auto w = k3::plan::weight_bytes(c);
  const auto hf = k3::Model::load(dir);
  const k3::plan::LoadedWeightBytes lb = k3::bench::loaded_weight_bytes(hf->weights());
  EXPECT_DOUBLE_EQ(lb.per_expert, 11 * 19584.0);  // MXFP4 experts as shipped: the config's count
  // The rest: the config's bytes less the vectors (norms, conv taps, biases), which loaded_weight_bytes leaves out.
  const double cfg_non_routed = w.non_expert() - w.embedding;
  EXPECT_LT(lb.non_routed, cfg_non_routed);
  EXPECT_GT(lb.non_routed, 0.97 * cfg_non_routed) << lb.non_routed << " vs " << cfg_non_routed;

  k3test::TempDir t;
  const std::string path = t.str() + "/q8.gguf";
  const k3::Checkpoint ck(dir);  // the writer keeps views into it until write()
  k3::GgufWriter gw;
  k3::add_model_to_gguf(gw, c, ck, "k3-tiny",
                        {k3::parse_tensor_type_rule("attn|ffn_(gate|up|down)\\.|output=q8_0")});
  gw.write(path);
  const auto gg = k3::Model::load(path);
  const k3::plan::LoadedWeightBytes lq = k3::bench::loaded_weight_bytes(gg->weights());
  // The file's tensor table: every matrix (2+ dims) a token reads; the routed experts' stacks over E.
  const k3::GgufFile f(path);
  double non_routed = 0, experts = 0;
  bool head = false;
  for (const k3::GgufTensor& x : f.gguf().tensors) {
    head |= x.name == "output.weight";
    if (x.dims.size() < 2 || x.dims[1] == 1 || x.name == "token_embd.weight") continue;
    (x.name.find("_exps.") != std::string::npos ? experts : non_routed) += static_cast<double>(x.bytes);
  }
  if (!head) non_routed += static_cast<double>(f.gguf().find("token_embd.weight")->bytes);  // a tied head
  EXPECT_DOUBLE_EQ(lq.per_expert, experts / static_cast<double>(c.num_experts));
  EXPECT_DOUBLE_EQ(lq.non_routed, non_routed);
  EXPECT_LT(lq.non_routed, 0.75 * lb.non_routed);  // Q8_0 (34 B a 32) in place of bf16 (64 B a 32) for most
}

TEST(MemoryBandwidth, MeasuresAPositiveRateAndRejectsBadSizes) {
  const auto r = k3::bench::measure_read_bandwidth(size_t{64} << 20, 1);
  EXPECT_GT(r.best_gb_s, 0.1);
  EXPECT_GE(r.best_gb_s, r.median_gb_s);
  EXPECT_EQ(r.bytes, size_t{64} << 20);
  EXPECT_THROW(k3::bench::measure_read_bandwidth(size_t{1} << 20, 1), k3::Error);
  EXPECT_THROW(k3::bench::measure_read_bandwidth(size_t{65} << 30, 1), k3::Error);
  EXPECT_THROW(k3::bench::measure_read_bandwidth(size_t{64} << 20, 0), k3::Error);
}

// --job-kib: the buffer read as back-to-back jobs (a decode product's size); bad sizes refused.
TEST(MemoryBandwidth, ReadsInJobsOfAGivenSize) {
  const auto j = k3::bench::measure_read_bandwidth(size_t{64} << 20, 2, (size_t{1} << 20) + 100);
  EXPECT_GT(j.median_gb_s, 0.1);
  EXPECT_EQ(j.job_bytes, size_t{1} << 20);  // whole 4 KiB pages
  EXPECT_EQ(k3::bench::measure_read_bandwidth(size_t{64} << 20, 1).job_bytes, 0u);
  EXPECT_THROW(k3::bench::measure_read_bandwidth(size_t{64} << 20, 1, 4095), k3::Error);
  EXPECT_THROW(k3::bench::measure_read_bandwidth(size_t{64} << 20, 1, (size_t{64} << 20) + 4096), k3::Error);
}

}  // namespace
