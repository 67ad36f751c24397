// End-to-end logits of the C++ CPU forward pass against the PyTorch reference's goldens
// (python/make_goldens.py, computed in float64) on tiny random checkpoints in the real schema.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/core/npy.h"
#include "k3/model/model.h"
#include "golden_util.h"
#include "test_util.h"

namespace {

using k3test::compare_logits;

std::vector<int32_t> load_tokens(const std::string& golden_dir) {
  std::ifstream f(golden_dir + "/tokens.json");
  return nlohmann::json::parse(f).get<std::vector<int32_t>>();
}

class Golden : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = k3::Model::load(k3test::source_path("tests/data/" + GetParam()));
    gdir_ = k3test::source_path("tests/data/goldens/" + GetParam());
    tokens_ = load_tokens(gdir_);
    V_ = model_->config().vocab_size;
  }
  std::vector<float> golden(const std::string& name) {
    auto a = k3::read_npy_f32(gdir_ + "/" + name);
    EXPECT_EQ(a.shape, (std::vector<int64_t>{static_cast<int64_t>(tokens_.size()), V_}));
    return a.data;
  }
  std::vector<float> prefill(k3::AttnPath path, int chunk = 64) {
    return k3test::prefill_all_logits(*model_, tokens_, path, chunk);
  }
  std::vector<float> decode() {
    auto d = k3test::decode_all_logits(*model_, tokens_);
    EXPECT_EQ(d.n_past, static_cast<int64_t>(tokens_.size()));
    return d.logits;
  }
  int64_t rows() const { return static_cast<int64_t>(tokens_.size()); }
  // max |diff| / max |ref|, fp32 vs the float64 reference: measured error x margin (golden_util.h).
  double tol() const { return k3test::golden_tolerance(GetParam()); }

  std::unique_ptr<k3::Model> model_;
  std::string gdir_;
  std::vector<int32_t> tokens_;
  int64_t V_ = 0;
};


TEST_P(Golden, PrefillMatchesReference) {
  auto c = compare_logits(prefill(k3::AttnPath::Prefill), golden("logits_prefill.npy"), rows(), V_);
  EXPECT_LT(c.rel, tol());
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] prefill vs reference: rel %.3e\n", GetParam().c_str(), c.rel);
}

TEST_P(Golden, DecodeMatchesReference) {
  auto c = compare_logits(decode(), golden("logits_decode.npy"), rows(), V_);
  EXPECT_LT(c.rel, tol());
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] decode vs reference: rel %.3e\n", GetParam().c_str(), c.rel);
}

TEST_P(Golden, SplitPrefillMatchesReference) {
  // First 37 tokens, then 63 more on the same state (a prefill after a cached prefix).
  auto st = model_->new_sequence();
  std::vector<float> a, b;
  k3::ForwardOptions o;
  o.all_logits = true;
  o.path = k3::AttnPath::Prefill;
  model_->forward(std::span<const int32_t>(tokens_.data(), 37), st, a, o);
  model_->forward(std::span<const int32_t>(tokens_.data() + 37, tokens_.size() - 37), st, b, o);
  a.insert(a.end(), b.begin(), b.end());
  auto c = compare_logits(a, golden("logits_split.npy"), rows(), V_);
  EXPECT_LT(c.rel, tol());
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] split prefill vs reference: rel %.3e\n", GetParam().c_str(), c.rel);
}

TEST_P(Golden, PrefillAndDecodeAgree) {
  auto p = prefill(k3::AttnPath::Prefill);
  auto d = decode();
  auto c = compare_logits(p, d, rows(), V_);
  EXPECT_LT(c.rel, tol());
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] prefill vs decode (C++): rel %.3e\n", GetParam().c_str(), c.rel);
}

TEST_P(Golden, AbsorbedAndRecurrentFormsInOnePass) {
  // The decode forms (recurrent KDA, absorbed MLA) over all tokens at once equal the prefill forms,
  // and a different chunk size does not change the result.
  auto p = prefill(k3::AttnPath::Prefill, 64);
  auto d = prefill(k3::AttnPath::Decode);
  auto p16 = prefill(k3::AttnPath::Prefill, 16);
  for (const auto& [name, other] : {std::pair{"decode forms", &d}, std::pair{"chunk 16", &p16}}) {
    auto c = compare_logits(*other, p, rows(), V_);
    EXPECT_LT(c.rel, tol()) << name;
    EXPECT_EQ(c.argmax_mismatch, 0) << name;
  }
}

TEST_P(Golden, LastLogitsOnlyMatchesAll) {
  auto st = model_->new_sequence();
  std::vector<float> last;
  model_->forward(tokens_, st, last);  // Auto: prefill form, only the last row
  ASSERT_EQ(static_cast<int64_t>(last.size()), V_);
  auto g = golden("logits_prefill.npy");
  std::vector<float> g_last(g.end() - V_, g.end());
  auto c = compare_logits(last, g_last, 1, V_);
  EXPECT_LT(c.rel, tol());
  EXPECT_EQ(c.argmax_mismatch, 0);
}

TEST_P(Golden, RejectsOutOfRangeTokens) {
  auto st = model_->new_sequence();
  std::vector<float> out;
  std::vector<int32_t> bad = {1, static_cast<int32_t>(V_)};
  EXPECT_THROW(model_->forward(bad, st, out), k3::Error);
  bad = {-1};
  EXPECT_THROW(model_->forward(bad, st, out), k3::Error);
}

INSTANTIATE_TEST_SUITE_P(Tiny, Golden, ::testing::Values("tiny-k3", "tiny-kimi-linear"));

}  // namespace

namespace {

// The trained default model models/k3-tiny (trained weights and activation statistics, trained MXFP4
// experts, 8192 vocab) against k3ref's float64 prefill logits (python/make_goldens.py --trained):
// prefill, and decode token by token against the same file (they agree to 1.4e-15 in float64).
TEST(K3TinyGolden, PrefillAndDecodeMatchReference) {
  auto model = k3::Model::load(k3test::source_path("models/k3-tiny"));
  const auto tokens = k3test::golden_tokens("k3-tiny");
  const auto golden = k3test::golden_logits("k3-tiny", "logits_prefill.npy");
  const int64_t V = model->config().vocab_size, rows = static_cast<int64_t>(tokens.size());
  ASSERT_EQ(static_cast<int64_t>(golden.size()), rows * V);
  auto st = model->new_sequence();
  std::vector<float> prefill, one, decode;
  k3::ForwardOptions o;
  o.all_logits = true;
  o.path = k3::AttnPath::Prefill;
  model->forward(tokens, st, prefill, o);
  auto sd = model->new_sequence();
  for (int32_t t : tokens) {
    model->forward(std::span<const int32_t>(&t, 1), sd, one);
    decode.insert(decode.end(), one.begin(), one.end());
  }
  for (const auto& [name, got] : {std::pair{"prefill", &prefill}, std::pair{"decode", &decode}}) {
    const auto c = k3test::compare_logits(*got, golden, rows, V);
    std::printf("  [k3-tiny] %s vs reference: rel %.3e\n", name, c.rel);
    EXPECT_LT(c.rel, k3test::golden_tolerance("k3-tiny")) << name;
    EXPECT_EQ(c.argmax_mismatch, 0) << name;
  }
}

}  // namespace
