#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "k3/core/error.h"
#include "k3/engine/sampler.h"

using k3::engine::Sampler;
using k3::engine::SamplingParams;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> random_logits(size_t n, uint32_t seed, float scale = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    do x = nd(rng);
    while (x == 0.0f);
  }
  return v;
}

int32_t ref_argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

std::vector<double> ref_softmax(const std::vector<float>& l, double T = 1.0) {
  double m = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp((l[i] - m) / T);
  for (auto& x : p) x /= z;
  return p;
}

// Independent reference of the kept set: full sort, top-k (ties kept), top-p, min-p.
std::set<int32_t> ref_kept(const std::vector<float>& l, const SamplingParams& sp) {
  const size_t V = l.size();
  std::vector<int32_t> ids(V);
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  std::vector<int32_t> kept = ids;
  if (sp.top_k > 0 && static_cast<size_t>(sp.top_k) < V) {
    const float kth = l[ids[sp.top_k - 1]];
    kept.clear();
    for (int32_t t : ids)
      if (l[t] >= kth) kept.push_back(t);
  }
  std::vector<float> sub;
  for (int32_t t : kept) sub.push_back(l[t]);
  auto p = ref_softmax(sub, sp.temperature);  // aligned with kept (descending)
  if (sp.top_p < 1.0f) {
    double cum = 0;
    size_t n = 0;
    while (n < kept.size()) {
      cum += p[n++];
      if (cum >= sp.top_p) break;
    }
    kept.resize(n);
    p.resize(n);
  }
  std::set<int32_t> out;
  const double pmax = p[0];
  for (size_t j = 0; j < kept.size(); ++j)
    if (p[j] >= sp.min_p * pmax) out.insert(kept[j]);
  return out;
}

// Draws n samples (logits copied afresh each time); returns counts per id.
std::vector<int> histogram(const SamplingParams& sp, const std::vector<float>& l, int n, uint64_t seed) {
  Sampler s(sp, seed);
  std::vector<int> counts(l.size(), 0);
  for (int i = 0; i < n; ++i) {
    std::vector<float> x = l;
    int32_t t = s.sample(x, {}, {});
    EXPECT_GE(t, 0);
    EXPECT_LT(t, static_cast<int32_t>(l.size()));
    ++counts[t];
  }
  return counts;
}

double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double chi2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (p[i] == 0) continue;
    const double e = p[i] * n;
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

// Expected distribution restricted to `kept`, at temperature T.
std::vector<double> ref_restricted(const std::vector<float>& l, const std::set<int32_t>& kept, double T) {
  std::vector<float> masked(l.size(), kNegInf);
  for (int32_t t : kept) masked[t] = l[t];
  return ref_softmax(masked, T);
}

}  // namespace

TEST(Sampler, GreedyIsArgmax) {
  SamplingParams sp;
  sp.temperature = 0.0f;
  Sampler s(sp, 123);
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    auto l = random_logits(1000 + seed, seed);
    auto x = l;
    EXPECT_EQ(s.sample(x, {}, {}), ref_argmax(l));
  }
  std::vector<float> tie = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  EXPECT_EQ(s.sample(tie, {}, {}), 1);  // ties -> lowest id
}

// A model vocabulary padded past the tokenizer's: ids the tokenizer cannot render are never drawn,
// greedy or sampled (a dummy-weight K3 behind the k3-tiny tokenizer crashed the server before this).
TEST(Sampler, UntokenizableIdsAreNeverSampled) {
  for (float temp : {0.0f, 1.0f, 5.0f}) {
    SamplingParams sp;
    sp.temperature = temp;
    sp.seed = 3;
    Sampler s(sp, 1);
    for (uint32_t seed = 1; seed <= 100; ++seed) {
      auto l = random_logits(1000, seed);
      for (size_t i = 900; i < l.size(); ++i) l[i] += 50.0f;  // the padded ids score highest
      k3::engine::mask_untokenizable(l, 900);
      const int32_t id = s.sample(l, {}, {});
      EXPECT_LT(id, 900) << "temperature " << temp;
    }
  }
}

TEST(Sampler, TopK1IsGreedy) {
  SamplingParams sp;
  sp.top_k = 1;
  sp.temperature = 1.5f;
  Sampler s(sp, 7);
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    auto l = random_logits(500, seed);
    for (int rep = 0; rep < 10; ++rep) {
      auto x = l;
      EXPECT_EQ(s.sample(x, {}, {}), ref_argmax(l));
    }
  }
}

TEST(Sampler, TemperatureToZeroLimit) {
  for (float T : {1e-3f, 1e-6f, 1e-30f}) {
    SamplingParams sp;
    sp.temperature = T;
    Sampler s(sp, 99);
    int checked = 0;
    for (uint32_t seed = 1; seed <= 40; ++seed) {
      auto l = random_logits(300, seed);
      auto sorted = l;
      std::sort(sorted.rbegin(), sorted.rend());
      if (sorted[0] - sorted[1] < 0.05f) continue;  // exp(-50) at T=1e-3: never drawn
      ++checked;
      for (int rep = 0; rep < 20; ++rep) {
        auto x = l;
        EXPECT_EQ(s.sample(x, {}, {}), ref_argmax(l)) << "T=" << T;
        for (float v : x) EXPECT_FALSE(std::isnan(v));
      }
    }
    EXPECT_GT(checked, 20);
  }
}

TEST(Sampler, SeededReproducibility) {
  auto run = [](std::optional<uint64_t> seed, uint64_t dflt) {
    SamplingParams sp;
    sp.seed = seed;
    sp.top_p = 0.95f;
    Sampler s(sp, dflt);
    std::vector<int32_t> out;
    for (uint32_t step = 0; step < 300; ++step) {
      auto l = random_logits(64, 1000 + step, 1.0f);
      out.push_back(s.sample(l, {}, out));
    }
    return out;
  };
  const auto a = run(42, 1), b = run(42, 2), c = run(43, 1);
  EXPECT_EQ(a, b);  // explicit seed wins over the default
  EXPECT_NE(a, c);
  EXPECT_EQ(run(std::nullopt, 42), a);  // default seed used when none
  EXPECT_NE(run(std::nullopt, 5), a);
}

TEST(Sampler, EmpiricalDistributionMatchesSoftmax) {
  const int N = 20000;
  // 7 degrees of freedom: P(chi2 > 30) ~ 1e-4.
  for (float T : {1.0f, 0.7f, 1.8f}) {
    for (uint32_t seed : {11u, 12u}) {
      auto l = random_logits(8, seed, 1.0f);
      SamplingParams sp;
      sp.temperature = T;
      auto counts = histogram(sp, l, N, seed * 31 + 5);
      auto p = ref_softmax(l, T);
      EXPECT_LT(chi_square(counts, p, N), 30.0) << "T=" << T << " seed=" << seed;
    }
  }
  // Sanity: the bound does reject a wrong distribution (softmax at a different temperature).
  auto l = random_logits(8, 11, 1.0f);
  SamplingParams sp;
  auto counts = histogram(sp, l, N, 3);
  EXPECT_GT(chi_square(counts, ref_softmax(l, 1.3), N), 30.0);
}

TEST(Sampler, TruncationKeepsExactlyTheReferenceSet) {
  struct Case { int top_k; float top_p; float min_p; float T; };
  const Case cases[] = {
      {3, 1.0f, 0.0f, 1.0f},  {5, 1.0f, 0.0f, 0.6f},  {0, 0.7f, 0.0f, 1.0f},
      {-1, 0.5f, 0.0f, 1.4f}, {0, 1.0f, 0.2f, 1.0f},  {0, 1.0f, 0.05f, 2.0f},
      {6, 0.9f, 0.0f, 1.0f},  {4, 0.8f, 0.1f, 0.9f},  {0, 0.85f, 0.15f, 1.0f},
      {0, 1.0f, 1.0f, 1.0f},  {0, 1e-6f, 0.0f, 1.0f}, {8, 1.0f, 0.0f, 1.0f},
  };
  const int N = 20000;
  for (const auto& c : cases) {
    for (uint32_t seed : {21u, 22u, 23u}) {
      SamplingParams sp;
      sp.top_k = c.top_k;
      sp.top_p = c.top_p;
      sp.min_p = c.min_p;
      sp.temperature = c.T;
      auto l = random_logits(8, seed, 1.0f);
      const auto kept = ref_kept(l, sp);
      ASSERT_FALSE(kept.empty());
      SCOPED_TRACE(testing::Message() << "k=" << c.top_k << " p=" << c.top_p << " min_p=" << c.min_p
                                      << " T=" << c.T << " seed=" << seed << " |kept|=" << kept.size());
      // Exact: processed logits are -inf precisely outside the kept set.
      Sampler s(sp, 1);
      auto x = l;
      s.sample(x, {}, {});
      for (int32_t i = 0; i < 8; ++i) EXPECT_EQ(x[i] == kNegInf, !kept.count(i)) << "id " << i;
      // Statistical: excluded ids never drawn; kept ones follow the renormalised distribution.
      auto counts = histogram(sp, l, N, seed);
      for (int32_t i = 0; i < 8; ++i) {
        if (!kept.count(i)) {
          EXPECT_EQ(counts[i], 0) << "id " << i;
        }
      }
      auto p = ref_restricted(l, kept, c.T);
      EXPECT_LT(chi_square(counts, p, N), 30.0);
    }
  }
}

TEST(Sampler, TruncationOnFullVocab) {
  // Vocab-size check of the incremental partial sort and nth_element paths.
  const size_t V = 163840;
  auto l = random_logits(V, 77, 1.5f);
  struct Case { int top_k; float top_p; float min_p; };
  for (const Case c : {Case{50, 1.0f, 0.0f}, Case{0, 0.9f, 0.0f}, Case{0, 0.3f, 0.0f},
                       Case{1000, 0.95f, 0.0f}, Case{0, 1.0f, 0.01f}, Case{40, 0.8f, 0.3f}}) {
    SamplingParams sp;
    sp.top_k = c.top_k;
    sp.top_p = c.top_p;
    sp.min_p = c.min_p;
    const auto kept = ref_kept(l, sp);
    Sampler s(sp, 5);
    for (int rep = 0; rep < 3; ++rep) {
      auto x = l;
      const int32_t t = s.sample(x, {}, {});
      EXPECT_TRUE(kept.count(t));
      size_t n_kept = 0;
      for (size_t i = 0; i < V; ++i) {
        const bool k = x[i] != kNegInf;
        n_kept += k;
        if (k != static_cast<bool>(kept.count(static_cast<int32_t>(i)))) {
          ADD_FAILURE() << "id " << i << " k=" << c.top_k << " p=" << c.top_p;
          break;
        }
      }
      EXPECT_EQ(n_kept, kept.size());
    }
  }
}

TEST(Sampler, TopKKeepsTies) {
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 2.0f, 0.5f, 2.0f};
  SamplingParams sp;
  sp.top_k = 2;
  Sampler s(sp, 1);
  auto x = l;
  s.sample(x, {}, {});
  for (int i : {0, 4}) EXPECT_EQ(x[i], kNegInf);
  for (int i : {1, 2, 3, 5}) EXPECT_NE(x[i], kNegInf);
}

TEST(Sampler, RepetitionPenaltyFormula) {
  auto l = random_logits(100, 5);
  SamplingParams sp;
  sp.repetition_penalty = 1.3f;
  const std::vector<int32_t> prompt = {3, 7, 7, 10, 50};
  const std::vector<int32_t> gen = {10, 20, 99, 20};
  std::set<int32_t> seen(prompt.begin(), prompt.end());
  seen.insert(gen.begin(), gen.end());
  auto x = l;
  Sampler::apply_penalties(x, prompt, gen, sp);
  bool saw_pos = false, saw_neg = false;
  for (int32_t i = 0; i < 100; ++i) {
    float e = l[i];
    if (seen.count(i)) {
      e = l[i] > 0 ? l[i] / 1.3f : l[i] * 1.3f;
      (l[i] > 0 ? saw_pos : saw_neg) = true;
    }
    EXPECT_FLOAT_EQ(x[i], e) << i;
  }
  EXPECT_TRUE(saw_pos && saw_neg);  // both branches exercised
}

TEST(Sampler, PresenceAndFrequencyPenaltyFormula) {
  auto l = random_logits(100, 6);
  const std::vector<int32_t> prompt = {1, 2, 3, 4};  // prompt never counts for these
  const std::vector<int32_t> gen = {4, 5, 5, 5, 9, 4, 60};
  std::vector<int> cnt(100, 0);
  for (int32_t t : gen) ++cnt[t];
  for (auto [pres, freq] : {std::pair{0.7f, 0.0f}, std::pair{0.0f, 0.4f}, std::pair{-1.5f, 1.1f}}) {
    SamplingParams sp;
    sp.presence_penalty = pres;
    sp.frequency_penalty = freq;
    auto x = l;
    Sampler::apply_penalties(x, prompt, gen, sp);
    for (int32_t i = 0; i < 100; ++i)
      EXPECT_NEAR(x[i], l[i] - freq * cnt[i] - (cnt[i] > 0 ? pres : 0.0f), 1e-5f) << i;
  }
}

TEST(Sampler, PenaltiesCombinedOrder) {
  // Repetition first (on prompt ∪ generated), then presence/frequency (generated only).
  std::vector<float> l = {2.0f, -1.0f, 0.5f, 3.0f};
  SamplingParams sp;
  sp.repetition_penalty = 2.0f;
  sp.presence_penalty = 0.5f;
  sp.frequency_penalty = 0.25f;
  const std::vector<int32_t> prompt = {0};
  const std::vector<int32_t> gen = {1, 1, 3};
  auto x = l;
  Sampler::apply_penalties(x, prompt, gen, sp);
  EXPECT_FLOAT_EQ(x[0], 1.0f);                       // 2 / 2
  EXPECT_FLOAT_EQ(x[1], -2.0f - 0.5f - 0.5f);        // -1 * 2, then -0.5 - 2*0.25
  EXPECT_FLOAT_EQ(x[2], 0.5f);                       // untouched
  EXPECT_FLOAT_EQ(x[3], 1.5f - 0.5f - 0.25f);        // 3 / 2, then -0.5 - 0.25
  // sample() applies them: greedy flips away from a heavily penalised argmax.
  SamplingParams g;
  g.temperature = 0;
  g.presence_penalty = 2.0f;
  Sampler s(g, 1);
  std::vector<float> y = {1.0f, 2.5f, 1.5f};
  EXPECT_EQ(s.sample(y, {}, std::vector<int32_t>{1}), 2);
  // Repeated calls reuse scratch state correctly.
  std::vector<float> z = {1.0f, 2.5f, 1.5f};
  EXPECT_EQ(s.sample(z, {}, std::vector<int32_t>{2}), 1);
}

TEST(Sampler, BadInputsThrow) {
  SamplingParams sp;
  sp.repetition_penalty = 1.2f;
  Sampler s(sp, 1);
  std::vector<float> l = {1.0f, 2.0f};
  EXPECT_THROW(s.sample(l, std::vector<int32_t>{2}, {}), k3::Error);
  std::vector<float> e;
  EXPECT_THROW(s.sample(e, {}, {}), k3::Error);
  std::vector<float> n = {1.0f, std::nanf("")};
  EXPECT_THROW(s.sample(n, {}, {}), k3::Error);
  std::vector<float> all_masked = {kNegInf, kNegInf};
  EXPECT_THROW(s.sample(all_masked, {}, {}), k3::Error);
  // -inf entries are fine (masked tokens) and are never drawn.
  Sampler t(SamplingParams{}, 3);
  for (int i = 0; i < 200; ++i) {
    std::vector<float> m = {kNegInf, 0.3f, kNegInf, 0.2f};
    const int32_t id = t.sample(m, {}, {});
    EXPECT_TRUE(id == 1 || id == 3);
  }
}

TEST(Sampler, Logprobs) {
  auto l = random_logits(1000, 8);
  auto p = ref_softmax(l);
  double total = 0;
  for (int32_t i = 0; i < 1000; ++i) {
    const float lp = Sampler::logprob_of(l, i);
    EXPECT_NEAR(lp, std::log(p[i]), 1e-4) << i;
    total += std::exp(static_cast<double>(lp));
  }
  EXPECT_NEAR(total, 1.0, 1e-5);
  auto top = Sampler::top_logprobs(l, 5);
  ASSERT_EQ(top.size(), 5u);
  std::vector<int32_t> ids(1000);
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(top[j].first, ids[j]);
    EXPECT_NEAR(top[j].second, std::log(p[ids[j]]), 1e-4);
  }
  EXPECT_TRUE(Sampler::top_logprobs(l, 0).empty());
  EXPECT_EQ(Sampler::top_logprobs(std::vector<float>{1.f, 2.f}, 10).size(), 2u);
  EXPECT_THROW(Sampler::logprob_of(l, 1000), k3::Error);
  EXPECT_THROW(Sampler::logprob_of(l, -1), k3::Error);
}

TEST(SamplingParams, Validate) {
  EXPECT_NO_THROW(SamplingParams{}.validate());
  auto expect_bad = [](auto mutate, const char* field) {
    SamplingParams sp;
    mutate(sp);
    try {
      sp.validate();
      ADD_FAILURE() << "no error for " << field;
    } catch (const k3::Error& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
    EXPECT_THROW(Sampler(sp, 0), k3::Error);
  };
  auto expect_ok = [](auto mutate) {
    SamplingParams sp;
    mutate(sp);
    EXPECT_NO_THROW(sp.validate());
  };
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  expect_bad([](SamplingParams& s) { s.temperature = -0.1f; }, "temperature");
  expect_bad([&](SamplingParams& s) { s.temperature = nan; }, "temperature");
  expect_bad([&](SamplingParams& s) { s.temperature = inf; }, "temperature");
  expect_bad([](SamplingParams& s) { s.top_k = -2; }, "top_k");
  expect_bad([](SamplingParams& s) { s.top_p = 0.0f; }, "top_p");
  expect_bad([](SamplingParams& s) { s.top_p = 1.01f; }, "top_p");
  expect_bad([&](SamplingParams& s) { s.top_p = nan; }, "top_p");
  expect_bad([](SamplingParams& s) { s.min_p = -0.01f; }, "min_p");
  expect_bad([](SamplingParams& s) { s.min_p = 1.5f; }, "min_p");
  expect_bad([](SamplingParams& s) { s.repetition_penalty = 0.0f; }, "repetition_penalty");
  expect_bad([&](SamplingParams& s) { s.repetition_penalty = inf; }, "repetition_penalty");
  expect_bad([](SamplingParams& s) { s.presence_penalty = 2.5f; }, "presence_penalty");
  expect_bad([](SamplingParams& s) { s.presence_penalty = -2.01f; }, "presence_penalty");
  expect_bad([&](SamplingParams& s) { s.frequency_penalty = nan; }, "frequency_penalty");
  expect_bad([](SamplingParams& s) { s.frequency_penalty = -3.0f; }, "frequency_penalty");
  expect_bad([](SamplingParams& s) { s.max_tokens = -1; }, "max_tokens");
  expect_bad([](SamplingParams& s) { s.stop = {"ok", ""}; }, "stop");
  expect_bad([](SamplingParams& s) { s.stop_token_ids = {5, -3}; }, "stop_token_ids");
  expect_ok([](SamplingParams& s) { s.temperature = 0.0f; });
  expect_ok([](SamplingParams& s) { s.top_k = -1; });
  expect_ok([](SamplingParams& s) { s.top_p = 1.0f; s.min_p = 1.0f; });
  expect_ok([](SamplingParams& s) { s.presence_penalty = -2.0f; s.frequency_penalty = 2.0f; });
  expect_ok([](SamplingParams& s) { s.repetition_penalty = 0.5f; s.max_tokens = 0; });
}

// ---- sampling::sample_row (the algorithm shared with the GPU kernel) ----

namespace {
k3::sampling::RowSampling row_params(float T, int k, float p, double u) {
  k3::sampling::RowSampling r;
  r.temperature = T;
  r.top_k = k;
  r.top_p = p;
  r.u = u;
  return r;
}
}  // namespace

// The draw walks the survivors in id order: u's position in [0, 1) maps to the ids' probability
// intervals laid end to end by id (also after top-p, which sorts by probability to choose the set).
TEST(SampleRow, DrawWalksSurvivorsInIdOrder) {
  const std::vector<float> l = {0.3f, 2.0f, -1.0f, 1.2f, 1.9f, 0.0f};
  for (float top_p : {1.0f, 0.8f}) {
    SamplingParams sp;
    sp.top_p = top_p;
    const auto kept = ref_kept(l, sp);  // float64 reference set
    auto p = ref_restricted(l, kept, 1.0);
    double lo = 0;
    for (int32_t id = 0; id < 6; ++id) {
      if (!kept.count(id)) continue;
      const double mid = lo + p[static_cast<size_t>(id)] / 2;
      auto x = l;
      const auto r = k3::sampling::sample_row(x, row_params(1.0f, 0, top_p, mid));
      EXPECT_EQ(r.status, k3::sampling::SampleStatus::Ok);
      EXPECT_EQ(r.token, id) << "top_p=" << top_p << " u=" << mid;
      lo += p[static_cast<size_t>(id)];
    }
    EXPECT_NEAR(lo, 1.0, 1e-12);
  }
}

TEST(SampleRow, ErrorsAreStatusesWithTheOffendingId) {
  using k3::sampling::SampleStatus;
  std::vector<float> l = {0.5f, 1.0f, 0.2f, 0.1f};
  auto x = l;
  x[2] = std::nanf("");
  x[3] = std::nanf("");
  auto r = k3::sampling::sample_row(x, row_params(1.0f, 0, 1.0f, 0.5));
  EXPECT_EQ(r.status, SampleStatus::NaN);
  EXPECT_EQ(r.at, 2);
  x = l;
  x[1] = std::numeric_limits<float>::infinity();
  r = k3::sampling::sample_row(x, row_params(0.0f, 0, 1.0f, 0.5));
  EXPECT_EQ(r.status, SampleStatus::PosInf);
  EXPECT_EQ(r.at, 1);
  x = l;
  auto masked = row_params(1.0f, 0, 1.0f, 0.5);
  masked.n_tokenizable = 0;
  EXPECT_EQ(k3::sampling::sample_row(x, masked).status, SampleStatus::AllMasked);
  x = l;
  auto bad = row_params(1.0f, 0, 1.0f, 0.5);
  bad.repetition_penalty = 1.5f;
  const std::vector<int32_t> ids = {1, 4};
  bad.repetition_ids = ids;
  r = k3::sampling::sample_row(x, bad);
  EXPECT_EQ(r.status, SampleStatus::BadId);
  EXPECT_EQ(r.at, 4);
  // Masking alone: the greedy pick skips ids >= n_tokenizable.
  x = l;
  auto part = row_params(0.0f, 0, 1.0f, 0.0);
  part.n_tokenizable = 1;
  r = k3::sampling::sample_row(x, part);
  EXPECT_EQ(r.status, SampleStatus::Ok);
  EXPECT_EQ(r.token, 0);
}

TEST(SampleRow, FixedPointWeights) {
  EXPECT_EQ(k3::sampling::fixed_point_bits(163840), 44);  // 2^18 ids x 2^44 < 2^62
  EXPECT_EQ(k3::sampling::fixed_point_bits(8192), 49);
  EXPECT_EQ(k3::sampling::fixed_point_bits(2), 52);
  EXPECT_EQ(k3::sampling::fixed_weight(1.0f, 44), uint64_t{1} << 44);
  EXPECT_EQ(k3::sampling::fixed_weight(0.5f, 44), uint64_t{1} << 43);
  EXPECT_EQ(k3::sampling::top_p_target(0.5f, 10), 5u);
  EXPECT_EQ(k3::sampling::top_p_target(0.51f, 10), 6u);  // ceil
  EXPECT_EQ(k3::sampling::draw_position(std::nextafter(1.0, 0.0), 10), 9u);
  EXPECT_EQ(k3::sampling::draw_position(0.0, 10), 0u);
}

namespace {

// The greedy pick against the definition, written out here: the first index of the maximum, the first
// NaN's index as the error, +inf as PosInf at its first index, all -inf as AllMasked. Rows of every length
// 1..70 (the eight-lane body and its tail) and of a real vocabulary, with planted ties (in the body, in the
// tail, across both), NaNs, +inf and -inf runs, so a lane-order or tail bug in the vectorised argmax shows.
TEST(SampleRow, GreedyPickMatchesTheScalarDefinition) {
  using k3::sampling::SampleStatus;
  std::mt19937 rng(29);
  auto reference = [](const std::vector<float>& x) -> std::pair<SampleStatus, int32_t> {
    float m = kNegInf;
    int32_t arg = -1;
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isnan(x[i])) return {SampleStatus::NaN, static_cast<int32_t>(i)};
      if (x[i] > m) {
        m = x[i];
        arg = static_cast<int32_t>(i);
      }
    }
    if (arg < 0) return {SampleStatus::AllMasked, -1};
    if (std::isinf(m)) return {SampleStatus::PosInf, arg};
    return {SampleStatus::Ok, arg};
  };
  int checked = 0;
  std::vector<size_t> lengths;
  for (size_t n = 1; n <= 70; ++n) lengths.push_back(n);
  lengths.push_back(163840);
  for (size_t n : lengths)
    for (int variant = 0; variant < 8; ++variant) {
      std::vector<float> x = random_logits(n, static_cast<uint32_t>(n * 8 + variant));
      std::uniform_int_distribution<size_t> pos(0, n - 1);
      const float top = 100.0f;
      if (variant == 1 || variant == 2) {  // ties of the maximum: two places, maybe both in the body or the tail
        x[pos(rng)] = top;
        x[pos(rng)] = top;
      }
      if (variant == 3) x[pos(rng)] = std::nanf("");
      if (variant == 4) x[pos(rng)] = std::numeric_limits<float>::infinity();
      if (variant == 5) std::fill(x.begin(), x.end(), kNegInf);
      if (variant == 6) {  // -inf everywhere but one value, and signed zeros as the maximum
        std::fill(x.begin(), x.end(), kNegInf);
        x[pos(rng)] = -0.0f;
        x[pos(rng)] = 0.0f;
      }
      if (variant == 7) x.back() = top;  // the maximum in the tail
      const auto [want_status, want] = reference(x);
      auto row = x;
      const auto r = k3::sampling::sample_row(row, row_params(0.0f, 0, 1.0f, 0.0));
      ASSERT_EQ(r.status, want_status) << "n " << n << " variant " << variant;
      if (want_status == SampleStatus::Ok) {
        EXPECT_EQ(r.token, want) << "n " << n << " variant " << variant;
      }
      if (want_status == SampleStatus::NaN || want_status == SampleStatus::PosInf) {
        EXPECT_EQ(r.at, want) << "n " << n << " variant " << variant;
      }
      ++checked;
    }
  EXPECT_EQ(checked, 71 * 8);
}

}  // namespace
