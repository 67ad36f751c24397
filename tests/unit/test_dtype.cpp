#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "k3/core/dtype.h"

TEST(DType, Bf16RoundTripIsNearestEven) {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 10000; ++i) {
    float x = nd(rng);
    float y = k3::bf16_to_f32(k3::f32_to_bf16(x));
    EXPECT_LE(std::fabs(x - y), std::fabs(x) * (1.f / 256.f)) << x;
  }
  EXPECT_EQ(k3::f32_to_bf16(1.0f), 0x3f80);
}

TEST(DType, F16Decode) {
  EXPECT_EQ(k3::f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(k3::f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(k3::f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(k3::f16_to_f32(0x7bff), 65504.0f);
}

TEST(DType, E8M0Scale) {
  EXPECT_EQ(k3::e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(k3::e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(k3::e8m0_to_f32(120), std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(k3::e8m0_to_f32(255)));
}
