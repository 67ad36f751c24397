// core/q8_blocks.h and core/moe_activation.h against a reference written here in double arithmetic: the block's scale
// m / 127 and each code nearest-even(x 127 / m). The host rule computes 127 / m and x (127 / m) in float, so a code may
// differ from the double one only where x 127 / m lies within float rounding of a half-integer: the test allows that
// and nothing else, and bounds every fake-quantised value by the block's step (m / 254).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/moe_activation.h"
#include "k3/core/q8_blocks.h"

namespace {

// Checks one block's codes and scale against the double reference; returns the codes that needed the tie allowance.
int check_block(const float* x, int n, const std::string& what) {
  std::vector<int8_t> q(static_cast<size_t>(n));
  const float d = k3::quantise_q8_block(x, n, q.data());
  double m = 0;
  for (int i = 0; i < n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  EXPECT_EQ(d, static_cast<float>(m / 127.0)) << what;  // m / 127 rounded once: the same as float division
  int near_ties = 0;
  for (int i = 0; i < n; ++i) {
    const double v = m >= k3::kQ8MinScaledMax ? static_cast<double>(x[i]) * 127.0 / m : 0.0;  // a tiny block: 0
    const double want = std::nearbyint(v);  // ties to even
    if (q[static_cast<size_t>(i)] == want) continue;
    const double off_tie = std::fabs(std::fabs(v - std::trunc(v)) - 0.5);
    EXPECT_LT(off_tie, 1e-5 * std::fabs(v) + 1e-6) << what << " x[" << i << "] = " << x[i] << ": code "
                                                   << int(q[static_cast<size_t>(i)]) << ", reference " << want;
    EXPECT_LE(std::fabs(q[static_cast<size_t>(i)] - want), 1.0) << what;
    ++near_ties;
  }
  return near_ties;
}

TEST(Q8Blocks, CodesAndScalesMatchADoubleReferenceOnRandomBlocks) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.f, 1.f), mag(-30.f, 30.f);
  int blocks = 0, near_ties = 0;
  for (int rep = 0; rep < 4000; ++rep) {
    const int n = rep % 5 == 0 ? 1 + static_cast<int>(rng() % 32) : 32;
    const float scale = std::exp2(mag(rng));
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = u(rng) * scale;
    if (rep % 7 == 0) x[rng() % n] = 0.f;
    near_ties += check_block(x.data(), n, "rep " + std::to_string(rep));
    ++blocks;
  }
  EXPECT_LT(near_ties, blocks / 100) << "codes off the double reference outside ties";
}

TEST(Q8Blocks, ExactTiesRoundToEven) {
  // m = 127 makes 127 / m = 1 and x (127 / m) = x exactly: 2.5 -> 2, 3.5 -> 4, -0.5 -> -0, 126.5 -> 126.
  std::vector<float> x(32, 1.f);
  x[0] = 127.f;
  x[1] = 2.5f;
  x[2] = 3.5f;
  x[3] = -0.5f;
  x[4] = 126.5f;
  x[5] = -127.f;
  int8_t q[32];
  EXPECT_EQ(k3::quantise_q8_block(x.data(), 32, q), 1.f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], 4);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[4], 126);
  EXPECT_EQ(q[5], -127);
}

TEST(Q8Blocks, FakeQuantRowIsWithinHalfAStepAndShortLastBlockStandsAlone) {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1.f, 1.f), mag(-8.f, 8.f);
  for (int64_t n : {32, 80, 72, 5, 96}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = u(rng) * std::exp2(mag(rng));
    std::vector<float> fq(x);
    k3::fake_quant_q8_row(fq.data(), n);
    bool changed = false;
    for (int64_t b = 0; b < n; b += 32) {
      const int len = static_cast<int>(std::min<int64_t>(32, n - b));
      float m = 0.f;
      for (int i = 0; i < len; ++i) m = std::max(m, std::fabs(x[static_cast<size_t>(b + i)]));
      for (int i = 0; i < len; ++i) {
        const float a = x[static_cast<size_t>(b + i)], r = fq[static_cast<size_t>(b + i)];
        EXPECT_LE(std::fabs(a - r), m / 254.f * 1.0001f) << "n " << n << " x[" << b + i << "]";
        changed = changed || a != r;
      }
      // The short last block is the zero-padded block's first len values.
      std::vector<float> pad(32, 0.f);
      std::copy(x.begin() + b, x.begin() + b + len, pad.begin());
      k3::fake_quant_q8_row(pad.data(), 32);
      for (int i = 0; i < len; ++i) EXPECT_EQ(pad[static_cast<size_t>(i)], fq[static_cast<size_t>(b + i)]) << "n " << n;
    }
    EXPECT_TRUE(changed) << "n " << n << ": nothing rounded";
  }
  EXPECT_THROW(k3::fake_quant_q8_row(nullptr, -1), k3::Error);
}

TEST(Q8Blocks, NonFiniteBlocksGiveNaNAndTinyBlocksZero) {
  std::vector<float> x(96, 0.25f);
  x[3] = std::numeric_limits<float>::infinity();
  x[40] = std::numeric_limits<float>::quiet_NaN();
  for (int i = 64; i < 96; ++i) x[static_cast<size_t>(i)] = 0x1p-126f * static_cast<float>(i - 63);  // m < 2^-120
  k3::fake_quant_q8_row(x.data(), 96);
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(std::isnan(x[static_cast<size_t>(i)])) << i;
  for (int i = 64; i < 96; ++i) EXPECT_EQ(x[static_cast<size_t>(i)], 0.f) << i;
}

TEST(MoeActivation, FlagValuesAndTheRowRounding) {
  EXPECT_EQ(k3::parse_moe_activation_dtype("float32"), k3::MoeActivationDType::F32);
  EXPECT_EQ(k3::parse_moe_activation_dtype("mxfp8"), k3::MoeActivationDType::MXFP8);
  EXPECT_EQ(k3::parse_moe_activation_dtype("q8"), k3::MoeActivationDType::Q8);
  EXPECT_STREQ(k3::moe_activation_dtype_name(k3::MoeActivationDType::MXFP8), "mxfp8");
  EXPECT_STREQ(k3::moe_activation_dtype_name(k3::MoeActivationDType::Q8), "q8");
  EXPECT_STREQ(k3::moe_activation_dtype_name(k3::MoeActivationDType::F32), "float32");
  try {
    k3::parse_moe_activation_dtype("fp8\n");
    ADD_FAILURE() << "no error";
  } catch (const k3::Error& e) {
    EXPECT_EQ(std::string(e.what()), "--moe-activation-dtype: unknown value 'fp8?' (accepted: float32, mxfp8, q8)");
  }
  std::vector<float> x(40);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i) - 1.7f;
  std::vector<float> f32(x), q8(x), want(x);
  k3::fake_quant_moe_row(k3::MoeActivationDType::F32, f32.data(), 40);
  EXPECT_EQ(f32, x);
  k3::fake_quant_moe_row(k3::MoeActivationDType::Q8, q8.data(), 40);
  k3::fake_quant_q8_row(want.data(), 40);
  EXPECT_EQ(q8, want);
  EXPECT_NE(q8, x);
}

}  // namespace
