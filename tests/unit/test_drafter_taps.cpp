// Taps (ForwardOptions::tap_layers; docs/block-drafter.md): the target's hidden vectors a block drafter
// reads, returned with the logits rows. Checked on k3-tiny against host float64 recomputations of what
// each tap id means (the final tap is lm_head's input: lm_head applied to it reproduces the logits; tap 0 is
// layer 0's normed mixer input: rms(embedding) * input_layernorm), for consistency across the ways a
// sequence can run (whole prompt vs token by token, prefill vs decode forms, forward_sample vs
// forward_batch), and for errors on bad tap ids. The Python golden of every tap id: test_drafter_golden.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/model/model.h"
#include "test_util.h"

namespace {

k3::Model& tiny() {
  static auto m = k3::Model::load(k3test::source_path("models/k3-tiny"));
  return *m;
}

// A fixed sequence of distinct-ish ids (never all the same: repeated ids route to the same experts).
std::vector<int32_t> sequence(int64_t n, int64_t V) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((7919 * i + 31) % V));
  return t;
}

struct Out {
  std::vector<float> logits, taps;
};

// One forward of `tokens` appended to `cache`, every row's logits and taps.
Out run_all(const std::vector<int32_t>& tokens, k3::SequenceCache& cache, std::span<const int32_t> ids, k3::AttnPath path) {
  Out r;
  k3::ForwardOptions fo;
  fo.path = path;
  fo.all_logits = true;
  fo.tap_layers = ids;
  fo.taps = &r.taps;
  tiny().forward_batch({k3::BatchItem{tokens, &cache, true}}, r.logits, fo);
  return r;
}

// max |a - b| / max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / std::max(den, 1e-30);
}

TEST(Taps, FinalTapIsTheLmHeadInputAndTapZeroTheFirstNormedInput) {
  const k3::Model& m = tiny();
  const auto& c = m.config();
  const int64_t H = c.hidden_size, V = c.vocab_size, n = 12;
  const std::vector<int32_t> tokens = sequence(n, V);
  const std::vector<int32_t> ids{static_cast<int32_t>(c.num_layers), 0, 5};
  auto cache = m.new_cache();
  const Out r = run_all(tokens, *cache, ids, k3::AttnPath::Decode);
  ASSERT_EQ(r.taps.size(), static_cast<size_t>(n * 3 * H));
  std::vector<float> w(static_cast<size_t>(H)), head(static_cast<size_t>(V * H));
  for (int64_t v = 0; v < V; ++v) k3::cpu::dequant_row(m.weights().lm_head, v, head.data() + v * H);
  double err_head = 0, err_tap0 = 0, scale_head = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* fin = r.taps.data() + (t * 3 + 0) * H;
    for (int64_t v = 0; v < V; ++v) {  // lm_head . final tap, in float64
      double dot = 0;
      for (int64_t d = 0; d < H; ++d) dot += static_cast<double>(head[static_cast<size_t>(v * H + d)]) * fin[d];
      err_head = std::max(err_head, std::abs(dot - r.logits[static_cast<size_t>(t * V + v)]));
      scale_head = std::max(scale_head, std::abs(dot));
    }
    // Tap 0: rms(embed[token]) * input_layernorm of layer 0 (no Attention-Residual block before layer 0).
    k3::cpu::dequant_row(m.weights().embed, tokens[static_cast<size_t>(t)], w.data());
    double ss = 0;
    for (float x : w) ss += static_cast<double>(x) * x;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(H) + c.rms_norm_eps);
    const float* tap0 = r.taps.data() + (t * 3 + 1) * H;
    for (int64_t d = 0; d < H; ++d) {
      const double want = w[static_cast<size_t>(d)] * inv * m.weights().layers[0].input_norm[static_cast<size_t>(d)];
      err_tap0 = std::max(err_tap0, std::abs(want - tap0[d]) / (1.0 + std::abs(want)));
    }
  }
  std::printf("  lm_head(final tap) vs logits: max |diff| %.3e (logits up to %.2f); tap 0: %.3e\n", err_head, scale_head, err_tap0);
  EXPECT_LT(err_head / scale_head, 2e-5);  // fp32 GEMM over bf16 weights vs float64: ~1e-6 measured
  EXPECT_LT(err_tap0, 2e-6);
  // The three taps differ (a tap id mixed up with another would not).
  EXPECT_GT(std::abs(r.taps[0] - r.taps[static_cast<size_t>(H)]) + std::abs(r.taps[static_cast<size_t>(H)] - r.taps[static_cast<size_t>(2 * H)]), 1e-3);
}

TEST(Taps, WholeSequenceEqualsTokenByTokenAndPrefillForm) {
  const k3::Model& m = tiny();
  const auto& c = m.config();
  const int64_t n = 16;
  const std::vector<int32_t> tokens = sequence(n, c.vocab_size);
  std::vector<int32_t> ids;
  for (int32_t l = 0; l <= c.num_layers; ++l) ids.push_back(l);  // every tap id
  auto whole_cache = m.new_cache();
  const Out whole = run_all(tokens, *whole_cache, ids, k3::AttnPath::Decode);
  std::vector<float> steps;
  auto step_cache = m.new_cache();
  for (int64_t t = 0; t < n; ++t) {
    const Out r = run_all(std::vector<int32_t>{tokens[static_cast<size_t>(t)]}, *step_cache, ids, k3::AttnPath::Decode);
    steps.insert(steps.end(), r.taps.begin(), r.taps.end());
  }
  // The decode forms are batch- and split-invariant on the CPU: bit for bit.
  EXPECT_EQ(whole.taps, steps);
  auto pre_cache = m.new_cache();
  const Out pre = run_all(tokens, *pre_cache, ids, k3::AttnPath::Prefill);
  const double rel = rel_diff(pre.taps, whole.taps);
  std::printf("  prefill form vs decode form taps: rel %.3e\n", rel);
  EXPECT_LT(rel, 1e-4);  // chunked KDA and MHA MLA round differently
  EXPECT_GT(rel, 0.0);   // ... so a zero difference would mean the prefill form was not run
}

TEST(Taps, ForwardSampleReturnsTheTapsOfItsRows) {
  const k3::Model& m = tiny();
  const auto& c = m.config();
  const std::vector<int32_t> a = sequence(9, c.vocab_size), b{5, 77, 901};
  const std::vector<int32_t> ids{3, static_cast<int32_t>(c.num_layers)};
  // Reference: every row of each sequence alone.
  auto ca = m.new_cache(), cb = m.new_cache();
  const Out ra = run_all(a, *ca, ids, k3::AttnPath::Decode), rb = run_all(b, *cb, ids, k3::AttnPath::Decode);
  const size_t row = static_cast<size_t>(ids.size() * c.hidden_size);
  // Batched: a's last 3 rows (a verification step's shape), b's last row.
  auto ca2 = m.new_cache(), cb2 = m.new_cache();
  k3::BatchItem ia{a, ca2.get(), true}, ib{b, cb2.get(), true};
  ia.n_logit_rows = 3;
  {
    std::vector<k3::RowSample> rows(4);
    for (auto& r : rows) r.sampling.temperature = 0.0f;
    std::vector<k3::sampling::SampleResult> res;
    std::vector<float> raw, taps;
    k3::ForwardOptions fo;
    fo.path = k3::AttnPath::Decode;
    fo.tap_layers = ids;
    fo.taps = &taps;
    m.forward_sample({ia, ib}, rows, res, raw, fo);
    ASSERT_EQ(taps.size(), 4 * row);
    std::vector<float> want(ra.taps.end() - static_cast<long>(3 * row), ra.taps.end());
    want.insert(want.end(), rb.taps.end() - static_cast<long>(row), rb.taps.end());
    EXPECT_EQ(taps, want);
  }
}

TEST(Taps, BadTapIdsAreErrors) {
  const k3::Model& m = tiny();
  const int32_t L = static_cast<int32_t>(m.config().num_layers);
  const std::vector<int32_t> tokens{1, 2, 3};
  std::vector<float> logits, taps;
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{-1}, std::vector<int32_t>{L + 1}, std::vector<int32_t>{0, 1 << 20}}) {
    auto cache = m.new_cache();
    k3::ForwardOptions fo;
    fo.tap_layers = ids;
    fo.taps = &taps;
    EXPECT_THROW(m.forward_batch({k3::BatchItem{tokens, cache.get(), true}}, logits, fo), k3::Error);
    EXPECT_EQ(cache->n_past(), 0) << "a failed forward must leave the cache as it was";
  }
  auto cache = m.new_cache();
  const std::vector<int32_t> ok{L};
  k3::ForwardOptions fo;
  fo.tap_layers = ok;  // no place for them
  EXPECT_THROW(m.forward_batch({k3::BatchItem{tokens, cache.get(), true}}, logits, fo), k3::Error);
  EXPECT_TRUE(m.supports_taps());
}

}  // namespace
