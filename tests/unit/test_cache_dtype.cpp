// core/cache_dtype.h: flag parsing, row layouts and the fp8 e4m3 / bf16 conversions against independent
// reference formulas (the CUDA kernels are checked bit for bit against the same host functions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "k3/core/cache_dtype.h"
#include "k3/core/error.h"

namespace {

using k3::CacheDType;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// e4m3fn straight from the definition: (-1)^s 2^(e-7) (1 + m/8), subnormal 2^-6 (m/8), S.1111.111 NaN.
double ref_decode(int c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

// Nearest finite code by exhaustive search in double, ties to the even code (mantissa LSB 0); beyond
// 448 + half an ulp the nearest is 448 anyway (saturation); NaN -> 0x7F.
int ref_encode(float x) {
  if (std::isnan(x)) return 0x7F;
  const double ax = std::fabs(double(x));
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(ref_decode(c) - ax);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return (std::signbit(x) ? 0x80 : 0) | best;
}

TEST(CacheDType, Fp8AllCodesDecodeAndRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const float f = k3::fp8_e4m3_to_f32(uint8_t(c));
    const double r = ref_decode(c);
    if (std::isnan(r)) {
      EXPECT_TRUE(std::isnan(f)) << c;
      EXPECT_EQ(k3::f32_to_fp8_e4m3(f), 0x7F) << c;
      continue;
    }
    EXPECT_EQ(double(f), r) << "code " << c;
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << c;
    EXPECT_EQ(k3::f32_to_fp8_e4m3(f), c) << "code " << c;
  }
  EXPECT_EQ(k3::fp8_e4m3_to_f32(0x7E), 448.f);
  EXPECT_EQ(k3::fp8_e4m3_to_f32(0x01), std::ldexp(1.f, -9));
}

TEST(CacheDType, Fp8EncodeMatchesNearestEvenReferenceOnDenseSweep) {
  std::vector<float> xs;
  // Every midpoint between adjacent codes and its float neighbours (the rounding decisions), plus the
  // saturation edge and the specials.
  for (int c = 0; c < 0x7E; ++c) {
    const float mid = float((ref_decode(c) + ref_decode(c + 1)) / 2);  // exact: few mantissa bits
    xs.insert(xs.end(), {mid, std::nextafter(mid, 0.f), std::nextafter(mid, INFINITY)});
  }
  xs.insert(xs.end(), {448.f, 464.f, std::nextafter(464.f, 0.f), std::nextafter(464.f, INFINITY), 480.f, 1e30f,
                       INFINITY, 0.f, std::ldexp(1.f, -10), std::nextafter(std::ldexp(1.f, -10), 1.f),
                       std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::quiet_NaN()});
  // A dense sweep of bit patterns from 0 to 1024 (every 4099th float: all exponents, scattered mantissas).
  for (uint32_t u = 0; u < bits_of(1024.f); u += 4099) xs.push_back(float_of(u));
  const std::size_t n = xs.size();
  for (std::size_t i = 0; i < n; ++i) xs.push_back(-xs[i]);
  int bad = 0;
  for (float x : xs) {
    const int got = k3::f32_to_fp8_e4m3(x), want = ref_encode(x);
    if (got != want && ++bad < 10) ADD_FAILURE() << "x=" << x << " (0x" << std::hex << bits_of(x) << ") got 0x" << got
                                                 << " want 0x" << want;
  }
  EXPECT_EQ(bad, 0) << "of " << xs.size();
  EXPECT_GT(xs.size(), 500000u);
}

// bf16: nearest of the two bf16 neighbours (truncated and next), ties to even, NaN stays NaN.
TEST(CacheDType, Bf16RoundsToNearestEven) {
  std::vector<float> xs = {1.f, -1.f, 1.00390625f /* tie, even down */, 1.01171875f /* tie, odd up */, 3.3e38f,
                           1e-40f, 0.f, -0.f};
  for (uint32_t u = 0; u < 0x7F800000u; u += 65537 * 3 + 1) xs.push_back(float_of(u));
  for (float x : xs) {
    const uint32_t u = bits_of(x);
    const double lo = double(float_of(u & 0xFFFF0000u)), hi = double(float_of((u & 0xFFFF0000u) + 0x10000u));
    const double dl = std::fabs(double(x) - lo), dh = std::fabs(hi - double(x));
    const uint16_t lo_code = uint16_t(u >> 16);
    const uint16_t want = dl < dh ? lo_code : dh < dl ? uint16_t(lo_code + 1) : (lo_code & 1) ? uint16_t(lo_code + 1) : lo_code;
    EXPECT_EQ(k3::f32_to_bf16(x), want) << x;
  }
  EXPECT_TRUE(std::isnan(k3::bf16_to_f32(k3::f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(CacheDType, FlagValues) {
  EXPECT_EQ(k3::parse_kv_cache_dtype("auto"), CacheDType::F32);
  EXPECT_EQ(k3::parse_kv_cache_dtype("fp32"), CacheDType::F32);
  EXPECT_EQ(k3::parse_kv_cache_dtype("bf16"), CacheDType::BF16);
  EXPECT_EQ(k3::parse_kv_cache_dtype("bfloat16"), CacheDType::BF16);
  EXPECT_EQ(k3::parse_kv_cache_dtype("fp8"), CacheDType::FP8_E4M3);
  EXPECT_EQ(k3::parse_kv_cache_dtype("fp8_e4m3"), CacheDType::FP8_E4M3);
  EXPECT_EQ(k3::parse_mamba_ssm_cache_dtype("auto"), CacheDType::F32);
  EXPECT_EQ(k3::parse_mamba_ssm_cache_dtype("float32"), CacheDType::F32);
  EXPECT_EQ(k3::parse_mamba_ssm_cache_dtype("bfloat16"), CacheDType::BF16);
  auto message = [](auto parse, std::string_view v) {
    try {
      parse(v);
    } catch (const k3::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string kv = message(k3::parse_kv_cache_dtype, "fp8_e5m2");
  EXPECT_NE(kv.find("--kv-cache-dtype"), std::string::npos) << kv;
  EXPECT_NE(kv.find("'fp8_e5m2'"), std::string::npos) << kv;
  EXPECT_NE(kv.find("auto, float32, fp32, bf16, bfloat16, fp8, fp8_e4m3"), std::string::npos) << kv;
  const std::string ssm = message(k3::parse_mamba_ssm_cache_dtype, "fp8");
  EXPECT_NE(ssm.find("--mamba-ssm-cache-dtype: unknown value 'fp8'"), std::string::npos) << ssm;
  for (std::string_view bad : {"", "BF16", "auto ", "float16"})
    EXPECT_THROW(k3::parse_kv_cache_dtype(bad), k3::Error) << bad;
  // A hostile value is cut and made printable in the one-line message.
  const std::string junk = message(k3::parse_kv_cache_dtype, std::string(1000, 'x') + "\n\x1b[2J");
  EXPECT_LT(junk.size(), 200u);
  EXPECT_EQ(junk.find('\n'), std::string::npos);
}

TEST(CacheDType, MlaRowLayouts) {
  EXPECT_EQ(k3::mla_row_bytes(CacheDType::F32, 512, 64), 2304);
  EXPECT_EQ(k3::mla_row_bytes(CacheDType::BF16, 512, 64), 1152);
  EXPECT_EQ(k3::mla_row_bytes(CacheDType::FP8_E4M3, 512, 64), 644);  // 512 codes | 64 bf16 | fp32 scale
  EXPECT_EQ(k3::mla_fp8_pe_offset(512), 512);
  EXPECT_EQ(k3::mla_fp8_scale_offset(512, 64), 640);
  // Parts start 4-byte aligned: 5 codes + 3 padding | 1 bf16 + 2 padding | scale.
  EXPECT_EQ(k3::mla_fp8_pe_offset(5), 8);
  EXPECT_EQ(k3::mla_fp8_scale_offset(5, 1), 12);
  EXPECT_EQ(k3::mla_row_bytes(CacheDType::FP8_E4M3, 5, 1), 16);
  EXPECT_EQ(k3::cache_dtype_bytes(CacheDType::FP8_E4M3), 1);
  EXPECT_STREQ(k3::cache_dtype_name(CacheDType::BF16), "bfloat16");
}

}  // namespace
