// The CPU kernels of GGUF's block formats (backend/cpu/weight_kernels_quant*.cpp) on every tier this CPU
// runs: matmul (row dot for one token, the register-blocked gemm for more: avx2 tiles of 6 tokens, avx512
// and avx512bf16 of 12, with their token tails and column blocks; threads above the parallel thresholds)
// against a float64 reference built from quant_test_ref.h's decoder, and batch invariance (a token's
// outputs have the same bits alone or in a batch: the contract of weight_kernels.h).
//
// Tolerance: in the exact tiers (avx2, avx512) the products are exact fp32 products of the decoded weights
// and the activations, accumulated in fp32, so each output is within C * 2^-24 * sum |w x| of the exact dot
// (the recursive-summation bound; the decoded weight itself is the exact value rounded once, another 2^-24
// relative per term: (C + 2) u). The avx512bf16 tier (weight_kernels_quant_vnni.cpp) rounds the
// activations to int8 with one scale per quad of 4 consecutive values (d <= max|x| / 127 (1 + 2^-23) +
// 2^-149, |x' - x| <= d/2 (1 + 2^-16)) and multiplies them by the weights' scale parts (value + sub-min; the
// sub-min itself meets the unrounded activations; avx2int8 does the same for Q8_0, Q4_K, Q5_K and Q6_K,
// weight_kernels_avx2int8.cpp): its bound adds rounding_bound below, and the fp32 bound
// covers the scale and min parts' magnitudes, sum (|w| + 2 |min|) |x| + rounding_bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/decode_layout.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/format_dispatch.h"
#include "k3/core/weight.h"
#include "k3/quant/gguf_quant.h"
#include "k3/quant/iq_tables.h"
#include "kernel_test_util.h"
#include "quant_test_ref.h"

namespace {

using k3::WeightFormat;

// What this CPU lacks for the avx512bf16 tier ("" when it can run it).
std::string avx512bf16_missing() {
  return k3::cpu::isa_missing_features(k3::cpu::cpu_state().features, k3::cpu::CpuIsa::Avx512Bf16, false);
}

// The process's tier forced for a test's scope, back to the start-up choice after it.
struct ForcedTier {
  explicit ForcedTier(k3::cpu::CpuIsa isa) { k3::cpu::force_cpu_isa_for_testing(isa); }
  ~ForcedTier() { k3::cpu::force_cpu_isa_for_testing(std::nullopt); }
  ForcedTier(const ForcedTier&) = delete;
  ForcedTier& operator=(const ForcedTier&) = delete;
};

constexpr double kU = 1.0 / (1 << 24);

class QuantKernelsTier : public k3test::CpuTierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, QuantKernelsTier, k3test::kAllCpuTiers, k3test::cpu_tier_name);

struct QuantWeight {
  k3::WeightMatrix W;
  std::vector<uint8_t> bytes;
  std::vector<double> ref;   // [rows][cols]
  std::vector<double> mins;  // [rows][cols]: each value's sub-min (value = scale part - min; 0 without one)
};

// The sub-min of element e of block b (Q4_K / Q5_K: dmin x 6-bit min of its 32; Q2_K: dmin x 4-bit min of its 16).
double ref_min(WeightFormat f, const uint8_t* b, int e) {
  switch (f) {
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K: return k3test::f16_value(b + 2) * k3test::k_scale6(b + 4, e / 32, 1);
    case WeightFormat::Q2_K: return k3test::f16_value(b + 82) * (b[e / 16] >> 4);
    default: return 0;
  }
}

// Scales with f16 exponents 10..20 (about 2^-5 .. 2^5): products stay well inside fp32's normal range.
QuantWeight make_quant_weight(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  const k3::WeightLayout l = k3::weight_layout(f);
  QuantWeight t;
  t.bytes = k3test::random_blocks(f, rows * cols / l.block_elems, rng, 10, 20);
  t.W = k3::WeightMatrix{f, t.bytes.data(), nullptr, rows, cols};
  t.ref.resize(static_cast<size_t>(rows * cols));
  t.mins.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint8_t* block = t.bytes.data() + i / l.block_elems * l.block_bytes;
    t.ref[static_cast<size_t>(i)] = k3test::ref_value(f, block, static_cast<int>(i % l.block_elems));
    t.mins[static_cast<size_t>(i)] = ref_min(f, block, static_cast<int>(i % l.block_elems));
  }
  return t;
}

std::vector<float> activations(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> e(-6, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((rng() & 1 ? 1 : -1) * std::exp2(e(rng)));
  return v;
}

// avx2int8 (weight_kernels_avx2int8.cpp) rounds the same way (int8 quads of 4 consecutive values, the
// sub-min against the unrounded activations; Q4_K / Q5_K / Q6_K per 256, below) for every block format
// (since session 16; before, some kept the exact kernels).
bool tier_rounds_activations(WeightFormat) {
  const k3::cpu::CpuIsa tier = k3::cpu::active_tier_for_testing();
  return tier == k3::cpu::CpuIsa::Avx512Bf16 || tier == k3::cpu::CpuIsa::Amx || tier == k3::cpu::CpuIsa::Avx2Int8;
}

// The per-block K-quant paths: avx2int8's Q4_K, Q5_K and Q6_K, and since session 35 the avx512bf16 / amx tiers' (the
// same numbers: weight_kernels_vnni_k.cpp) round per 256-value block (one scale per block, llama.cpp's Q8_K layout) and
// their sub-mins / offsets meet the ROUNDED activations (sums of q): the whole weight sees the rounding.
bool is_k456(WeightFormat f) { return f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q6_K; }
bool per_block_activations(WeightFormat f) {
  const k3::cpu::CpuIsa tier = k3::cpu::active_tier_for_testing();
  return is_k456(f) && (tier == k3::cpu::CpuIsa::Avx2Int8 || tier == k3::cpu::CpuIsa::Avx512Bf16 || tier == k3::cpu::CpuIsa::Amx);
}

// The activation-rounding bound of the rounding tiers for one row (w, mins) and token x (see the top): per
// group of values sharing a scale d (<= max|x| / 127, rounded up), |x - d q| <= d / 2 times the weight part
// that multiplies the rounded values.
double rounding_bound(const double* w, const double* mins, const float* x, int64_t C, WeightFormat f) {
  const int64_t g = per_block_activations(f) ? 256 : 4;
  const bool whole = per_block_activations(f);
  double b = 0;
  for (int64_t q0 = 0; q0 < C; q0 += g) {
    double amax = 0, sw = 0;
    for (int64_t c = q0; c < q0 + g; ++c) {
      amax = std::max(amax, std::fabs(double(x[c])));
      sw += std::fabs(whole ? w[c] : w[c] + mins[c]);
    }
    const double d = amax / 127 * (1 + std::ldexp(1.0, -23)) + std::ldexp(1.0, -149);
    b += d / 2 * (1 + std::ldexp(1.0, -16)) * sw;
  }
  return b;
}

// y (n tokens of the matmul) against float64 within the tier's bound.
// rounds: add the activation-rounding bound; split_mins: the kernel multiplies scale parts and mins separately.
void check_against_float64(const QuantWeight& t, const std::vector<float>& x, const std::vector<float>& y, int64_t n,
                           bool rounds, bool split_mins, k3test::Worst& worst) {
  const int64_t R = t.W.rows, C = t.W.cols;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < R; ++r) {
      const double* w = &t.ref[static_cast<size_t>(r * C)];
      const double* mins = &t.mins[static_cast<size_t>(r * C)];
      const float* xt = &x[static_cast<size_t>(i * C)];
      double s = 0, sa = 0;
      for (int64_t c = 0; c < C; ++c) {
        s += w[c] * xt[c];
        sa += (std::fabs(w[c]) + (split_mins ? 2 * std::fabs(mins[c]) : 0)) * std::fabs(xt[c]);
      }
      const double q = rounds ? rounding_bound(w, mins, xt, C, t.W.format) : 0;
      const double err = std::fabs(y[static_cast<size_t>(i * R + r)] - s), bound = (C + 2) * kU * (sa + q) + q;
      ASSERT_LE(err, bound) << k3::weight_format_name(t.W.format) << " rows " << R << " cols " << C << " n " << n
                            << " token " << i << " row " << r;
      worst.add(err / bound);
    }
}

void check_quant_matmul(const QuantWeight& t, int64_t n, std::mt19937& rng, k3test::Worst& worst) {
  const int64_t R = t.W.rows, C = t.W.cols;
  const auto x = activations(static_cast<size_t>(n * C), rng);
  std::vector<float> y(static_cast<size_t>(n * R), NAN);
  k3::cpu::matmul(t.W, x.data(), n, y.data());
  check_against_float64(t, x, y, n, tier_rounds_activations(t.W.format), tier_rounds_activations(t.W.format), worst);
  // The gemm entry point (rows of all n tokens at once) gives matmul's bits.
  std::vector<float> yg(static_cast<size_t>(n * R), NAN);
  k3::cpu::row_kernels(t.W.format).gemm(t.W, 0, R, x.data(), n, yg.data());
  ASSERT_EQ(yg, y) << k3::weight_format_name(t.W.format) << " gemm vs matmul, n " << n;
  // Batch invariance: every token alone, and the single-row dot, give the batch's bits.
  for (int64_t i = 0; i < n; ++i) {
    std::vector<float> y1(static_cast<size_t>(R));
    k3::cpu::matmul(t.W, x.data() + i * C, 1, y1.data());
    for (int64_t r = 0; r < R; ++r) {
      ASSERT_EQ(y1[static_cast<size_t>(r)], y[static_cast<size_t>(i * R + r)])
          << k3::weight_format_name(t.W.format) << " token " << i << " of " << n << " row " << r;
      ASSERT_EQ(k3::cpu::row_dot(t.W, r, x.data() + i * C), y1[static_cast<size_t>(r)]);
    }
  }
}

// The tier's row decoder (dequant_row: its SIMD decoders, quant_decode_simd.h) gives the scalar decoder's values bit for
// bit, every block format. Among others this pins the i-quants' sign byte-masks, which the SIMD decoders compute from
// ggml's parity rule instead of reading quant::kIq2Signs.
TEST_P(QuantKernelsTier, DequantRowEqualsScalarDecoder) {
  std::mt19937 rng(17);
  for (WeightFormat f : k3test::kGgufFormats) {
    const int64_t rows = 3, cols = 2 * k3::weight_layout(f).block_elems * 4;
    const QuantWeight q = make_quant_weight(f, rows, cols, rng);
    std::vector<float> got(static_cast<size_t>(cols)), want(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      k3::cpu::dequant_row(q.W, r, got.data());
      k3::quant::dequantize_row(f, q.W.row_data(r), cols, want.data());
      ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << k3::weight_format_name(f) << " row " << r;
    }
  }
}

TEST_P(QuantKernelsTier, MatmulAgainstFloat64AndBatchInvariant) {
  std::mt19937 rng(11);
  for (WeightFormat f : k3test::kGgufFormats) {
    k3test::Worst worst(k3::weight_format_name(f));
    const int64_t E = k3::weight_layout(f).block_elems;
    // Column blocks of the avx512bf16 tier: 3 256-blocks, 32 blocks of the 32-element formats it reads in pairs
    // (Q8_0, Q5_0, Q4_0, IQ4_NL); their odd block counts leave half a unit.
    const bool pairs = f == WeightFormat::Q8_0 || f == WeightFormat::Q5_0 || f == WeightFormat::Q4_0 || f == WeightFormat::IQ4_NL;
    const std::vector<int64_t> block_counts = pairs ? std::vector<int64_t>{1, 3, 35} : std::vector<int64_t>{1, 3, 7};
    for (int64_t blocks : block_counts)
      for (int64_t rows : {1, 5, 33})
        for (int64_t n : {1, 2, 7, 13}) check_quant_matmul(make_quant_weight(f, rows, blocks * E, rng), n, rng, worst);
  }
}

// Big enough for matmul's threads (many rows) and for a gemm row block boundary (avx2: 256 KiB).
TEST_P(QuantKernelsTier, MatmulThreadedLargeMatrix) {
  std::mt19937 rng(13);
  for (WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q8_0}) {
    k3test::Worst worst(k3::weight_format_name(f));
    const auto t = make_quant_weight(f, 1100, 512, rng);
    for (int64_t n : {1, 17}) check_quant_matmul(t, n, rng, worst);
  }
}

// matmul_batch (a token's routed experts in one fork-join) over quantised matrices of different formats
// gives each job the bits of its own matmul.
TEST_P(QuantKernelsTier, MatmulBatchEqualsMatmul) {
  std::mt19937 rng(23);
  std::vector<QuantWeight> ws;
  for (WeightFormat f : {WeightFormat::Q4_K, WeightFormat::IQ2_XXS, WeightFormat::Q8_0, WeightFormat::Q6_K})
    ws.push_back(make_quant_weight(f, 70, 512, rng));
  for (int64_t n : {1, 3}) {
    std::vector<std::vector<float>> xs, ys, refs;
    std::vector<k3::cpu::MatmulJob> jobs;
    for (const QuantWeight& w : ws) {
      xs.push_back(activations(static_cast<size_t>(n * 512), rng));
      ys.emplace_back(static_cast<size_t>(n * 70), NAN);
      refs.emplace_back(static_cast<size_t>(n * 70));
      k3::cpu::matmul(w.W, xs.back().data(), n, refs.back().data());
    }
    for (size_t i = 0; i < ws.size(); ++i) jobs.push_back({&ws[i].W, xs[i].data(), n, ys[i].data()});
    k3::cpu::matmul_batch(jobs);
    for (size_t i = 0; i < ws.size(); ++i) EXPECT_EQ(ys[i], refs[i]) << k3::weight_format_name(ws[i].W.format) << " n " << n;
  }
}

// NaN activations propagate (no kernel skips a product).
TEST_P(QuantKernelsTier, NanActivationGivesNan) {
  std::mt19937 rng(19);
  for (WeightFormat f : k3test::kGgufFormats) {
    const auto t = make_quant_weight(f, 3, k3::weight_layout(f).block_elems * 2, rng);
    auto x = activations(static_cast<size_t>(t.W.cols * 3), rng);
    x[static_cast<size_t>(t.W.cols + 5)] = NAN;  // token 1
    std::vector<float> y(9);
    k3::cpu::matmul(t.W, x.data(), 3, y.data());
    for (int r = 0; r < 3; ++r) {
      EXPECT_FALSE(std::isnan(y[static_cast<size_t>(r)]));
      EXPECT_TRUE(std::isnan(y[static_cast<size_t>(3 + r)])) << k3::weight_format_name(f);
    }
  }
}

// A rounding tier's int8 kernels: they ran (on random activations the results differ from the exact
// tier's), and their only error beyond fp32's is the activations' rounding: on activations that the
// int8 groups hold exactly (each group of `group(f)` values -- 4 for the quads, 256 for avx2int8's per-block
// Q4_K / Q5_K / Q6_K paths -- k x 2^e, |k| <= 127 with one |k| = 127, so d = 2^e and q = k), the plain fp32 bound holds (a
// wrong lane scale, sub-scale, sub-min, group order or correction would break it).
void check_int8_tier(k3::cpu::CpuIsa rounding, k3::cpu::CpuIsa exact, const std::vector<WeightFormat>& formats,
                     size_t (*group)(WeightFormat) = [](WeightFormat) -> size_t { return 4; }) {
  struct TierReset {
    ~TierReset() { k3::cpu::force_cpu_isa_for_testing(std::nullopt); }
  } reset;  // also when an assertion returns early
  std::mt19937 rng(29);
  for (WeightFormat f : formats) {
    k3test::Worst worst(k3::weight_format_name(f));
    const int64_t E = k3::weight_layout(f).block_elems;
    const auto t = make_quant_weight(f, 9, (f == WeightFormat::Q8_0 ? 5 : 2) * E, rng);
    const int64_t C = t.W.cols;
    for (int64_t n : {1, 3}) {
      std::vector<float> x(static_cast<size_t>(n * C));
      std::uniform_int_distribution<int> k_dist(-127, 127), e_dist(-8, 2);
      const size_t g = group(f);
      for (size_t q0 = 0; q0 < x.size(); q0 += g) {
        const int e = e_dist(rng);
        for (size_t c = q0; c < q0 + g; ++c) x[c] = std::ldexp(static_cast<float>(k_dist(rng)), e);
        x[q0 + rng() % g] = std::ldexp(rng() & 1 ? 127.f : -127.f, e);
      }
      std::vector<float> y(static_cast<size_t>(n * 9), NAN);
      k3::cpu::force_cpu_isa_for_testing(rounding);
      k3::cpu::matmul(t.W, x.data(), n, y.data());
      check_against_float64(t, x, y, n, false, true, worst);

      const auto xr = activations(static_cast<size_t>(n * C), rng);
      std::vector<float> y_int8(y.size()), y_exact(y.size());
      k3::cpu::matmul(t.W, xr.data(), n, y_int8.data());
      k3::cpu::force_cpu_isa_for_testing(exact);
      k3::cpu::matmul(t.W, xr.data(), n, y_exact.data());
      k3::cpu::force_cpu_isa_for_testing(std::nullopt);
      EXPECT_NE(y_int8, y_exact) << k3::weight_format_name(f) << " n " << n << ": the " << k3::cpu::isa_name(rounding)
                                 << " tier ran the exact kernels";
    }
  }
}

TEST(QuantKernelsVnni, ExactOnRepresentableActivationsAndDiffersFromExactTier) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx512Bf16, false); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx512bf16 tier (missing: " << m << ")";
  // The 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL: llama-quantize's fallbacks) keep fp32 activations in
  // this tier by design (avx512bf16_quant_row_kernels): the avx512 tier's exact kernels, nothing to tell apart.
  std::vector<WeightFormat> int8_formats;
  for (WeightFormat f : k3test::kGgufFormats)
    if (!k3::is_ggml_32_format(f)) int8_formats.push_back(f);
  ASSERT_GE(int8_formats.size(), 10u);
  check_int8_tier(k3::cpu::CpuIsa::Avx512Bf16, k3::cpu::CpuIsa::Avx512, int8_formats,
                  [](WeightFormat f) -> size_t { return is_k456(f) ? 256 : 4; });  // per block (vnni_k), else quads
}

// The avx512bf16 tier's per-block Q4_K / Q5_K / Q6_K kernels (weight_kernels_vnni_k.cpp) give avx2int8's results bit for
// bit (the same activation quantiser, the same integer sums grouped otherwise, the same fp32 tail): rows and token counts
// off every tile size, several blocks per row, activations with an outlier per block and with an all-zero block, and at
// one token through the prefetching row loop. Needs both tiers (an AVX-512 CPU runs avx2int8 too).
TEST(QuantKernelsVnniK, PerBlockPathEqualsAvx2Int8BitForBit) {
  const auto& cpu = k3::cpu::cpu_state();
  for (const auto isa : {k3::cpu::CpuIsa::Avx512Bf16, k3::cpu::CpuIsa::Avx2Int8})
    if (const std::string m = k3::cpu::isa_missing_features(cpu.features, isa, false); !m.empty())
      GTEST_SKIP() << "this CPU cannot run the " << k3::cpu::isa_name(isa) << " tier (missing: " << m << ")";
  struct TierReset {
    ~TierReset() { k3::cpu::force_cpu_isa_for_testing(std::nullopt); }
  } reset;
  std::mt19937 rng(41);
  for (WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 256}, {19, 2304}, {5, 4096}, {70, 768}}) {
      const auto t = make_quant_weight(f, rows, cols, rng);
      for (int64_t n : {1, 2, 3, 7, 8, 9, 17}) {
        auto x = activations(static_cast<size_t>(n * cols), rng);
        x[static_cast<size_t>(rng() % x.size())] = 4000.f;  // an outlier: its block's scale is coarse
        if (cols >= 512 && n >= 2)
          std::fill(x.begin() + cols + 256, x.begin() + cols + 512, 0.f);  // token 1's second block all zero: d = 0
        std::vector<float> y512(static_cast<size_t>(n * rows), NAN), y2(y512.size(), NAN), yx(y512.size(), NAN);
        k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx512Bf16);
        k3::cpu::matmul(t.W, x.data(), n, y512.data());
        k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx2Int8);
        k3::cpu::matmul(t.W, x.data(), n, y2.data());
        k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx512);
        k3::cpu::matmul(t.W, x.data(), n, yx.data());
        EXPECT_EQ(0, std::memcmp(y512.data(), y2.data(), y2.size() * sizeof(float)))
            << k3::weight_format_name(f) << " " << rows << " x " << cols << " n " << n;
        EXPECT_NE(y512, yx) << k3::weight_format_name(f) << ": the avx512bf16 tier ran the exact kernels";
      }
    }
}

// The avx512bf16 tier's Q5_0 product (llama-quantize's fallback for rows not whole 256-blocks; its pairs of blocks
// through unit_nibble_pair since session 49, a lone last block through the exact decoder into the Q8 sink) against its
// Q8_0 pair unit on a Q8_0 matrix holding the same quants (q - 16, the fifth bits included) and the same d: bit for
// bit, at one and several tokens, even and odd block counts. A fifth bit read from the wrong position, or a d from the
// wrong block, fails it (checked in session 46 with a dedicated Q5_0 pair unit whose bits were shifted by one).
TEST(QuantKernelsVnni, Q5_0PairEqualsQ8_0OfTheSameQuantsBitForBit) {
  if (const std::string m = avx512bf16_missing(); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx512bf16 tier (missing: " << m << ")";
  const ForcedTier tier(k3::cpu::CpuIsa::Avx512Bf16);
  std::mt19937 rng(46);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{33, 128}, {9, 96}, {17, 4096}}) {
    const int64_t blocks = rows * cols / 32;
    std::vector<uint8_t> q5(static_cast<size_t>(blocks * 22)), q8(static_cast<size_t>(blocks * 34));
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* p5 = &q5[static_cast<size_t>(b * 22)];
      uint8_t* p8 = &q8[static_cast<size_t>(b * 34)];
      const uint16_t d = static_cast<uint16_t>(0x2000 + rng() % 0x800);  // fp16 d in [2^-7, 2^-6)
      std::memcpy(p5, &d, 2);
      std::memcpy(p8, &d, 2);
      for (int i = 2; i < 22; ++i) p5[i] = static_cast<uint8_t>(rng());
      uint32_t qh;
      std::memcpy(&qh, p5 + 2, 4);
      for (int i = 0; i < 32; ++i) {  // ggml's Q5_0: value i = (nibble i | bit i of qh << 4) - 16, low nibbles first
        const int nib = i < 16 ? (p5[6 + i] & 15) : (p5[6 + i - 16] >> 4);
        p8[2 + i] = static_cast<uint8_t>(static_cast<int8_t>((nib | ((qh >> i) & 1) << 4) - 16));
      }
    }
    const k3::WeightMatrix W5{WeightFormat::Q5_0, q5.data(), nullptr, rows, cols}, W8{WeightFormat::Q8_0, q8.data(), nullptr, rows, cols};
    for (int64_t n : {1, 3, 9}) {
      auto x = activations(static_cast<size_t>(n * cols), rng);
      std::vector<float> y5(static_cast<size_t>(n * rows), NAN), y8(y5.size(), NAN);
      k3::cpu::matmul(W5, x.data(), n, y5.data());
      k3::cpu::matmul(W8, x.data(), n, y8.data());
      EXPECT_EQ(0, std::memcmp(y5.data(), y8.data(), y5.size() * sizeof(float))) << rows << " x " << cols << " n " << n;
      EXPECT_TRUE(std::isfinite(y5[0]));
    }
  }
}

// The avx512bf16 tier's one-token product of the pair formats (Q8_0, Q5_0, Q4_0, IQ4_NL; weight_kernels_quant_vnni.cpp's
// pair_one_token_rows since session 49: the +128 offset on the weights against a per-token correction, rows of up to 4
// blocks unrolled, 64-byte loads but for a matrix's last row, sums 16 rows at a time; Q8_0 past 4 blocks keeps Q8Acc,
// its sums 16 at a time too) against the path it replaced at one token, which the several-token tiles still run: a
// Q8_0 matrix holding the same quants and d (its pair unit, the activation-offset correction of Q8Acc, one
// _mm512_reduce_add_ps per row), token 0 of two. Bit for bit, on random
// non-zero weights and activations, over 1 to 6 blocks (the unrolled widths, 128 columns among them: the KDA gates'
// f_b / g_b) and 35 (the general loop, a lone last block), row counts that end mid 16-row group, and a 4096 x 128 pair
// through matmul_batch (linear_batch's decode path, over the pool's threads).
TEST(QuantKernelsVnni, PairFormatsOneTokenEqualQ8_0TilesBitForBit) {
  if (const std::string m = avx512bf16_missing(); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx512bf16 tier (missing: " << m << ")";
  const ForcedTier tier(k3::cpu::CpuIsa::Avx512Bf16);
  std::mt19937 rng(49);
  // Blocks of format f and a Q8_0 copy of their quants and d: rows x cols.
  auto make = [&](WeightFormat f, int64_t rows, int64_t cols, std::vector<uint8_t>& fb, std::vector<uint8_t>& q8) {
    const int64_t blocks = rows * cols / 32, bb = k3::weight_layout(f).block_bytes;
    fb.assign(static_cast<size_t>(blocks * bb), 0);
    q8.assign(static_cast<size_t>(blocks * 34), 0);
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t* pf = &fb[static_cast<size_t>(b * bb)];
      uint8_t* p8 = &q8[static_cast<size_t>(b * 34)];
      const uint16_t d = static_cast<uint16_t>(0x2000 + rng() % 0x1000);  // fp16 d in [2^-7, 2^-5)
      std::memcpy(pf, &d, 2);
      std::memcpy(p8, &d, 2);
      for (int64_t i = 2; i < bb; ++i) pf[i] = static_cast<uint8_t>(rng());
      for (int i = 0; i < 32; ++i) {
        int q = 0;
        if (f == WeightFormat::Q8_0) {
          q = static_cast<int8_t>(pf[2 + i]);
        } else {
          const uint8_t* qs = pf + (f == WeightFormat::Q5_0 ? 6 : 2);
          const int nib = i < 16 ? (qs[i] & 15) : (qs[i - 16] >> 4);
          if (f == WeightFormat::Q5_0) {
            uint32_t qh;
            std::memcpy(&qh, pf + 2, 4);
            q = (nib | ((qh >> i) & 1) << 4) - 16;
          } else {
            q = f == WeightFormat::Q4_0 ? nib - 8 : k3::quant::kIq4nlValues[nib];
          }
        }
        p8[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
    }
  };
  for (WeightFormat f : {WeightFormat::Q8_0, WeightFormat::Q5_0, WeightFormat::Q4_0, WeightFormat::IQ4_NL})
    for (int64_t blocks : {1, 2, 3, 4, 5, 6, 35})
      for (int64_t rows : {1, 17, 40}) {
        const int64_t cols = 32 * blocks;
        std::vector<uint8_t> fb, q8;
        make(f, rows, cols, fb, q8);
        const k3::WeightMatrix W{f, fb.data(), nullptr, rows, cols}, W8{WeightFormat::Q8_0, q8.data(), nullptr, rows, cols};
        const auto x = activations(static_cast<size_t>(2 * cols), rng);  // +-2^[-6, 3): never 0
        std::vector<float> y(static_cast<size_t>(rows), NAN), y8(static_cast<size_t>(2 * rows), NAN);
        k3::cpu::matmul(W, x.data(), 1, y.data());
        k3::cpu::matmul(W8, x.data(), 2, y8.data());
        ASSERT_EQ(0, std::memcmp(y.data(), y8.data(), y.size() * sizeof(float)))
            << k3::weight_format_name(f) << " " << rows << " x " << cols;
        ASSERT_TRUE(std::isfinite(y[0]));
      }
  for (WeightFormat f : {WeightFormat::Q5_0, WeightFormat::IQ4_NL}) {
    constexpr int64_t rows = 4096, cols = 128;
    std::vector<uint8_t> fb[2], q8[2];
    std::vector<float> x[2], y[2], y8[2];
    std::vector<k3::cpu::MatmulJob> jobs;
    std::vector<k3::WeightMatrix> Ws;
    Ws.reserve(2);
    for (int j = 0; j < 2; ++j) {
      make(f, rows, cols, fb[j], q8[j]);
      Ws.push_back(k3::WeightMatrix{f, fb[j].data(), nullptr, rows, cols});
      x[j] = activations(static_cast<size_t>(2 * cols), rng);
      y[j].assign(rows, NAN);
      y8[j].assign(2 * rows, NAN);
      jobs.push_back({&Ws[static_cast<size_t>(j)], x[j].data(), 1, y[j].data()});
    }
    k3::cpu::matmul_batch(jobs);
    for (int j = 0; j < 2; ++j) {
      const k3::WeightMatrix W8{WeightFormat::Q8_0, q8[j].data(), nullptr, rows, cols};
      k3::cpu::matmul(W8, x[j].data(), 2, y8[j].data());
      EXPECT_EQ(0, std::memcmp(y[j].data(), y8[j].data(), y[j].size() * sizeof(float))) << k3::weight_format_name(f) << " job " << j;
    }
  }
}

// Q4_K's 16-row decode layout (backend/cpu/decode_layout.h), which the avx512bf16 tier's one-token product reads when a
// matrix has it, gives the stored rows' bits: whole matrices and row ranges that start and end inside a group (the
// rows outside whole groups read stored), several blocks, an outlier activation (a coarse block scale) and an all-zero
// block (d = 0). It must read the copy: one quant changed in the copy changes that row's output and no other.
TEST(QuantKernelsVnniK, Q4KDecodeLayoutEqualsStoredRowsBitForBit) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx512Bf16, false); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx512bf16 tier (missing: " << m << ")";
  struct TierReset {
    ~TierReset() { k3::cpu::force_cpu_isa_for_testing(std::nullopt); }
  } reset;
  k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx512Bf16);
  const k3::cpu::RowKernels& k = k3::cpu::row_kernels(WeightFormat::Q4_K);
  ASSERT_NE(k.rows, nullptr);
  std::mt19937 rng(44);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{16, 256}, {37, 2304}, {64, 4096}, {48, 768}}) {
    auto t = make_quant_weight(WeightFormat::Q4_K, rows, cols, rng);
    const int64_t bytes = k3::cpu::decode_layout_bytes(t.W);
    ASSERT_EQ(bytes, rows / 16 * cols / 256 * k3::cpu::kQ4KGroupBlockBytes);
    std::vector<uint8_t> copy(static_cast<size_t>(bytes));  // the kernel's loads need no alignment
    k3::cpu::make_decode_layout(t.W, copy.data());
    k3::WeightMatrix tiled = t.W;
    tiled.tiled = copy.data();
    auto x = activations(static_cast<size_t>(cols), rng);
    x[static_cast<size_t>(rng() % x.size())] = 4000.f;
    if (cols >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.f);
    std::vector<uint8_t> act(static_cast<size_t>(k.act_bytes(cols, 1)));
    k.prepare(x.data(), 1, cols, act.data());
    for (const auto& [r0, r1] : {std::pair<int64_t, int64_t>{0, rows}, {3, rows - 5}, {16, rows}, {0, 15}}) {
      if (r1 <= r0) continue;
      std::vector<float> ys(static_cast<size_t>(r1 - r0), NAN), yt(ys.size(), NAN);
      k.rows(t.W, r0, r1, act.data(), 1, ys.data(), 1);
      k.rows(tiled, r0, r1, act.data(), 1, yt.data(), 1);
      EXPECT_EQ(0, std::memcmp(ys.data(), yt.data(), ys.size() * sizeof(float))) << rows << " x " << cols << " rows [" << r0
                                                                                 << ", " << r1 << ")";
      for (size_t i = 0; i < ys.size(); ++i) ASSERT_TRUE(std::isfinite(ys[i]));
    }
    // Every quant bit of row 2 in group 0, block 0, sub-block 1, part 0 (bytes 4 x 2 + [0, 4)) flipped: only row 2 changes.
    // (Plain activations: with the outlier most of its block's quantise to 0.)
    const auto xp = activations(static_cast<size_t>(cols), rng);
    k.prepare(xp.data(), 1, cols, act.data());
    std::vector<float> before(static_cast<size_t>(rows)), after(before.size());
    k.rows(tiled, 0, rows, act.data(), 1, before.data(), 1);
    for (int e = 0; e < 4; ++e) copy[static_cast<size_t>(320 + 256 * 1 + 4 * 2 + e)] ^= 0xFF;
    k.rows(tiled, 0, rows, act.data(), 1, after.data(), 1);
    for (int64_t r = 0; r < rows; ++r)
      if (r == 2)
        EXPECT_NE(before[static_cast<size_t>(r)], after[static_cast<size_t>(r)]) << "the kernel did not read the copy";
      else
        EXPECT_EQ(before[static_cast<size_t>(r)], after[static_cast<size_t>(r)]) << "row " << r;
  }
}

TEST(QuantKernelsAvx2Int8, ExactOnRepresentableActivationsAndDiffersFromExactTier) {
  const auto& cpu = k3::cpu::cpu_state();
  if (const std::string m = k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx2Int8, false); !m.empty())
    GTEST_SKIP() << "this CPU cannot run the avx2int8 tier (missing: " << m << ")";
  check_int8_tier(k3::cpu::CpuIsa::Avx2Int8, k3::cpu::CpuIsa::Avx2,
                  std::vector<WeightFormat>(std::begin(k3test::kGgufFormats), std::end(k3test::kGgufFormats)),
                  [](WeightFormat f) -> size_t {  // the per-block K-quant paths round per 256, the quads per 4
                    return f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q6_K ? 256 : 4;
                  });
}

}  // namespace
