#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
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
  // Exact halfway cases, where round-half-up (or truncation) differ from round-half-to-even: the
  // random values above never hit one.
  auto bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return k3::f32_to_bf16(f);
  };
  EXPECT_EQ(bits(0x3f808000u), 0x3f80);  // 1 + 2^-8: halfway, even neighbour below
  EXPECT_EQ(bits(0x3f818000u), 0x3f82);  // 1 + 3*2^-8: halfway, even neighbour above
  EXPECT_EQ(bits(0xbf808000u), 0xbf80);  // negative halfway, to even
  EXPECT_EQ(bits(0x3f808001u), 0x3f81);  // just above halfway: up
  EXPECT_EQ(bits(0x3f817fffu), 0x3f81);  // just below halfway: down
  EXPECT_EQ(bits(0x00008000u), 0x0000);  // denormal halfway to even (zero)
  // Specials: Inf stays Inf, NaN stays NaN (quiet, sign kept; a NaN whose payload is only in the low
  // 16 bits must not round to Inf), the largest finite float rounds to Inf (it is above bf16's max + half ulp).
  EXPECT_EQ(bits(0x7f800000u), 0x7f80);
  EXPECT_EQ(bits(0xff800000u), 0xff80);
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu}) {
    const uint16_t h = bits(nan);
    EXPECT_TRUE(std::isnan(k3::bf16_to_f32(h))) << std::hex << nan;
    EXPECT_EQ(h >> 15, nan >> 31) << std::hex << nan;
  }
  EXPECT_EQ(bits(0x7f7fffffu), 0x7f80);
  EXPECT_EQ(bits(0x7f7f7fffu), 0x7f7f);  // largest value that stays finite
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
