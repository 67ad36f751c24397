// The 8-lane exp / tanh / sigmoid of vec_math.h against the exact functions (long double libm), on random
// inputs over the whole float range (uniform in value near the interesting region, uniform in bit
// pattern over everything) and the special values; the bounds are the ones vec_math.h states.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "k3/backend/cpu/vec_math.h"
#include "kernel_test_util.h"

namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<float> inputs(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x;
  std::uniform_real_distribution<float> near(-12.f, 12.f), wide(-120.f, 100.f), tiny(-1.f, 1.f);
  for (int i = 0; i < 200000; ++i) x.push_back(near(rng));
  for (int i = 0; i < 200000; ++i) x.push_back(wide(rng));
  for (int i = 0; i < 50000; ++i) x.push_back(tiny(rng) * std::ldexp(1.f, -static_cast<int>(rng() % 140)));
  for (int i = 0; i < 200000; ++i) {  // any finite bit pattern
    uint32_t b = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &b, 4);
    if (std::isfinite(f)) x.push_back(f);
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (float s : {0.f, -0.f, inf, -inf, FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, 88.72283f, 88.72284f, 88.7229f, 89.f,
                  -87.33654f, -87.4f, -103.9f, -103.98f, -104.f, -104.5f, -150.f, 0.55f, -0.55f, 0.5499999f, 9.f, 9.2f,
                  44.f, 45.f, 1e-30f, -1e-30f, 1e-45f})
    x.push_back(s);
  return x;
}

template <typename F>
std::vector<float> apply(const std::vector<float>& x, F fn) {
  std::vector<float> y(x.size());
  size_t i = 0;
  for (; i + 8 <= x.size(); i += 8) _mm256_storeu_ps(y.data() + i, fn(_mm256_loadu_ps(x.data() + i)));
  for (; i < x.size(); ++i) {  // the last few one lane at a time
    alignas(32) float b[8] = {x[i]};
    _mm256_store_ps(b, fn(_mm256_load_ps(b)));
    y[i] = b[0];
  }
  return y;
}

TEST(VecMath, Exp8WithinStatedBound) {
  const auto x = inputs(1);
  const auto y = apply(x, [](__m256 v) { return k3::cpu::exp8(v); });
  k3test::Worst worst("exp8 (units of 2^-24 relative)");
  for (size_t i = 0; i < x.size(); ++i) {
    const long double want = std::exp(static_cast<long double>(x[i]));
    if (want > FLT_MAX) {
      ASSERT_TRUE(std::isinf(y[i]) && y[i] > 0) << x[i] << " -> " << y[i];
    } else if (want >= FLT_MIN) {
      const double rel = static_cast<double>(std::fabs(y[i] - want) / want);
      ASSERT_LE(rel, 4 * kU) << "x " << x[i] << " got " << y[i] << " want " << static_cast<double>(want);
      worst.add(rel / kU);
    } else {
      ASSERT_LE(std::fabs(y[i] - want), std::ldexp(1.0L, -149)) << "x " << x[i] << " got " << y[i];
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto s = apply({nan, -nan, -INFINITY, INFINITY}, [](__m256 v) { return k3::cpu::exp8(v); });
  EXPECT_TRUE(std::isnan(s[0]) && std::isnan(s[1]));
  EXPECT_EQ(s[2], 0.f);
  EXPECT_EQ(s[3], INFINITY);
}

TEST(VecMath, Tanh8WithinStatedBound) {
  const auto x = inputs(2);
  const auto y = apply(x, [](__m256 v) { return k3::cpu::tanh8(v); });
  k3test::Worst worst("tanh8 (units of 2^-24 relative)");
  for (size_t i = 0; i < x.size(); ++i) {
    const long double want = std::tanh(static_cast<long double>(x[i]));
    if (want == 0) {
      ASSERT_EQ(y[i], 0.f) << x[i];
      ASSERT_EQ(std::signbit(y[i]), std::signbit(x[i])) << x[i];
      continue;
    }
    const double rel = static_cast<double>(std::fabs(y[i] - want) / std::fabs(want));
    ASSERT_LE(rel, 4 * kU) << "x " << x[i] << " got " << y[i] << " want " << static_cast<double>(want);
    worst.add(rel / kU);
  }
  const auto s = apply({std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}, [](__m256 v) { return k3::cpu::tanh8(v); });
  EXPECT_TRUE(std::isnan(s[0]));
  EXPECT_EQ(s[1], 1.f);
  EXPECT_EQ(s[2], -1.f);
}

TEST(VecMath, Sigmoid8WithinStatedBound) {
  const auto x = inputs(3);
  const auto y = apply(x, [](__m256 v) { return k3::cpu::sigmoid8(v); });
  for (size_t i = 0; i < x.size(); ++i) {
    const long double want = 1 / (1 + std::exp(-static_cast<long double>(x[i])));
    if (want < FLT_MIN) {  // e^-x near or past overflow: 1 / (1 + e^-x) underflows to the denormals or 0
      ASSERT_LE(std::fabs(y[i] - want), static_cast<long double>(FLT_MIN)) << x[i];
      continue;
    }
    const double rel = static_cast<double>(std::fabs(y[i] - want) / want);
    ASSERT_LE(rel, 6 * kU) << "x " << x[i] << " got " << y[i] << " want " << static_cast<double>(want);
  }
  const auto s = apply({std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}, [](__m256 v) { return k3::cpu::sigmoid8(v); });
  EXPECT_TRUE(std::isnan(s[0]));
  EXPECT_EQ(s[1], 1.f);
  EXPECT_EQ(s[2], 0.f);
}

TEST(VecMath, Softplus8WithinStatedBound) {
  const auto x = inputs(4);
  const auto y = apply(x, [](__m256 v) { return k3::cpu::softplus8(v); });
  k3test::Worst worst("softplus8 (units of 2^-24 relative)");
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(x[i])) continue;  // below
    const long double xl = x[i];
    const long double want = xl > 0 ? xl + std::log1p(std::exp(-xl)) : std::log1p(std::exp(xl));
    if (want < FLT_MIN) {
      ASSERT_LE(std::fabs(y[i] - want), std::ldexp(1.0L, -149)) << x[i];
      continue;
    }
    const double rel = static_cast<double>(std::fabs(y[i] - want) / want);
    ASSERT_LE(rel, 4 * kU) << "x " << x[i] << " got " << y[i] << " want " << static_cast<double>(want);
    worst.add(rel / kU);
  }
  const auto s = apply({std::numeric_limits<float>::quiet_NaN(), INFINITY, -INFINITY}, [](__m256 v) { return k3::cpu::softplus8(v); });
  EXPECT_TRUE(std::isnan(s[0]));
  EXPECT_EQ(s[1], INFINITY);
  EXPECT_EQ(s[2], 0.f);
}

// zip8: an element's result does not depend on where it sits (body or padded tail), so the ops that use
// it stay batch-invariant.
TEST(VecMath, Zip8TailMatchesBody) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> d(-20.f, 20.f);
  std::vector<float> a(37), b(37);
  for (auto& v : a) v = d(rng);
  for (auto& v : b) v = d(rng);
  auto fn = [](__m256 p, __m256 q) { return _mm256_mul_ps(k3::cpu::tanh8(p), k3::cpu::sigmoid8(q)); };
  std::vector<float> all(37), one(1);
  k3::cpu::zip8(a.data(), b.data(), all.data(), 37, fn);
  for (size_t i = 0; i < a.size(); ++i) {
    k3::cpu::zip8(a.data() + i, b.data() + i, one.data(), 1, fn);
    ASSERT_EQ(std::memcmp(&one[0], &all[i], 4), 0) << i;
  }
}

}  // namespace
