// End-to-end logits of the C++ CPU forward pass against the PyTorch reference's goldens
// (python/make_goldens.py, computed in float64) on tiny random checkpoints in the real schema.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/core/npy.h"
#include "k3/model/model.h"
#include "test_util.h"

namespace {

struct Compare {
  double rel = 0;      // max |a-b| / max |b|
  int argmax_mismatch = 0;
};

Compare compare(const std::vector<float>& a, const std::vector<float>& b, int64_t rows, int64_t V) {
  double md = 0, mr = 0;
  Compare c;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t ia = 0, ib = 0;
    for (int64_t v = 0; v < V; ++v) {
      const size_t i = static_cast<size_t>(r * V + v);
      md = std::max(md, static_cast<double>(std::fabs(a[i] - b[i])));
      mr = std::max(mr, static_cast<double>(std::fabs(b[i])));
      if (a[i] > a[static_cast<size_t>(r * V + ia)]) ia = v;
      if (b[i] > b[static_cast<size_t>(r * V + ib)]) ib = v;
    }
    c.argmax_mismatch += ia != ib;
  }
  c.rel = md / mr;
  return c;
}

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
    auto st = model_->new_sequence();
    std::vector<float> out;
    k3::ForwardOptions o;
    o.all_logits = true;
    o.path = path;
    o.kda_chunk = chunk;
    model_->forward(tokens_, st, out, o);
    return out;
  }
  std::vector<float> decode() {
    auto st = model_->new_sequence();
    std::vector<float> all, out;
    for (int32_t t : tokens_) {
      model_->forward(std::span<const int32_t>(&t, 1), st, out);
      all.insert(all.end(), out.begin(), out.end());
    }
    EXPECT_EQ(st.n_past(), static_cast<int64_t>(tokens_.size()));
    return all;
  }
  int64_t rows() const { return static_cast<int64_t>(tokens_.size()); }

  std::unique_ptr<k3::Model> model_;
  std::string gdir_;
  std::vector<int32_t> tokens_;
  int64_t V_ = 0;
};

constexpr double kTol = 1e-3;  // max |diff| / max |ref|, fp32 vs float64 reference

TEST_P(Golden, PrefillMatchesReference) {
  auto c = compare(prefill(k3::AttnPath::Prefill), golden("logits_prefill.npy"), rows(), V_);
  EXPECT_LT(c.rel, kTol);
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] prefill vs reference: rel %.3g\n", GetParam().c_str(), c.rel);
}

TEST_P(Golden, DecodeMatchesReference) {
  auto c = compare(decode(), golden("logits_decode.npy"), rows(), V_);
  EXPECT_LT(c.rel, kTol);
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] decode vs reference: rel %.3g\n", GetParam().c_str(), c.rel);
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
  auto c = compare(a, golden("logits_split.npy"), rows(), V_);
  EXPECT_LT(c.rel, kTol);
  EXPECT_EQ(c.argmax_mismatch, 0);
}

TEST_P(Golden, PrefillAndDecodeAgree) {
  auto p = prefill(k3::AttnPath::Prefill);
  auto d = decode();
  auto c = compare(p, d, rows(), V_);
  EXPECT_LT(c.rel, kTol);
  EXPECT_EQ(c.argmax_mismatch, 0);
  std::printf("  [%s] prefill vs decode (C++): rel %.3g\n", GetParam().c_str(), c.rel);
}

TEST_P(Golden, AbsorbedAndRecurrentFormsInOnePass) {
  // The decode forms (recurrent KDA, absorbed MLA) over all tokens at once equal the prefill forms,
  // and a different chunk size does not change the result.
  auto p = prefill(k3::AttnPath::Prefill, 64);
  auto d = prefill(k3::AttnPath::Decode);
  auto p16 = prefill(k3::AttnPath::Prefill, 16);
  EXPECT_LT(compare(d, p, rows(), V_).rel, kTol);
  EXPECT_LT(compare(p16, p, rows(), V_).rel, kTol);
}

TEST_P(Golden, LastLogitsOnlyMatchesAll) {
  auto st = model_->new_sequence();
  std::vector<float> last;
  model_->forward(tokens_, st, last);  // Auto: prefill form, only the last row
  ASSERT_EQ(static_cast<int64_t>(last.size()), V_);
  auto g = golden("logits_prefill.npy");
  std::vector<float> g_last(g.end() - V_, g.end());
  EXPECT_LT(compare(last, g_last, 1, V_).rel, kTol);
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
