// CpuBackend::linear_group and linear_batch run several products in one fork-join (matmul_batch) at decode
// sizes; the graph relies on each output having exactly the bits `linear` gives it alone (the MoE block puts
// the router into the shared experts' group, the KDA block batches its two low-rank second halves), so that
// a model's logits do not depend on how its products are grouped. Checked here bitwise, for BF16 / MXFP4 / F32
// weights of different shapes side by side, inputs of their own, at 1, 3 and 16 tokens (grouped) and 17
// (above the group limit: one product at a time).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/core/weight.h"
#include "k3/model/weights.h"

namespace {

using k3::graph::Tensor;

struct Matrix {
  std::vector<uint8_t> data, scales;
  k3::WeightMatrix W;
};

// Random weights of `f`: bf16 patterns of moderate values; for MXFP4 any nibble pair is a valid E2M1 pair and
// the E8M0 scales sit near 2^0; F32 uniform.
Matrix random_matrix(k3::WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  Matrix m;
  m.data.resize(static_cast<size_t>(rows * k3::row_data_bytes(f, cols)));
  m.scales.resize(static_cast<size_t>(rows * k3::row_scale_bytes(f, cols)));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  if (f == k3::WeightFormat::F32) {
    for (size_t i = 0; i < m.data.size(); i += 4) {
      const float v = u(rng);
      std::memcpy(&m.data[i], &v, 4);
    }
  } else {
    for (size_t i = 0; i < m.data.size(); ++i)
      m.data[i] = static_cast<uint8_t>(f == k3::WeightFormat::BF16 && i % 2 ? 0x3c + rng() % 4 : rng());
  }
  for (auto& s : m.scales) s = static_cast<uint8_t>(123 + rng() % 6);
  m.W.format = f;
  m.W.rows = rows;
  m.W.cols = cols;
  m.W.data = m.data.data();
  m.W.scales = m.scales.empty() ? nullptr : m.scales.data();
  return m;
}

std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(CpuLinearBatch, GroupedProductsHaveTheBitsOfSingleOnes) {
  std::mt19937 rng(17);
  const int64_t X = 256;
  // A router-like 64-row BF16, an expert-like MXFP4, a wide BF16 and an F32 one, all reading x (the group).
  std::vector<Matrix> ms;
  ms.push_back(random_matrix(k3::WeightFormat::BF16, 64, X, rng));
  ms.push_back(random_matrix(k3::WeightFormat::MXFP4, 96, X, rng));
  ms.push_back(random_matrix(k3::WeightFormat::BF16, 608, X, rng));
  ms.push_back(random_matrix(k3::WeightFormat::F32, 40, X, rng));
  // Low-rank second halves: their own inputs (X_low columns), wide outputs (the batch).
  const int64_t X_low = 64;
  std::vector<Matrix> lows;
  lows.push_back(random_matrix(k3::WeightFormat::BF16, 512, X_low, rng));
  lows.push_back(random_matrix(k3::WeightFormat::BF16, 448, X_low, rng));
  for (int64_t n : {1, 3, 16, 17}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    k3::cpu::CpuBackend be;
    const std::vector<float> x = random_vec(static_cast<size_t>(n * X), rng);
    std::vector<float> xin = x;  // the backend's ops take mutable tensors
    const Tensor tx = Tensor::f32(xin.data(), n, X);
    std::vector<std::vector<float>> one(ms.size()), grouped(ms.size());
    std::vector<k3::graph::Projection> ps;
    for (size_t i = 0; i < ms.size(); ++i) {
      one[i].assign(static_cast<size_t>(n * ms[i].W.rows), -1.f);
      grouped[i].assign(one[i].size(), -2.f);
      be.linear(ms[i].W, tx, Tensor::f32(one[i].data(), n, ms[i].W.rows));
      ps.push_back({&ms[i].W, Tensor::f32(grouped[i].data(), n, ms[i].W.rows)});
    }
    be.linear_group(tx, ps);
    for (size_t i = 0; i < ms.size(); ++i)
      EXPECT_EQ(std::memcmp(one[i].data(), grouped[i].data(), one[i].size() * sizeof(float)), 0) << "group product " << i;

    std::vector<std::vector<float>> ins, one_b(lows.size()), batched(lows.size());
    std::vector<k3::graph::LinearJob> jobs;
    for (size_t i = 0; i < lows.size(); ++i) ins.push_back(random_vec(static_cast<size_t>(n * X_low), rng));
    for (size_t i = 0; i < lows.size(); ++i) {
      one_b[i].assign(static_cast<size_t>(n * lows[i].W.rows), -1.f);
      batched[i].assign(one_b[i].size(), -2.f);
      const Tensor in = Tensor::f32(ins[i].data(), n, X_low);
      be.linear(lows[i].W, in, Tensor::f32(one_b[i].data(), n, lows[i].W.rows));
      jobs.push_back({&lows[i].W, in, Tensor::f32(batched[i].data(), n, lows[i].W.rows)});
    }
    be.linear_batch(jobs);
    for (size_t i = 0; i < lows.size(); ++i)
      EXPECT_EQ(std::memcmp(one_b[i].data(), batched[i].data(), one_b[i].size() * sizeof(float)), 0) << "batch product " << i;
    // The outputs are products, not the fill values (a skipped job would leave -2 everywhere).
    EXPECT_NE(batched[0][0], -2.f);
    EXPECT_NE(grouped[2][0], -2.f);
  }
}

// The shared experts' down projection beside the routed experts (CpuBackend::moe_experts_beside): the routed
// output and the beside product each equal to moe_experts and `linear` alone, bitwise, at decode (one token: the
// two-stage fork-join, the beside job a group of its own) and above the two-stage limit (40 tokens).
TEST(CpuLinearBatch, BesideProductsInTheExpertsBatchKeepTheirBits) {
  std::mt19937 rng(29);
  const int64_t E = 6, X = 128, I = 64, K = 2;
  std::vector<Matrix> mats;
  mats.reserve(3 * E + 1);
  k3::MoeWeights w;
  for (int64_t e = 0; e < E; ++e) {
    mats.push_back(random_matrix(k3::WeightFormat::MXFP4, I, X, rng));
    mats.push_back(random_matrix(k3::WeightFormat::MXFP4, I, X, rng));
    mats.push_back(random_matrix(k3::WeightFormat::MXFP4, X, I, rng));
    w.experts.push_back({mats[mats.size() - 3].W, mats[mats.size() - 2].W, mats.back().W});
  }
  mats.push_back(random_matrix(k3::WeightFormat::BF16, X, 96, rng));  // the shared down: 96 -> X
  const k3::WeightMatrix& shared_down = mats.back().W;
  const k3::graph::GluParams silu{false, 0.f, 0.f};
  for (int64_t n : {1, 40}) {
    SCOPED_TRACE("tokens " + std::to_string(n));
    std::vector<float> x = random_vec(static_cast<size_t>(n * X), rng), hin = random_vec(static_cast<size_t>(n * 96), rng);
    std::vector<int32_t> idx(static_cast<size_t>(n * K));
    std::vector<float> wts = random_vec(static_cast<size_t>(n * K), rng);
    for (int64_t t = 0; t < n; ++t) {
      idx[static_cast<size_t>(t * K)] = static_cast<int32_t>(t % E);
      idx[static_cast<size_t>(t * K + 1)] = static_cast<int32_t>((t + 1 + t / E) % E == t % E ? (t + 2) % E : (t + 1 + t / E) % E);
    }
    auto run = [&](bool beside, std::vector<float>& out, std::vector<float>& sh) {
      k3::cpu::CpuBackend be;
      k3::graph::StepPlan plan;
      be.begin_step(plan);
      out.assign(static_cast<size_t>(n * X), -1.f);
      sh.assign(static_cast<size_t>(n * X), -1.f);
      const Tensor tx = Tensor::f32(x.data(), n, X), ti = Tensor::i32(idx.data(), n, K), tw = Tensor::f32(wts.data(), n, K);
      const Tensor to = Tensor::f32(out.data(), n, X), th = Tensor::f32(hin.data(), n, 96), ts = Tensor::f32(sh.data(), n, X);
      if (beside) {
        const std::vector<k3::graph::LinearJob> jobs = {{&shared_down, th, ts}};
        be.moe_experts_beside(w, tx, ti, tw, silu, to, jobs);
      } else {
        be.moe_experts(w, tx, ti, tw, silu, to);
        be.linear(shared_down, th, ts);
      }
    };
    std::vector<float> out0, sh0, out1, sh1;
    run(false, out0, sh0);
    run(true, out1, sh1);
    EXPECT_EQ(std::memcmp(out0.data(), out1.data(), out0.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(sh0.data(), sh1.data(), sh0.size() * sizeof(float)), 0);
    EXPECT_NE(sh1[0], -1.f);
  }
}

TEST(CpuLinearBatch, RejectsMismatchedShapes) {
  std::mt19937 rng(3);
  Matrix a = random_matrix(k3::WeightFormat::BF16, 32, 64, rng), b = random_matrix(k3::WeightFormat::BF16, 32, 64, rng);
  k3::cpu::CpuBackend be;
  std::vector<float> x(2 * 64, 0.5f), y0(2 * 32), y1(2 * 31);
  std::vector<k3::graph::LinearJob> jobs = {{&a.W, Tensor::f32(x.data(), 2, 64), Tensor::f32(y0.data(), 2, 32)},
                                            {&b.W, Tensor::f32(x.data(), 2, 64), Tensor::f32(y1.data(), 2, 31)}};
  EXPECT_THROW(be.linear_batch(jobs), std::exception);
}

}  // namespace
