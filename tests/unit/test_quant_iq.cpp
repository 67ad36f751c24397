// The codebook i-quant quantisers (quant/iq_pack.h): what their bytes mean, checked against the format
// description (quant_test_ref.h) rather than against the quantiser's own bookkeeping -- every stored point
// is the importance-weighted nearest grid entry under its stored scale and signs (so the index, sign and
// scale bits were written where the decoder reads them), the signs are x's but for the parity rule, and
// the errors stay under llama.cpp's on the same kind of rows. The round trips of all formats and the
// bad-input errors are in test_quant_formats.cpp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <random>
#include <vector>

#include "k3/core/weight.h"
#include "k3/quant/gguf_quant.h"
#include "k3/quant/iq_tables.h"
#include "quant_test_ref.h"

namespace {

using k3::WeightFormat;
using k3test::iq_f16;
using k3test::u16le;
using k3test::u32le;

std::vector<float> gaussian(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// exp(N(0, 1)) per column, as scripts/peer/ggml_quant_oracle.cpp's rms mode writes (a few columns far
// above the rest, as real imatrices have).
std::vector<float> lognormal(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = std::exp(nd(rng));
  return v;
}

// The magnitude grid of a sign + magnitude format: entries, weights per entry, entry k's magnitude i.
struct Grid {
  int entries, dims;
  uint64_t (*entry)(int);
  int mag(int k, int i) const { return static_cast<int>((entry(k) >> (8 * i)) & 0xFF); }
};
Grid grid_of(WeightFormat f) {
  namespace q = k3::quant;
  switch (f) {
    case WeightFormat::IQ2_XXS: return {256, 8, [](int k) { return q::kIq2xxsGrid[k]; }};
    case WeightFormat::IQ2_XS: return {512, 8, [](int k) { return q::kIq2xsGrid[k]; }};
    case WeightFormat::IQ2_S: return {1024, 8, [](int k) { return q::kIq2sGrid[k]; }};
    case WeightFormat::IQ3_XXS: return {256, 4, [](int k) { return uint64_t{q::kIq3xxsGrid[k]}; }};
    default: return {512, 4, [](int k) { return uint64_t{q::kIq3sGrid[k]}; }};  // IQ3_S
  }
}

// The multiplier of the grid magnitudes at element e of block b (the format's d and sub-scale, read from
// the layout of block_decode_iq.h independently of the quantiser).
double point_multiplier(WeightFormat f, const uint8_t* b, int e) {
  const int ib = e / 32, half = (e % 32) / 16;
  const double d = iq_f16(u16le(b));
  switch (f) {
    case WeightFormat::IQ2_XXS: return d * (0.5 + (u32le(b + 6 + 8 * ib) >> 28)) / 4;
    case WeightFormat::IQ2_XS: return d * (0.5 + ((b[66 + ib] >> (4 * half)) & 15)) / 4;
    case WeightFormat::IQ2_S: return d * (0.5 + ((b[74 + ib] >> (4 * half)) & 15)) / 4;
    case WeightFormat::IQ3_XXS: return d * (0.5 + (u32le(b + 66 + 4 * ib) >> 28)) / 2;
    default: return d * (1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15));  // IQ3_S
  }
}

// IQ1's multiplier and delta at element e.
std::pair<double, double> iq1_scale_delta(WeightFormat f, const uint8_t* b, int e) {
  const int ib = e / 32, l = (e % 32) / 8;
  if (f == WeightFormat::IQ1_S) {
    const unsigned qh = u16le(b + 34 + 2 * ib);
    return {iq_f16(u16le(b)) * (2 * ((qh >> 12) & 7) + 1), qh & 0x8000 ? -0.125 : 0.125};
  }
  unsigned sc[4], h = 0;
  for (int i = 0; i < 4; ++i) sc[i] = u16le(b + 48 + 2 * i), h |= (sc[i] >> 12) << (4 * i);
  const int qh = b[32 + 2 * ib + l / 2] >> (4 * (l % 2));
  return {iq_f16(h) * (2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * (l / 2))) & 7) + 1), qh & 8 ? -0.125 : 0.125};
}

struct Quantised {
  std::vector<uint8_t> bytes;
  std::vector<float> y;
};
Quantised round_trip(WeightFormat f, const std::vector<float>& x, int64_t cols, const float* importance) {
  const int64_t rows = static_cast<int64_t>(x.size()) / cols, rb = k3::row_data_bytes(f, cols);
  Quantised q{std::vector<uint8_t>(static_cast<size_t>(rows * rb)), std::vector<float>(x.size())};
  for (int64_t r = 0; r < rows; ++r) {
    k3::quant::quantize_row(f, x.data() + r * cols, cols, importance, q.bytes.data() + r * rb);
    k3::quant::dequantize_row(f, q.bytes.data() + r * rb, cols, q.y.data() + r * cols);
  }
  return q;
}

// Every point of 4 or 8 weights decodes to the grid entry with the least importance-weighted error under
// its stored multiplier and signs: the magnitude search is exhaustive, so any other entry (an index or
// scale written to the wrong bits, a search that missed) shows up here.
TEST(QuantIq, MagnitudeGridPointsAreTheWeightedNearest) {
  std::mt19937 rng(11);
  const int64_t cols = 1024;
  const auto x = gaussian(static_cast<size_t>(2 * cols), rng);
  const auto imp = lognormal(static_cast<size_t>(cols), rng);
  for (WeightFormat f : {WeightFormat::IQ3_XXS, WeightFormat::IQ3_S, WeightFormat::IQ2_XXS, WeightFormat::IQ2_XS, WeightFormat::IQ2_S}) {
    const Quantised q = round_trip(f, x, cols, imp.data());
    const Grid g = grid_of(f);
    const int bb = k3::weight_layout(f).block_bytes;
    int worse = 0, points = 0;
    for (size_t e0 = 0; e0 < x.size(); e0 += static_cast<size_t>(g.dims), ++points) {
      const uint8_t* b = q.bytes.data() + (e0 / 256) * static_cast<size_t>(bb);
      const double mu = point_multiplier(f, b, static_cast<int>(e0 % 256));
      auto err_of = [&](auto value) {
        double s = 0;
        for (int i = 0; i < g.dims; ++i) {
          const double e = x[e0 + i] - value(i);
          s += imp[(e0 + i) % cols] * e * e;
        }
        return s;
      };
      const double stored = err_of([&](int i) { return double(q.y[e0 + i]); }), scale = err_of([](int) { return 0.0; });
      double best = INFINITY;
      for (int k = 0; k < g.entries; ++k)
        best = std::min(best, err_of([&](int i) { return std::copysign(mu * g.mag(k, i), double(q.y[e0 + i])); }));
      worse += stored > best + 1e-5 * scale;  // the search sums in float: ties within its rounding
    }
    EXPECT_EQ(worse, 0) << k3::weight_format_name(f) << ": " << worse << " of " << points << " points not the nearest entry";
  }
}

// IQ1's index is a candidate list around the rounded point, not exhaustive: nearly every group of 8 still
// gets the weighted-nearest of all 2048 entries under its stored multiplier and delta, and the rest lose
// little.
TEST(QuantIq, Iq1PointsAreNearlyTheWeightedNearest) {
  std::mt19937 rng(12);
  const int64_t cols = 1024;
  const auto x = gaussian(static_cast<size_t>(2 * cols), rng);
  const auto imp = lognormal(static_cast<size_t>(cols), rng);
  for (WeightFormat f : {WeightFormat::IQ1_S, WeightFormat::IQ1_M}) {
    const Quantised q = round_trip(f, x, cols, imp.data());
    const int bb = k3::weight_layout(f).block_bytes;
    int optimal = 0, points = 0;
    double stored_sum = 0, best_sum = 0;
    for (size_t e0 = 0; e0 < x.size(); e0 += 8, ++points) {
      const auto [dl, delta] = iq1_scale_delta(f, q.bytes.data() + (e0 / 256) * static_cast<size_t>(bb), static_cast<int>(e0 % 256));
      double stored = 0, best = INFINITY;
      for (int i = 0; i < 8; ++i) stored += imp[(e0 + i) % cols] * std::pow(x[e0 + i] - double(q.y[e0 + i]), 2);
      for (int k = 0; k < 2048; ++k) {
        double s = 0;
        for (int i = 0; i < 8; ++i)
          s += imp[(e0 + i) % cols] * std::pow(x[e0 + i] - dl * (static_cast<int8_t>(k3::quant::kIq1sGrid[k] >> (8 * i)) + delta), 2);
        best = std::min(best, s);
      }
      ASSERT_GE(stored, best * (1 - 1e-6)) << "point " << points << ": the stored values are not a grid entry";
      optimal += stored <= best * (1 + 1e-5);
      stored_sum += stored, best_sum += best;
    }
    std::printf("[ iq1 ] %s: %d of %d groups the weighted-nearest entry; error %.4f x the exhaustive search's\n",
                k3::weight_format_name(f), optimal, points, stored_sum / best_sum);
    EXPECT_GT(optimal, points * 0.97) << k3::weight_format_name(f);
    EXPECT_LT(stored_sum, best_sum * 1.01) << k3::weight_format_name(f);
  }
}

// Signs are x's; with the 7-bit sign codes (IQ2_XXS, IQ2_XS, IQ3_XXS: an even number of negated weights per
// 8) exactly one weight of each 8 with an odd number of negative values is stored with the other sign.
TEST(QuantIq, SignsFollowTheValuesAndTheParityRule) {
  std::mt19937 rng(13);
  const int64_t cols = 2048;
  const auto x = gaussian(static_cast<size_t>(cols), rng);
  for (WeightFormat f : {WeightFormat::IQ3_XXS, WeightFormat::IQ3_S, WeightFormat::IQ2_XXS, WeightFormat::IQ2_XS, WeightFormat::IQ2_S}) {
    const bool parity = f == WeightFormat::IQ3_XXS || f == WeightFormat::IQ2_XXS || f == WeightFormat::IQ2_XS;
    for (int with_importance = 0; with_importance < 2; ++with_importance) {
      const auto imp = lognormal(static_cast<size_t>(cols), rng);
      const Quantised q = round_trip(f, x, cols, with_importance ? imp.data() : nullptr);
      int bad = 0;
      for (size_t u = 0; u < x.size(); u += 8) {
        int negative = 0, flipped = 0;
        for (size_t i = u; i < u + 8; ++i) negative += x[i] < 0, flipped += std::signbit(x[i]) != std::signbit(q.y[i]);
        bad += flipped != (parity ? negative % 2 : 0);
      }
      EXPECT_EQ(bad, 0) << k3::weight_format_name(f) << (with_importance ? " with" : " without") << " importance";
    }
  }
}

// Importance-weighted relative RMS error, sqrt(sum w e^2 / sum w x^2), with a log-normal importance
// vector, below llama.cpp's (ggml_quantize_chunk with the same kind of imatrix, measured on 256 rows of 4096:
// scripts/peer/ggml_quant_oracle.cpp rms, docs/quantization.md). By hand: K3_QUANT_RMS_ROWS and
// K3_QUANT_RMS_IMPORTANCE (the oracle's files) compare the two on the very same rows and weights.
TEST(QuantRms, CodebookRowsWithImportance) {
  struct Bound {
    WeightFormat f;
    double llama_weighted;
  };
  std::mt19937 rng(3);
  const int64_t cols = 4096;
  std::vector<float> x = gaussian(static_cast<size_t>(16 * cols), rng), imp = lognormal(static_cast<size_t>(cols), rng);
  auto read_floats = [](const char* file, std::vector<float>& v, int64_t multiple) {
    std::ifstream in(file, std::ios::binary | std::ios::ate);
    ASSERT_TRUE(in) << file;
    v.resize(static_cast<size_t>(in.tellg() / (4 * multiple) * multiple));
    ASSERT_FALSE(v.empty()) << file;
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  };
  if (const char* f = std::getenv("K3_QUANT_RMS_ROWS"); f && *f) read_floats(f, x, cols);
  if (const char* f = std::getenv("K3_QUANT_RMS_IMPORTANCE"); f && *f) read_floats(f, imp, cols);
  ASSERT_EQ(imp.size(), static_cast<size_t>(cols));
  for (const Bound& b : {Bound{WeightFormat::IQ3_XXS, 0.15356}, Bound{WeightFormat::IQ3_S, 0.11991}, Bound{WeightFormat::IQ2_XXS, 0.29690},
                         Bound{WeightFormat::IQ2_XS, 0.25945}, Bound{WeightFormat::IQ2_S, 0.22466}, Bound{WeightFormat::IQ1_S, 0.43999},
                         Bound{WeightFormat::IQ1_M, 0.38969}}) {
    const Quantised q = round_trip(b.f, x, cols, imp.data());
    double se = 0, sx = 0, wse = 0, wsx = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = (double(x[i]) - q.y[i]) * (double(x[i]) - q.y[i]), w = imp[i % cols];
      se += e, sx += double(x[i]) * x[i], wse += w * e, wsx += w * double(x[i]) * x[i];
    }
    const double weighted = std::sqrt(wse / wsx);
    std::printf("[ quant rms ] %-7s with importance: rel RMS %.5f, weighted %.5f (llama.cpp's weighted %.5f)\n",
                k3::weight_format_name(b.f), std::sqrt(se / sx), weighted, b.llama_weighted);
    EXPECT_LT(weighted, b.llama_weighted) << k3::weight_format_name(b.f);
  }
}

// By hand (docs/quantization.md's speed table, beside `ggml_quant_oracle speed 64 4096 2`): M weights/s of
// quantize_row on one thread's CPU time (the box is shared: wall time would count other processes' turns),
// 64 Gaussian rows of 4096 with a log-normal importance vector, the best of 2 runs.
// `k3_tests --gtest_also_run_disabled_tests --gtest_filter=QuantBench.DISABLED_CodebookQuantiserSpeed`
TEST(QuantBench, DISABLED_CodebookQuantiserSpeed) {
  std::mt19937 rng(1);
  const int64_t cols = 4096, rows = 64;
  const auto x = gaussian(static_cast<size_t>(rows * cols), rng);
  const auto imp = lognormal(static_cast<size_t>(cols), rng);
  auto cpu_seconds = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
  };
  for (WeightFormat f : k3test::kCodebookFormats) {
    const int64_t rb = k3::row_data_bytes(f, cols);
    std::vector<uint8_t> q(static_cast<size_t>(rows * rb));
    double best = INFINITY;
    for (int rep = 0; rep < 2; ++rep) {
      const double t0 = cpu_seconds();
      for (int64_t r = 0; r < rows; ++r) k3::quant::quantize_row(f, x.data() + r * cols, cols, imp.data(), q.data() + r * rb);
      best = std::min(best, cpu_seconds() - t0);
    }
    std::printf("[ quant speed ] %-7s %6.2f M weights/s (one thread's CPU time, importance)\n", k3::weight_format_name(f),
                double(rows * cols) / best / 1e6);
  }
}

}  // namespace
