// core/mxfp8.h against an independent reference written here in double arithmetic: the scale byte from the
// definition (the largest k with 2^k <= amax, found by comparisons, not frexp), each code by exhaustive search over
// E4M3's 127 finite magnitudes (nearest, ties to the even code, saturating), on random blocks of every magnitude
// float holds, outliers, values on E4M3 subnormals, exact ties, zeros, NaN and inf.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "k3/core/cache_dtype.h"
#include "k3/core/error.h"
#include "k3/core/mxfp8.h"

namespace {

constexpr int B = 32;
constexpr double kInf = std::numeric_limits<double>::infinity();

// E4M3 (e4m3fn) magnitude of code c & 0x7F from the definition; 0x7F is NaN.
double ref_magnitude(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  return e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// The scale byte: amax over the non-NaN values; 0 for amax 0; 254 for inf; else floor(log2(amax)) - 8 + 127, clamped.
int ref_scale(const float* x, int n) {
  double amax = 0;
  for (int i = 0; i < n; ++i)
    if (!std::isnan(x[i])) amax = std::max(amax, std::fabs(double(x[i])));
  if (amax == 0) return 0;
  if (std::isinf(amax)) return 254;
  int k = -160;  // the largest k with 2^k <= amax (float's smallest subnormal is 2^-149)
  while (std::ldexp(1.0, k + 1) <= amax) ++k;
  return std::clamp(k - 8, -127, 127) + 127;
}

// The code of x / 2^(s-127) (exact in double): the nearest of the 127 finite magnitudes, ties to the even code,
// everything beyond 448 saturating to 448; the sign bit is x's; NaN -> 0x7F.
int ref_code(float x, int s) {
  if (std::isnan(x)) return 0x7F;
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isinf(x)) return sign | 0x7E;
  const double v = std::fabs(double(x)) / std::ldexp(1.0, s - 127);
  int best = 0;
  double best_d = kInf;
  for (int c = 0; c <= 0x7E; ++c) {
    const double d = std::fabs(ref_magnitude(c) - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return sign | best;
}

// The dequantised value code * 2^(s-127) as a float (+-inf beyond float's range, as float arithmetic gives).
float ref_value(int code, int s) {
  if ((code & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  const double v = ref_magnitude(code) * std::ldexp(1.0, s - 127);
  const double sv = (code & 0x80) ? -v : v;
  if (std::fabs(sv) > double(FLT_MAX)) return sv < 0 ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  return static_cast<float>(sv);  // exact: the test checks that it is
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Checks scale bytes, every code and fake_quant of x (n % 32 == 0) against the reference; `what` names the case.
void check_against_reference(const std::vector<float>& x, const std::string& what) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> codes(static_cast<size_t>(n)), scales(static_cast<size_t>(n / B));
  k3::quantize_mxfp8(x.data(), n, codes.data(), scales.data());
  std::vector<float> fq(x);
  k3::fake_quant_mxfp8(fq.data(), n);
  int bad = 0;
  for (int64_t b = 0; b < n / B && bad < 8; ++b) {
    const int s = ref_scale(x.data() + b * B, B);
    EXPECT_EQ(int(scales[static_cast<size_t>(b)]), s) << what << " block " << b;
    EXPECT_EQ(int(k3::mxfp8_block_scale(x.data() + b * B, B)), s) << what << " block " << b;
    for (int64_t i = b * B; i < (b + 1) * B; ++i) {
      const size_t u = static_cast<size_t>(i);
      const int want = ref_code(x[u], s);
      const float want_value = ref_value(want, s);
      if (int(codes[u]) != want) {
        ADD_FAILURE() << what << " x[" << i << "] = " << x[u] << " (scale byte " << s << "): code " << int(codes[u])
                      << ", reference " << want;
        ++bad;
      }
      const bool same = std::isnan(want_value) ? std::isnan(fq[u]) : bits(fq[u]) == bits(want_value);
      if (!same) {
        ADD_FAILURE() << what << " x[" << i << "] = " << x[u] << ": fake_quant " << fq[u] << ", reference " << want_value;
        ++bad;
      }
      // The exactness claim: the reference value (computed in double) is a float.
      if (!std::isnan(want_value) && !std::isinf(want_value)) {
        EXPECT_EQ(double(want_value), ((want & 0x80) ? -1 : 1) * ref_magnitude(want) * std::ldexp(1.0, s - 127));
      }
    }
  }
}

float log_uniform(std::mt19937& rng, double lo_exp, double hi_exp) {
  std::uniform_real_distribution<double> e(lo_exp, hi_exp);
  const double v = std::exp2(e(rng));
  return static_cast<float>(rng() & 1 ? -v : v);
}

TEST(Mxfp8, RandomBlocksOfEveryMagnitudeMatchReference) {
  std::mt19937 rng(1234);
  std::vector<float> x;
  std::uniform_real_distribution<double> centre(-140, 125);
  for (int b = 0; b < 4000; ++b) {  // a block's values within ~2^14 of each other, its centre anywhere in float's range
    const double c = centre(rng);
    for (int i = 0; i < B; ++i) x.push_back(log_uniform(rng, c - 12, c + 2));
  }
  for (int b = 0; b < 1000; ++b)  // values log-uniform over float's whole range inside one block
    for (int i = 0; i < B; ++i) x.push_back(log_uniform(rng, -149, 127.9));
  check_against_reference(x, "random");
}

TEST(Mxfp8, OutliersSubnormalsZerosAndTiesMatchReference) {
  std::mt19937 rng(99);
  std::vector<float> x;
  // One huge outlier: the rest of the block falls to E4M3 subnormals or zero.
  for (int b = 0; b < 64; ++b) {
    for (int i = 0; i < B; ++i) x.push_back(log_uniform(rng, -4, 1));
    x[x.size() - 1 - static_cast<size_t>(b % B)] = log_uniform(rng, 6, 40);
  }
  // All values on E4M3 subnormals: amax 1 (scale 2^-8), the others in [2^-19, 2^-14) -> [2^-11, 2^-6) scaled.
  for (int b = 0; b < 64; ++b) {
    x.push_back(b % 2 ? 1.f : -1.f);
    for (int i = 1; i < B; ++i) x.push_back(log_uniform(rng, -19, -14));
  }
  // Exact ties between neighbouring codes (amax 256: scale byte 127, quotient = value), subnormal ties included.
  for (int b = 0; b < 16; ++b) {
    x.push_back(256.f);
    for (int i = 1; i < B; ++i) {
      const int c = static_cast<int>(rng() % 0x7E);  // c and c + 1 both finite
      const float mid = static_cast<float>((ref_magnitude(c) + ref_magnitude(c + 1)) / 2);
      x.push_back(rng() & 1 ? -mid : mid);
    }
  }
  // Saturation: amax in [448, 512) keeps scale 2^0 and rounds down to 448; 464 is the tie that goes to 448.
  const float sat[] = {448.f, 449.f, 463.99f, 464.f, 464.01f, 500.f, 511.9f, -470.f};
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < B; ++i) x.push_back(sat[i % 8] * (i % 3 == 0 ? 1.f : 0.37f));
  // Zeros: a whole block, and zeros of both signs among values; amax at exact powers of two and just below.
  for (int i = 0; i < B; ++i) x.push_back(0.f);
  for (int i = 0; i < B; ++i) x.push_back(i % 3 == 0 ? (i % 2 ? -0.f : 0.f) : log_uniform(rng, -3, 3));
  for (float p : {1.f, 0x1p-126f, 0x1p100f, std::nextafter(2.f, 0.f), std::nextafter(0x1p-100f, 0.f), FLT_MAX,
                  0x1p-149f, 0x1p-140f, 0x1.8p-125f})
    for (int i = 0; i < B; ++i) x.push_back(i == 5 ? p : p * 0.123f);
  check_against_reference(x, "edges");
}

// NaN is left out of amax and stays NaN; inf gives the largest scale, saturates, and dequantises to inf again.
TEST(Mxfp8, NanAndInfBlocksAsDocumented) {
  std::mt19937 rng(7);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (int i = 0; i < B; ++i) x.push_back(i == 3 || i == 17 ? nan : log_uniform(rng, -5, 5));
  for (int i = 0; i < B; ++i) x.push_back(i == 9 ? inf : i == 20 ? -inf : log_uniform(rng, -5, 5));
  for (int i = 0; i < B; ++i) x.push_back(i == 9 ? -inf : i == 10 ? nan : i == 11 ? 0x1.dp127f : 1.f);
  for (int i = 0; i < B; ++i) x.push_back(nan);  // all NaN: no amax, scale byte 0
  check_against_reference(x, "nan/inf");

  std::vector<float> fq(x);
  k3::fake_quant_mxfp8(fq.data(), static_cast<int64_t>(fq.size()));
  std::vector<float> nan_block(x.begin(), x.begin() + B), plain(nan_block);
  for (float& v : plain)
    if (std::isnan(v)) v = 0.f;
  EXPECT_EQ(k3::mxfp8_block_scale(nan_block.data(), B), k3::mxfp8_block_scale(plain.data(), B));
  EXPECT_TRUE(std::isnan(fq[3]) && std::isnan(fq[17]));
  EXPECT_EQ(k3::mxfp8_block_scale(x.data() + B, B), 254);
  EXPECT_EQ(fq[B + 9], inf);
  EXPECT_EQ(fq[B + 20], -inf);
  EXPECT_EQ(fq[B], 0.f);  // a finite value next to inf: rounded on steps of 2^118
  EXPECT_EQ(fq[2 * B + 11], 0x1.cp127f);  // 1.8125 * 2^127: the tie between codes 1.75 and 1.875 goes to the even 1.75
  EXPECT_EQ(k3::mxfp8_block_scale(x.data() + 3 * B, B), 0);
  for (int i = 0; i < B; ++i) EXPECT_TRUE(std::isnan(fq[static_cast<size_t>(3 * B + i)]));
}

// fake_quant_mxfp8 rounds in float without forming the codes (mxfp8.cpp): it must equal the codes dequantised for
// every value. Blocks led by 256 (scale 2^0, so the quotient is the value) over every 61st float in [0, 512) of
// both signs, E4M3 subnormals, ties and saturation included, and blocks of float subnormals and huge values.
TEST(Mxfp8, FakeQuantEqualsCodesDequantised) {
  std::vector<float> x;
  const uint32_t end = bits(512.f);
  for (uint32_t u = 0; u < end; u += 61) {
    if (x.size() % B == 0) x.push_back(x.size() % (2 * B) == 0 ? 256.f : -256.f);
    float v;
    std::memcpy(&v, &u, 4);
    x.push_back((u / 61) % 2 ? -v : v);
  }
  for (uint32_t u = 1; u < bits(0x1p-100f); u += 4099) {  // blocks whose amax is tiny: clamped scales
    float v;
    std::memcpy(&v, &u, 4);
    x.push_back(v);
  }
  x.resize((x.size() + B - 1) / B * B, 0.f);
  std::vector<uint8_t> codes(x.size()), scales(x.size() / B);
  k3::quantize_mxfp8(x.data(), static_cast<int64_t>(x.size()), codes.data(), scales.data());
  std::vector<float> fq(x);
  k3::fake_quant_mxfp8(fq.data(), static_cast<int64_t>(fq.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < x.size() && bad < 10; ++i) {
    const float want = k3::fp8_e4m3_to_f32(codes[i]) * std::ldexp(1.0f, int(scales[i / B]) - 127);
    if (bits(fq[i]) != bits(want)) {
      ADD_FAILURE() << "x " << x[i] << ": fake_quant " << fq[i] << ", codes dequantised " << want;
      ++bad;
    }
  }
  EXPECT_GT(x.size(), 10000000u);
}

TEST(Mxfp8, ScaleBytesOfKnownBlocks) {
  auto scale_of = [](float amax) {
    std::vector<float> b(B, 0.f);
    b[7] = -amax;
    b[0] = amax * 0.5f;
    return int(k3::mxfp8_block_scale(b.data(), B));
  };
  EXPECT_EQ(scale_of(448.f), 127);  // floor(log2 448) = 8 -> 2^0: 448 is its own code
  EXPECT_EQ(scale_of(256.f), 127);
  EXPECT_EQ(scale_of(std::nextafter(256.f, 0.f)), 126);
  EXPECT_EQ(scale_of(1.f), 119);
  EXPECT_EQ(scale_of(FLT_MAX), 127 + 127 - 8);
  EXPECT_EQ(scale_of(0x1p-119f), 0);   // e = -127: the smallest scale
  EXPECT_EQ(scale_of(0x1p-118f), 1);
  EXPECT_EQ(scale_of(0x1p-149f), 0);   // clamped
  EXPECT_EQ(scale_of(0.f), 0);
}

TEST(Mxfp8, RowFormPadsTheShortLastBlockWithZeros) {
  std::mt19937 rng(3);
  for (int64_t n : {0, 1, 31, 32, 33, 48, 96, 100}) {
    std::vector<float> x;
    for (int64_t i = 0; i < n; ++i) x.push_back(log_uniform(rng, -10, 10));
    const int64_t padded_n = (n + B - 1) / B * B;
    std::vector<float> padded(x);
    padded.resize(static_cast<size_t>(padded_n), 0.f);
    k3::fake_quant_mxfp8(padded.data(), padded_n);
    k3::fake_quant_mxfp8_row(x.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(bits(x[static_cast<size_t>(i)]), bits(padded[static_cast<size_t>(i)])) << n << " " << i;
  }
}

TEST(Mxfp8, PartialBlocksAreErrors) {
  std::vector<float> x(64, 1.f);
  std::vector<uint8_t> codes(64), scales(2);
  for (int64_t n : {1, 31, 33, 63}) {
    EXPECT_THROW(k3::quantize_mxfp8(x.data(), n, codes.data(), scales.data()), k3::Error) << n;
    EXPECT_THROW(k3::fake_quant_mxfp8(x.data(), n), k3::Error) << n;
  }
  EXPECT_NO_THROW(k3::fake_quant_mxfp8(x.data(), 0));
  EXPECT_EQ(x[0], 1.f);
}

}  // namespace
