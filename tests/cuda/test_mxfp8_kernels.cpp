// The device's MXFP8 quantisation (backend/cuda/mxfp8_quant.h) against the host's (core/mxfp8.h), which defines the
// numerics of --moe-activation-dtype mxfp8: every scale byte and every code equal, on values spread over float's whole
// range and on the blocks the rule singles out (zeros, NaN, inf, float subnormals, exact ties between two codes).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "k3/backend/cuda/mxfp8_quant.h"
#include "k3/core/mxfp8.h"

namespace {

using namespace k3cudatest;

// Rows of 32-value blocks: block b draws its magnitudes log-uniformly around 2^c_b (c_b itself spread over float's
// range), both signs; some blocks get one outlier 2^10 above the rest, and the special blocks below.
std::vector<float> test_values(int blocks, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> centre(-140.0, 120.0), spread(-6.0, 6.0), unit(0.0, 1.0);
  std::vector<float> x(static_cast<size_t>(blocks) * 32);
  for (int b = 0; b < blocks; ++b) {
    const double c = centre(rng);
    for (int i = 0; i < 32; ++i) {
      const double mag = std::exp2(std::min(c + spread(rng), 127.0));
      x[b * 32 + i] = static_cast<float>(unit(rng) < 0.5 ? -mag : mag);
    }
    if (b % 5 == 0) x[b * 32 + (b % 32)] *= 1024.f;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int i = 0; i < 32; ++i) {
    x[0 * 32 + i] = 0.f;                                   // all zeros (-0 too)
    x[1 * 32 + i] = i % 2 ? -0.f : 0.f;
    x[2 * 32 + i] = nan;                                   // all NaN
    x[3 * 32 + i] = std::ldexp(1.f + i / 32.f, -140);      // float subnormals
    // Exact ties: amax 256 (scale 2^0), values halfway between E4M3 neighbours (1.0625 between 1 and 1.125, ...).
    x[4 * 32 + i] = i == 0 ? 256.f : (i % 2 ? -1.f : 1.f) * (1.0f + (2 * (i % 8) + 1) / 16.f) * std::ldexp(1.f, i % 5);
  }
  x[5 * 32 + 3] = nan;   // one NaN in an ordinary block
  x[6 * 32 + 7] = inf;   // one inf
  x[7 * 32 + 9] = -inf;
  return x;
}

TEST(CudaMxfp8, QuantizeMatchesHost) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  const int rows = 12, cols = 32 * 40;  // 480 blocks
  const std::vector<float> x = test_values(rows * cols / 32, 55);
  std::vector<uint8_t> codes_ref(x.size()), scales_ref(x.size() / 32);
  k3::quantize_mxfp8(x.data(), static_cast<int64_t>(x.size()), codes_ref.data(), scales_ref.data());
  Dev<float> dx(x);
  Dev<uint8_t> dc(x.size()), ds(x.size() / 32);
  dc.poison();
  ds.poison();
  ck(k3::cuda::quantize_mxfp8_rows(dx.p, rows, cols, dc.p, ds.p, nullptr), "quantize");
  ck(cudaDeviceSynchronize(), "sync");
  const std::vector<uint8_t> codes = dc.get(), scales = ds.get();
  int bad_scales = 0, bad_codes = 0;
  for (size_t b = 0; b < scales.size(); ++b) bad_scales += scales[b] != scales_ref[b];
  for (size_t i = 0; i < codes.size(); ++i) bad_codes += codes[i] != codes_ref[i];
  EXPECT_EQ(bad_scales, 0);
  EXPECT_EQ(bad_codes, 0);
  // The inputs reach every region the rule distinguishes: both ends of the scale range and saturated codes.
  int low = 0, high = 0, sat = 0;
  for (uint8_t s : scales_ref) low += s < 20, high += s > 230;
  for (uint8_t c : codes_ref) sat += (c & 0x7F) == 0x7E;
  EXPECT_GT(low, 0);
  EXPECT_GT(high, 0);
  EXPECT_GT(sat, 0);
  std::printf("[ mxfp8 ] %zu blocks, %zu codes: %d / %d differ (scales / codes); scale bytes < 20: %d, > 230: %d, codes at 448: %d\n",
              scales.size(), codes.size(), bad_scales, bad_codes, low, high, sat);
}

// fake_quant_mxfp8_rows (MoePrecision::Mxfp8's tile form) against the host's fake_quant_mxfp8_row, bit for bit (NaN
// where the host has NaN), on rows of whole blocks and rows with a short last block (48 = 32 + 16, 200 = 6 * 32 + 8:
// the BF16 banks' widths), out of place and in place. The values as above, the special blocks included.
TEST(CudaMxfp8, FakeQuantRowsMatchHost) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  for (const int cols : {128, 48, 200}) {
    const int rows = 40;
    std::vector<float> x = test_values((rows * cols + 31) / 32, 77 + cols);
    x.resize(static_cast<size_t>(rows) * cols);
    std::vector<float> ref = x;
    for (int r = 0; r < rows; ++r) k3::fake_quant_mxfp8_row(ref.data() + static_cast<size_t>(r) * cols, cols);
    for (const bool in_place : {false, true}) {
      Dev<float> dx(x), dout(x.size());
      dout.poison();
      float* out = in_place ? dx.p : dout.p;
      ck(k3::cuda::fake_quant_mxfp8_rows(dx.p, out, rows, cols, nullptr), "fake quant");
      ck(cudaDeviceSynchronize(), "sync");
      const std::vector<float> got = in_place ? dx.get() : dout.get();
      int bad = 0, changed = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const bool same = std::isnan(ref[i]) ? std::isnan(got[i]) : std::memcmp(&got[i], &ref[i], 4) == 0;
        bad += !same;
        changed += !(ref[i] == x[i]) && !std::isnan(x[i]);
      }
      EXPECT_EQ(bad, 0) << "cols " << cols << (in_place ? " in place" : "");
      EXPECT_GT(changed, static_cast<int>(got.size() / 4)) << "the rounding changed too few values to be tested";
      std::printf("[ mxfp8 ] fake quant %d x %d%s: %d of %zu differ from the host (%d values rounded)\n", rows, cols,
                  in_place ? " in place" : "", bad, got.size(), changed);
    }
  }
  EXPECT_EQ(k3::cuda::fake_quant_mxfp8_rows(nullptr, nullptr, 2, 48, nullptr), cudaErrorInvalidValue);
}

TEST(CudaMxfp8, RejectsPartialBlocks) {
  if (!have_gpu()) GTEST_SKIP() << "no GPU";
  EXPECT_EQ(k3::cuda::quantize_mxfp8_rows(nullptr, 2, 48, nullptr, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
