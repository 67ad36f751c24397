// The block drafter against the Python side's goldens (tests/data/drafter-golden, python/k3drafter/gen_goldens.py):
// the taps of k3-tiny for a fixed 20-token sequence against k3ref's float64 taps (prefill and decode forms),
// and a random-weight drafter's logits for 3 (ctx, token) cases against the float64 numpy reference, all 8
// block positions, with the argmax exactly. Tolerance: the goldens' suggested 1e-3 max abs (~200x a float32
// torch implementation's error, far below the cases' smallest top-1 / top-2 gap, 0.011); measured printed.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "k3/model/drafter/block_drafter.h"
#include "k3/model/model.h"
#include "test_util.h"

namespace {

const std::string kDir = "tests/data/drafter-golden";

nlohmann::json read_json(const std::string& name) {
  std::ifstream f(k3test::source_path(kDir + "/" + name));
  return nlohmann::json::parse(f);
}

std::vector<float> read_f32(const std::string& name, size_t n) {
  std::ifstream f(k3test::source_path(kDir + "/" + name), std::ios::binary);
  std::vector<float> v(n);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  EXPECT_EQ(static_cast<size_t>(f.gcount()), n * 4) << name;
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return a.size() == b.size() ? m : INFINITY;
}

k3::Model& tiny() {
  static auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  return *m;
}

TEST(DrafterGolden, TapsOfK3TinyMatchK3ref) {
  const nlohmann::json j = read_json("taps.json");
  const auto tokens = j["tokens"].get<std::vector<int32_t>>();
  const auto ids = j["tap_ids"].get<std::vector<int32_t>>();
  const int64_t H = tiny().config().hidden_size;
  ASSERT_EQ(j["shape"], (std::vector<int64_t>{static_cast<int64_t>(tokens.size()), static_cast<int64_t>(ids.size()), H}));
  const std::vector<float> want = read_f32(j["file"], tokens.size() * ids.size() * static_cast<size_t>(H));
  for (const k3::AttnPath path : {k3::AttnPath::Prefill, k3::AttnPath::Decode}) {
    auto cache = tiny().new_cache();
    std::vector<float> logits, taps;
    k3::ForwardOptions fo;
    fo.path = path;
    fo.all_logits = true;
    fo.tap_layers = ids;
    fo.taps = &taps;
    tiny().forward_batch({k3::BatchItem{tokens, cache.get(), true}}, logits, fo);
    const double err = max_abs_diff(taps, want);
    std::printf("  taps vs k3ref float64 (%s form): max |diff| %.3e (|tap| <= %.2f)\n",
                path == k3::AttnPath::Prefill ? "prefill" : "decode", err, j["max_abs_tap"].get<double>());
    EXPECT_LT(err, 1e-3);
  }
}

TEST(DrafterGolden, LogitsMatchTheFloat64Reference) {
  const nlohmann::json c = read_json("cases.json");
  const k3::Model& m = tiny();
  const auto d = k3::drafter::BlockDrafter::load(k3test::source_path(kDir + "/" + c["drafter"].get<std::string>()), m.config(),
                                                 m.weights().embed, m.weights().lm_head);
  const int64_t R = c["n_cases"], B = d->config().block_size, V = d->vocab_size();
  ASSERT_EQ(c["logits"]["shape"], (std::vector<int64_t>{R, B, V}));
  const auto tokens = c["tokens"].get<std::vector<int32_t>>();
  const std::vector<float> ctx = read_f32(c["ctx"]["file"], static_cast<size_t>(R * d->config().ctx_dim()));
  const std::vector<float> want = read_f32(c["logits"]["file"], static_cast<size_t>(R * B * V));
  std::vector<float> got;
  d->forward(ctx, tokens, B, got);
  const double err = max_abs_diff(got, want);
  std::printf("  drafter logits vs float64 golden: max |diff| %.3e\n", err);
  EXPECT_LT(err, 1e-3);
  std::vector<int32_t> drafts;
  d->draft(ctx, tokens, B, drafts);
  std::vector<int32_t> argmax;
  for (const auto& row : c["argmax"]) for (const auto& x : row) argmax.push_back(x.get<int32_t>());
  EXPECT_EQ(drafts, argmax);
}

}  // namespace
