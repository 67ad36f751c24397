// MXFP8 quantisation on the host (mxfp8.h): the scale rule, the codes, the fake quantisation.
#include "k3/core/mxfp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "k3/core/cache_dtype.h"
#include "k3/core/error.h"

namespace k3 {
namespace {

void check_whole_blocks(const char* what, int64_t n) {
  if (n < 0 || n % kMxBlock != 0)
    throw Error(std::string(what) + ": " + std::to_string(n) + " values is not a whole number of MXFP8 blocks of " +
                std::to_string(kMxBlock));
}

// 1 / 2^(s-127) = 2^(127-s): a float for every s in [0, 254] (2^-127 is a float subnormal, exactly).
float inverse_scale(uint8_t s) { return std::ldexp(1.0f, 127 - static_cast<int>(s)); }
float scale_value(uint8_t s) { return std::ldexp(1.0f, static_cast<int>(s) - 127); }

// The code of x under the block's scale byte s. x * 2^(127-s) is a product by a power of two: exact whenever the
// result is a float normal (>= 2^-126), so f32_to_fp8_e4m3 rounds the true quotient once. A result below 2^-126 is
// rounded by the product first, but anything that small is far under E4M3's half-smallest-subnormal 2^-10, so
// its code is +-0 either way: no double rounding changes a code. The product cannot overflow: |x| < 2^(e+9) for a
// finite block (e = s - 127), and an infinite x stays inf, which saturates to +-448 as it should.
uint8_t code_of(float x, float inv_scale) { return f32_to_fp8_e4m3(x * inv_scale); }

// The E4M3 value nearest v, as a float: fp8_e4m3_to_f32(f32_to_fp8_e4m3(v)) without the codes, ~5x faster (no
// data-dependent branch; the tests hold the two equal bit for bit). The grid step in v's binade [2^E, 2^(E+1)) is
// 2^(E-3) (3 mantissa bits), and 2^-9 below 2^-6 (the subnormals); the float adder itself rounds to a multiple of
// 2^k, to nearest even: (a + 2^(k+23)) has ulp 2^k, since a < 2^(k+4). A value rounding up to the next binade lands
// on its first grid point, as the code would. From 464 up (448 + half its step) it saturates; NaN stays NaN.
float e4m3_nearest(float v) {
  const float a = std::fabs(v);
  if (!(a < 464.f)) return std::isnan(v) ? v : std::copysign(kFp8E4M3Max, v);
  uint32_t bits;
  std::memcpy(&bits, &a, 4);
  const int k = std::max(static_cast<int>(bits >> 23) - 127, -6) - 3;  // a float subnormal counts as 2^-127
  const uint32_t c_bits = static_cast<uint32_t>(k + 23 + 127) << 23;
  float c;
  std::memcpy(&c, &c_bits, 4);
  return std::copysign((a + c) - c, v);
}

// One block (n <= 32 values) in place. The dequantised value code * 2^(s-127) is exact in float: an E4M3 value has
// at most 4 significant bits and its lowest is >= 2^-9, so with s >= 0 every bit is >= 2^-136, above float's
// smallest subnormal 2^-149. Only s = 254 (a block holding inf) can overflow: to inf, as documented in mxfp8.h.
void fake_quant_block(float* x, int n) {
  const uint8_t s = mxfp8_block_scale(x, n);
  const float inv = inverse_scale(s), scale = scale_value(s);
  for (int i = 0; i < n; ++i) x[i] = e4m3_nearest(x[i] * inv) * scale;  // the product as in code_of
}

}  // namespace

uint8_t mxfp8_block_scale(const float* x, int n) {
  float amax = 0.f;
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) amax = a;  // false for NaN: NaN never enters amax
  }
  if (amax == 0.f) return 0;
  if (std::isinf(amax)) return 254;  // floor(log2(inf)) - 8 clamps to 127
  int exp2 = 0;
  std::frexp(amax, &exp2);  // amax = m * 2^exp2 with m in [0.5, 1): floor(log2(amax)) = exp2 - 1, exact
  const int e = std::clamp(exp2 - 1 - 8, -127, 127);
  return static_cast<uint8_t>(e + 127);
}

void quantize_mxfp8(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  check_whole_blocks("quantize_mxfp8", n);
  for (int64_t b = 0; b < n / kMxBlock; ++b) {
    const float* xb = x + b * kMxBlock;
    const uint8_t s = mxfp8_block_scale(xb, kMxBlock);
    const float inv = inverse_scale(s);
    scales[b] = s;
    for (int i = 0; i < kMxBlock; ++i) codes[b * kMxBlock + i] = code_of(xb[i], inv);
  }
}

void fake_quant_mxfp8(float* x, int64_t n) {
  check_whole_blocks("fake_quant_mxfp8", n);
  for (int64_t b = 0; b < n; b += kMxBlock) fake_quant_block(x + b, kMxBlock);
}

void fake_quant_mxfp8_row(float* x, int64_t n) {
  if (n < 0) throw Error("fake_quant_mxfp8_row: negative width " + std::to_string(n));
  const int64_t whole = n / kMxBlock * kMxBlock;
  for (int64_t b = 0; b < whole; b += kMxBlock) fake_quant_block(x + b, kMxBlock);
  if (whole < n) fake_quant_block(x + whole, static_cast<int>(n - whole));
}

}  // namespace k3
