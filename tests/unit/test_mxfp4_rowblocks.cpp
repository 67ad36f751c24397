// The 16-row MXFP4 repack and its one-token product (backend/cpu/mxfp4_rowblocks.h) against float64: with the
// activations quantised the way the header states (re-derived here: one scale per 32 values, round to nearest), the
// result must equal the float64 sum to fp32 rounding; against the unquantised x, within the quantisation's bound. Both
// MXFP4 layouts (HF and ggml's blocks) give the same repack; row-block ranges write only their rows; a NaN in x or an
// E8M0 255 gives NaN; bad shapes throw.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/core/error.h"

namespace {

using k3::WeightFormat;
using k3::WeightMatrix;
using k3::cpu::Mxfp4RowBlocks;

const double kE2M1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};

struct HfMxfp4 {
  int64_t rows, cols;
  std::vector<uint8_t> packed, scales;
  WeightMatrix view() const {
    WeightMatrix w;
    w.format = WeightFormat::MXFP4;
    w.data = packed.data();
    w.scales = scales.data();
    w.rows = rows;
    w.cols = cols;
    return w;
  }
  int code(int64_t r, int64_t c) const {
    const uint8_t b = packed[static_cast<size_t>(r * cols / 2 + c / 2)];
    return c % 2 ? b >> 4 : b & 15;
  }
  int scale(int64_t r, int64_t c) const { return scales[static_cast<size_t>(r * cols / 32 + c / 32)]; }
};

HfMxfp4 random_hf(int64_t rows, int64_t cols, uint64_t seed, int lo = 112, int span = 24) {
  HfMxfp4 m{rows, cols, std::vector<uint8_t>(static_cast<size_t>(rows * cols / 2)),
            std::vector<uint8_t>(static_cast<size_t>(rows * cols / 32))};
  std::mt19937_64 g(seed);
  for (auto& b : m.packed) b = static_cast<uint8_t>(g());
  for (auto& s : m.scales) s = static_cast<uint8_t>(lo + static_cast<int>(g() % static_cast<uint64_t>(span)));
  return m;
}

// ggml's block layout of the same values: {e8m0, qs[16]}, element j low nibble of qs[j], j + 16 its high nibble.
std::vector<uint8_t> to_ggml(const HfMxfp4& m) {
  std::vector<uint8_t> out(static_cast<size_t>(m.rows * m.cols / 32 * 17));
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t g = 0; g < m.cols / 32; ++g) {
      uint8_t* blk = out.data() + (r * (m.cols / 32) + g) * 17;
      blk[0] = static_cast<uint8_t>(m.scale(r, g * 32));
      for (int j = 0; j < 16; ++j)
        blk[1 + j] = static_cast<uint8_t>(m.code(r, g * 32 + j) | (m.code(r, g * 32 + j + 16) << 4));
    }
  return out;
}

std::vector<float> random_x(int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(g) * (g() % 7 == 0 ? 20.f : 1.f);  // some groups with an outlier
  return x;
}

// The header's quantisation, re-derived: m = max |x| a group, q = nearest-even of x x (127 / m), d = m / 127.
void quantise(const std::vector<float>& x, std::vector<double>& xq, std::vector<double>& bound_d) {
  const size_t groups = x.size() / 32;
  xq.assign(x.size(), 0.0);
  bound_d.assign(groups, 0.0);
  for (size_t g = 0; g < groups; ++g) {
    float mx = 0.f;
    for (int k = 0; k < 32; ++k) mx = std::max(mx, std::fabs(x[g * 32 + k]));
    const float d = mx / 127.f, inv = mx > 0.f ? 127.f / mx : 0.f;
    bound_d[g] = d;
    for (int k = 0; k < 32; ++k) xq[g * 32 + k] = static_cast<double>(std::nearbyint(x[g * 32 + k] * inv)) * d;
  }
}

bool cpu_ok() { return k3::cpu::mxfp4_rowblocks_cpu_ok(); }

TEST(Mxfp4RowBlocks, BothLayoutsRepackAlike) {
  const HfMxfp4 m = random_hf(48, 96, 1);
  const std::vector<uint8_t> gg = to_ggml(m);
  WeightMatrix wg;
  wg.format = WeightFormat::MXFP4_GGML;
  wg.data = gg.data();
  wg.rows = m.rows;
  wg.cols = m.cols;
  ASSERT_TRUE(k3::cpu::mxfp4_rowblocks_supported(m.view()));
  ASSERT_TRUE(k3::cpu::mxfp4_rowblocks_supported(wg));
  const Mxfp4RowBlocks a = k3::cpu::mxfp4_rowblocks(m.view()), b = k3::cpu::mxfp4_rowblocks(wg);
  EXPECT_EQ(a.quads, b.quads);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.quads.size() + a.scales.size(), m.packed.size() + m.scales.size());  // the same bytes
  // The layout the header states: quad q of group g of block b, byte s = rows s / 4 and s / 4 + 8 of column s % 4.
  for (int64_t blk = 0; blk < 3; ++blk)
    for (int64_t g = 0; g < 3; ++g)
      for (int q = 0; q < 8; ++q)
        for (int s = 0; s < 32; ++s) {
          const int64_t r = 16 * blk + s / 4, c = 32 * g + 4 * q + s % 4;
          const uint8_t byte = a.quads[static_cast<size_t>(((blk * 3 + g) * 8 + q) * 32 + s)];
          ASSERT_EQ(byte & 15, m.code(r, c)) << blk << " " << g << " " << q << " " << s;
          ASSERT_EQ(byte >> 4, m.code(r + 8, c)) << blk << " " << g << " " << q << " " << s;
        }
}

TEST(Mxfp4RowBlocks, OneTokenMatchesFloat64) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks the avx512bf16 tier's features";
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 32}, {48, 96}, {256, 2304}}) {
    const HfMxfp4 m = random_hf(rows, cols, 7 + rows);
    const Mxfp4RowBlocks rb = k3::cpu::mxfp4_rowblocks(m.view());
    const std::vector<float> x = random_x(cols, 3 + cols);
    std::vector<double> xq, d;
    quantise(x, xq, d);
    std::vector<float> y(static_cast<size_t>(rows), std::nanf(""));
    k3::cpu::Mxfp4GroupActs acts;
    k3::cpu::mxfp4_rowblocks_quantise(x.data(), cols, acts);
    k3::cpu::mxfp4_rowblocks_one_token(rb, acts, 0, rows / 16, y.data());
    double worst_q = 0, worst_x = 0;
    for (int64_t r = 0; r < rows; ++r) {
      double sq = 0, sx = 0, mag = 0, qbound = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const double w = kE2M1[m.code(r, c)] * std::ldexp(1.0, m.scale(r, c) - 127);
        sq += w * xq[static_cast<size_t>(c)];
        sx += w * x[static_cast<size_t>(c)];
        mag += std::fabs(w * xq[static_cast<size_t>(c)]);
        qbound += std::fabs(w) * d[static_cast<size_t>(c / 32)] / 2;  // |x - xq| <= d / 2
      }
      ASSERT_TRUE(std::isfinite(y[static_cast<size_t>(r)])) << r;
      // Against the quantised x: the int32 dots are exact, so only fp32 rounding of the per-group products and the sum.
      const double eq = std::fabs(y[static_cast<size_t>(r)] - sq), tol_q = 1e-6 * mag + 1e-30;
      EXPECT_LE(eq, tol_q) << rows << "x" << cols << " row " << r;
      EXPECT_LE(std::fabs(y[static_cast<size_t>(r)] - sx), qbound * 1.0001 + tol_q) << rows << "x" << cols << " row " << r;
      worst_q = std::max(worst_q, eq / (mag + 1e-30));
      worst_x = std::max(worst_x, std::fabs(y[static_cast<size_t>(r)] - sx) / (qbound + 1e-30));
    }
    std::printf("[ mxfp4 rb16 ] %lldx%lld: vs quantised x %.2e of sum |w x|, vs x %.2f of the quantisation bound\n",
                static_cast<long long>(rows), static_cast<long long>(cols), worst_q, worst_x);
  }
}

TEST(Mxfp4RowBlocks, RowBlockRangeWritesOnlyItsRows) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks the avx512bf16 tier's features";
  const HfMxfp4 m = random_hf(64, 64, 21);
  const Mxfp4RowBlocks rb = k3::cpu::mxfp4_rowblocks(m.view());
  const std::vector<float> x = random_x(64, 22);
  k3::cpu::Mxfp4GroupActs acts;
  k3::cpu::mxfp4_rowblocks_quantise(x.data(), 64, acts);
  std::vector<float> all(64), part(64, -7.f);
  k3::cpu::mxfp4_rowblocks_one_token(rb, acts, 0, 4, all.data());
  k3::cpu::mxfp4_rowblocks_one_token(rb, acts, 1, 3, part.data());
  for (int r = 0; r < 64; ++r) {
    if (r >= 16 && r < 48)
      EXPECT_EQ(std::memcmp(&part[static_cast<size_t>(r)], &all[static_cast<size_t>(r)], 4), 0) << r;  // the same bits
    else
      EXPECT_EQ(part[static_cast<size_t>(r)], -7.f) << r;
  }
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_one_token(rb, acts, 0, 5, part.data()), k3::Error);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_one_token(rb, acts, 3, 2, part.data()), k3::Error);
  k3::cpu::Mxfp4GroupActs narrow;
  k3::cpu::mxfp4_rowblocks_quantise(x.data(), 32, narrow);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_one_token(rb, narrow, 0, 1, part.data()), k3::Error);
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks_quantise(x.data(), 40, narrow), k3::Error);
}

TEST(Mxfp4RowBlocks, NonFiniteInputsGiveNan) {
  if (!cpu_ok()) GTEST_SKIP() << "this CPU lacks the avx512bf16 tier's features";
  HfMxfp4 m = random_hf(32, 64, 31);
  m.scales[static_cast<size_t>(5 * 2 + 1)] = 255;  // row 5, group 1: NaN
  m.scales[static_cast<size_t>(6 * 2)] = 0;        // row 6: the smallest scales (denormal 2^-128 x codes) stay finite
  m.scales[static_cast<size_t>(7 * 2)] = 1;
  const Mxfp4RowBlocks rb = k3::cpu::mxfp4_rowblocks(m.view());
  std::vector<float> x = random_x(64, 32), y(32);
  k3::cpu::Mxfp4GroupActs acts;
  auto run = [&] {
    k3::cpu::mxfp4_rowblocks_quantise(x.data(), 64, acts);
    k3::cpu::mxfp4_rowblocks_one_token(rb, acts, 0, 2, y.data());
  };
  run();
  for (int r = 0; r < 32; ++r) EXPECT_EQ(std::isnan(y[static_cast<size_t>(r)]), r == 5) << r;
  x[40] = std::nanf("");
  run();
  for (int r = 0; r < 32; ++r) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(r)])) << r;
  x[40] = INFINITY;
  run();
  for (int r = 0; r < 32; ++r) EXPECT_TRUE(std::isnan(y[static_cast<size_t>(r)])) << r;
}

TEST(Mxfp4RowBlocks, RefusesShapesItCannotRepack) {
  const HfMxfp4 m = random_hf(48, 96, 41);
  WeightMatrix w = m.view();
  w.rows = 40;  // not a multiple of 16
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_supported(w));
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks(w), k3::Error);
  w = m.view();
  w.cols = 80;  // not a multiple of 32
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_supported(w));
  w = m.view();
  w.format = WeightFormat::BF16;
  EXPECT_FALSE(k3::cpu::mxfp4_rowblocks_supported(w));
  EXPECT_THROW(k3::cpu::mxfp4_rowblocks(w), k3::Error);
}

}  // namespace
