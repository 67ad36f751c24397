// The CPU kernels of GGUF's block formats (backend/cpu/weight_kernels_quant*.cpp) on every tier this CPU
// runs: matmul (row dot for one token, the register-blocked gemm for more: avx2 tiles of 6 tokens, avx512
// of 12, with their token tails; threads above the parallel thresholds) against a float64 reference built
// from quant_test_ref.h's decoder, and batch invariance (a token's outputs have the same bits alone or in
// a batch: the contract of weight_kernels.h).
//
// Tolerance: the products are exact fp32 products of the decoded weights and the activations, accumulated
// in fp32, so each output is within C * 2^-24 * sum |w x| of the exact dot (the recursive-summation bound;
// the decoded weight itself is the exact value rounded once, another 2^-24 relative per term: (C + 2) u).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/weight.h"
#include "kernel_test_util.h"
#include "quant_test_ref.h"

namespace {

using k3::WeightFormat;
constexpr double kU = 1.0 / (1 << 24);

class QuantKernelsTier : public k3test::CpuTierTest {};
INSTANTIATE_TEST_SUITE_P(Tiers, QuantKernelsTier, k3test::kAllCpuTiers, k3test::cpu_tier_name);

struct QuantWeight {
  k3::WeightMatrix W;
  std::vector<uint8_t> bytes;
  std::vector<double> ref;  // [rows][cols]
};

// Scales with f16 exponents 10..20 (about 2^-5 .. 2^5): products stay well inside fp32's normal range.
QuantWeight make_quant_weight(WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  const k3::WeightLayout l = k3::weight_layout(f);
  QuantWeight t;
  t.bytes = k3test::random_blocks(f, rows * cols / l.block_elems, rng, 10, 20);
  t.W = k3::WeightMatrix{f, t.bytes.data(), nullptr, rows, cols};
  t.ref.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i)
    t.ref[static_cast<size_t>(i)] = k3test::ref_value(f, t.bytes.data() + i / l.block_elems * l.block_bytes, static_cast<int>(i % l.block_elems));
  return t;
}

std::vector<float> activations(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> e(-6, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>((rng() & 1 ? 1 : -1) * std::exp2(e(rng)));
  return v;
}

void check_quant_matmul(const QuantWeight& t, int64_t n, std::mt19937& rng, k3test::Worst& worst) {
  const int64_t R = t.W.rows, C = t.W.cols;
  const auto x = activations(static_cast<size_t>(n * C), rng);
  std::vector<float> y(static_cast<size_t>(n * R), NAN);
  k3::cpu::matmul(t.W, x.data(), n, y.data());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < R; ++r) {
      double s = 0, sa = 0;
      for (int64_t c = 0; c < C; ++c) {
        const double p = t.ref[static_cast<size_t>(r * C + c)] * x[static_cast<size_t>(i * C + c)];
        s += p, sa += std::fabs(p);
      }
      const double err = std::fabs(y[static_cast<size_t>(i * R + r)] - s);
      ASSERT_LE(err, (C + 2) * kU * sa) << k3::weight_format_name(t.W.format) << " rows " << R << " cols " << C << " n " << n
                                        << " token " << i << " row " << r;
      worst.add(err / (kU * sa));
    }
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

TEST_P(QuantKernelsTier, MatmulAgainstFloat64AndBatchInvariant) {
  std::mt19937 rng(11);
  for (WeightFormat f : k3test::kGgufFormats) {
    k3test::Worst worst(k3::weight_format_name(f));
    const int64_t E = k3::weight_layout(f).block_elems;
    for (int64_t blocks : {1, 3})
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

}  // namespace
