// Token masks and logit_bias in the sampler (sampling::sample_row, engine::Sampler): a forbidden id is
// never drawn, even at temperature 2 over thousands of draws; ids past the mask's words are forbidden;
// logit_bias moves the argmax (and -100 bans an id); a bad bias id is a BadId status, not a crash.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "k3/core/error.h"
#include "k3/engine/sampler.h"
#include "k3/sampling/token_sampling.h"

namespace {

using k3::sampling::RowSampling;
using k3::sampling::SampleStatus;

std::vector<float> logits_of(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

TEST(TokenConstraints, ForbiddenIdIsNeverSampledAtTemperature2) {
  const size_t V = 1000;
  const std::set<int32_t> allowed_ids = {3, 500, 999};
  std::vector<uint32_t> mask((V + 31) / 32, 0);
  for (int32_t id : allowed_ids) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
  std::vector<float> base = logits_of(V, 7);
  for (size_t i = 0; i < V; ++i)
    if (!allowed_ids.count(static_cast<int32_t>(i))) base[i] += 20.0f;  // the forbidden ones are far likelier
  std::mt19937_64 rng(1);
  std::set<int32_t> seen;
  for (int draw = 0; draw < 3000; ++draw) {
    RowSampling r;
    r.temperature = 2.0f;
    r.allowed = mask;
    r.u = std::uniform_real_distribution<double>(0, 1)(rng);
    std::vector<float> x = base;
    const auto res = k3::sampling::sample_row(x, r);
    ASSERT_EQ(res.status, SampleStatus::Ok);
    ASSERT_TRUE(allowed_ids.count(res.token)) << "draw " << draw << " picked forbidden id " << res.token;
    seen.insert(res.token);
  }
  EXPECT_EQ(seen.size(), allowed_ids.size());  // the draw still varies over what is allowed
}

TEST(TokenConstraints, IdsPastTheMaskAreForbiddenAndAnEmptyMaskIsAllMasked) {
  std::vector<float> x(100, 0.0f);
  x[90] = 50.0f;
  const std::vector<uint32_t> one_word = {1u << 5};  // covers ids 0..31: only 5 allowed
  RowSampling r;
  r.temperature = 0.0f;
  r.allowed = one_word;
  EXPECT_EQ(k3::sampling::sample_row(x, r).token, 5);
  const std::vector<uint32_t> none = {0u, 0u, 0u, 0u};
  std::vector<float> y(100, 1.0f);
  r.allowed = none;
  EXPECT_EQ(k3::sampling::sample_row(y, r).status, SampleStatus::AllMasked);
}

TEST(TokenConstraints, LogitBiasMovesTheArgmax) {
  std::vector<float> base = logits_of(500, 3);
  const auto argmax = [](const std::vector<float>& l) {
    return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
  };
  const int32_t top = argmax(base);
  const int32_t other = top == 7 ? 8 : 7;
  k3::engine::SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias_ids = {other};
  p.logit_bias_values = {100.0f};
  k3::engine::Sampler s(p, 0);
  std::vector<float> x = base;
  EXPECT_EQ(s.sample(x, {}, {}), other);
  // -100 on the argmax: the runner-up wins.
  p.logit_bias_ids = {top};
  p.logit_bias_values = {-100.0f};
  std::vector<float> without_top = base;
  without_top[static_cast<size_t>(top)] = -1e30f;
  k3::engine::Sampler s2(p, 0);
  x = base;
  EXPECT_EQ(s2.sample(x, {}, {}), argmax(without_top));
}

TEST(TokenConstraints, BadBiasIdsAndValuesAreRefused) {
  std::vector<float> x(10, 0.0f);
  const std::vector<int32_t> ids = {12};
  const std::vector<float> vals = {1.0f};
  RowSampling r;
  r.bias_ids = ids;
  r.bias_values = vals;
  const auto res = k3::sampling::sample_row(x, r);
  EXPECT_EQ(res.status, SampleStatus::BadId);
  EXPECT_EQ(res.at, 12);
  k3::engine::SamplingParams p;
  p.logit_bias_ids = {1};
  p.logit_bias_values = {101.0f};
  EXPECT_THROW(p.validate(), k3::Error);
  p.logit_bias_values = {NAN};
  EXPECT_THROW(p.validate(), k3::Error);
  p.logit_bias_ids = {2, 1};
  p.logit_bias_values = {0.0f, 0.0f};
  EXPECT_THROW(p.validate(), k3::Error);
}

}  // namespace
