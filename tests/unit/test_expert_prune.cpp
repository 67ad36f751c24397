// Expert pruning (model/expert_prune.h) and the safetensors writer it uses: saliency against a float64
// reference, the keep rule, a pruned checkpoint that loads and, when only experts the input never routes to
// are removed, gives bitwise the same logits; and `k3 prune` end to end.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "k3/core/error.h"
#include "k3/io/safetensors.h"
#include "k3/io/safetensors_writer.h"
#include "k3/model/expert_prune.h"
#include "k3/model/model.h"
#include "test_util.h"

TEST(SafetensorsWriter, RoundTripsThroughTheReader) {
  k3test::TempDir t;
  std::vector<uint8_t> a(3 * 5 * 2), b(7 * 4);
  std::mt19937 rng(1);
  for (auto& x : a) x = static_cast<uint8_t>(rng());
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  k3::SafetensorsWriter w;
  w.add_view("x.weight", k3::DType::BF16, {3, 5}, a.data(), a.size());
  w.add_owned("y.bias", k3::DType::F32, {7}, b);
  w.add_owned("z.empty", k3::DType::F32, {0}, {});
  w.set_metadata("format", "pt");
  EXPECT_THROW(w.add_view("x.weight", k3::DType::BF16, {3, 5}, a.data(), a.size()), k3::Error);  // taken
  EXPECT_THROW(w.add_view("bad", k3::DType::F32, {3, 5}, a.data(), a.size()), k3::Error);        // wrong size
  w.write(t.str() + "/m.safetensors");
  k3::SafetensorsFile f(t.str() + "/m.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  const auto& x = f.tensors().at("x.weight");
  EXPECT_EQ(x.shape, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(std::vector<uint8_t>(x.data, x.data + x.nbytes), a);
  const auto& y = f.tensors().at("y.bias");
  EXPECT_EQ(y.dtype, k3::DType::F32);
  EXPECT_EQ(std::vector<uint8_t>(y.data, y.data + y.nbytes), b);
  std::ifstream raw(t.str() + "/m.safetensors", std::ios::binary);
  uint64_t hlen = 0;
  raw.read(reinterpret_cast<char*>(&hlen), 8);
  EXPECT_EQ(hlen % 8, 0u);  // data starts 8-byte aligned
  EXPECT_FALSE(std::ifstream(t.str() + "/m.safetensors.tmp").good());
}

TEST(ExpertPrune, KeepsTheHighestScoresTiesToTheLowerId) {
  const std::vector<std::vector<double>> s = {{}, {0.5, 2.0, 0.5, 1.0, 0.0}, {1, 1, 1, 1, 1}};
  const auto k = k3::experts_to_keep(s, 3);
  EXPECT_TRUE(k[0].empty());
  EXPECT_EQ(k[1], (std::vector<int64_t>{0, 1, 3}));  // 2.0, 1.0, then the first 0.5
  EXPECT_EQ(k[2], (std::vector<int64_t>{0, 1, 2}));
  EXPECT_THROW(k3::experts_to_keep(s, 6), k3::Error);
  EXPECT_THROW(k3::experts_to_keep(s, 0), k3::Error);
  EXPECT_EQ(k3::parse_prune_method("reap"), k3::PruneMethod::Reap);
  EXPECT_THROW(k3::parse_prune_method("magnitude"), k3::Error);
}

// The observer's REAP saliency against a float64 recomputation from the routed rows it was shown.
TEST(ExpertPrune, SaliencyIsMeanRoutingWeightTimesOutputNorm) {
  auto model = k3::Model::load(k3test::source_path("tests/data/tiny-k3"));
  k3::ExpertSaliency sal(model->weights());
  const k3::MoeWeights* layer1 = nullptr;
  for (const auto& L : model->weights().layers)
    if (L.is_moe) { layer1 = &L.moe; break; }
  ASSERT_NE(layer1, nullptr);
  const std::vector<std::pair<int64_t, float>> toks = {{0, 0.25f}, {3, 0.5f}};
  const std::vector<float> y = {3, 4, 0, 1, 1, 1};  // norms 5 and sqrt(3)
  sal.on_expert_outputs(*layer1, 2, toks, y.data(), 3);
  sal.on_expert_outputs(*layer1, 2, std::span(toks).subspan(1), y.data(), 3);  // norm 5 again, weight 0.5
  const auto reap = sal.scores(k3::PruneMethod::Reap), freq = sal.scores(k3::PruneMethod::Frequency);
  int64_t l = 0;
  while (!model->weights().layers[static_cast<size_t>(l)].is_moe) ++l;
  EXPECT_NEAR(reap[static_cast<size_t>(l)][2], (0.25 * 5 + 0.5 * std::sqrt(3.0) + 0.5 * 5) / 3, 1e-12);
  EXPECT_EQ(freq[static_cast<size_t>(l)][2], 3.0);
  EXPECT_EQ(reap[static_cast<size_t>(l)][0], 0.0);  // never routed
}

// Calibrate on a few tokens, prune exactly as many experts as that input never routes to in its busiest
// layer: the pruned checkpoint loads, keeps the kept experts' bytes and router rows, and gives the same
// logits bit for bit on that input (routing among the kept experts is unchanged).
TEST(ExpertPrune, UnusedExpertsPrunedLeaveLogitsIdentical) {
  const std::string src = k3test::source_path("tests/data/tiny-k3");
  auto model = k3::Model::load(src);
  const auto& cfg = model->config();
  const std::vector<int32_t> toks = {5, 77, 300};
  k3::ExpertSaliency sal(model->weights());
  model->set_activation_observer(&sal);
  std::vector<float> ref;
  k3::ForwardOptions fo;
  fo.all_logits = true;
  {
    auto st = model->new_cache();
    model->forward(toks, *st, ref, fo);
  }
  model->set_activation_observer(nullptr);
  int64_t max_used = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    int64_t used = 0;
    for (int64_t e = 0; e < cfg.num_experts; ++e) used += sal.routed(l, e) > 0;
    max_used = std::max(max_used, used);
  }
  ASSERT_LT(max_used, cfg.num_experts) << "the input routes to every expert: nothing to prune";
  const auto keep = k3::experts_to_keep(sal.scores(k3::PruneMethod::Reap), max_used);
  k3test::TempDir t;
  const std::string out = t.str() + "/pruned";
  const auto r = k3::write_pruned_checkpoint(src, model->checkpoint(), cfg, keep, out);
  EXPECT_LT(r.tensors_out, r.tensors_in);
  EXPECT_LT(r.bytes_out, r.bytes_in);
  EXPECT_THROW(k3::write_pruned_checkpoint(src, model->checkpoint(), cfg, keep, out), k3::Error);  // holds a model now

  auto pruned = k3::Model::load(out);
  EXPECT_EQ(pruned->config().num_experts, max_used);
  std::vector<float> got;
  {
    auto st = pruned->new_cache();
    pruned->forward(toks, *st, got, fo);
  }
  ASSERT_EQ(got.size(), ref.size());
  EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)));
  // Kept experts are the old ones, byte for byte, renumbered in order; the router rows follow them.
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    if (!cfg.is_moe_layer(l)) continue;
    const auto& a = model->weights().layers[static_cast<size_t>(l)].moe;
    const auto& b = pruned->weights().layers[static_cast<size_t>(l)].moe;
    const auto& k = keep[static_cast<size_t>(l)];
    for (size_t j = 0; j < k.size(); ++j) {
      const auto& ea = a.experts[static_cast<size_t>(k[j])].down;
      const auto& eb = b.experts[j].down;
      ASSERT_EQ(ea.bytes(), eb.bytes());
      EXPECT_EQ(0, std::memcmp(ea.data, eb.data, static_cast<size_t>(ea.bytes())));
      const int64_t row = a.router.bytes() / cfg.num_experts;
      EXPECT_EQ(0, std::memcmp(static_cast<const uint8_t*>(a.router.data) + k[j] * row,
                               static_cast<const uint8_t*>(b.router.data) + static_cast<int64_t>(j) * row, static_cast<size_t>(row)));
    }
  }
}

TEST(ExpertPrune, CliPrunesAndRejectsBadRatios) {
  K3_SKIP_WITHOUT_SHARED();
  k3test::TempDir t;
  const std::string k3 = K3_BINARY, text = k3test::shared_path("data/corpora/emma.txt");
  auto sh = [](const std::string& cmd) {
    std::string out;
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = ::pclose(p);
    return std::make_pair(WIFEXITED(st) ? WEXITSTATUS(st) : -1, out);
  };
  auto [st, out] = sh(k3 + " prune -f " + text + " --ctx 64 --chunks 2 --ratio 0.25 -o " + t.str() + "/p");
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("32 -> 24 experts"), std::string::npos) << out;
  std::ifstream cf(t.str() + "/p/config.json");
  const auto j = nlohmann::json::parse(cf);
  const auto& tc = j.contains("text_config") ? j["text_config"] : j;
  EXPECT_EQ(tc["num_experts"], 24);
  std::tie(st, out) = sh(k3 + " run -m " + t.str() + "/p -p Hello -n 4 --temp 0");
  EXPECT_EQ(st, 0) << out;  // the pruned model loads and generates
  for (const char* bad : {"0", "1", "nan", "0.95"}) {  // 0.95 keeps 2 of 32, fewer than top-k 4
    std::tie(st, out) = sh(k3 + " prune -f " + text + " --ratio " + bad + " -o " + t.str() + "/q");
    EXPECT_NE(st, 0) << bad << ": " << out;
    EXPECT_NE(out.find("ratio"), std::string::npos) << bad << ": " << out;
  }
  std::tie(st, out) = sh("timeout 20 " + k3 + " prune -f /dev/zero --ratio 0.25 -o " + t.str() + "/q");
  EXPECT_EQ(st, 1) << out;  // not an endless read of the device
  EXPECT_NE(out.find("not a regular file"), std::string::npos) << out;
  std::tie(st, out) = sh(k3 + " prune -f " + text + " --ratio 0.25 --method magnitude -o " + t.str() + "/q");
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("reap, frequency"), std::string::npos) << out;
}
