// CpuBackend::moe_experts: the routed experts' buffers come from the step arena (cpu_backend_moe.cpp), so
// a call must hand back exactly what it took, whether the arena holds the step's other scratch (a CPU
// step) or nothing (the CUDA backend's host experts, no steps), and its output must be the per-token
// reference: each routed expert's GLU MLP on that token alone, weighted, added in expert-id order.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/moe_activation.h"

namespace {

struct Experts {
  std::vector<std::vector<float>> mem;
  k3::MoeWeights w;
};

Experts make_experts(int64_t E, int64_t X, int64_t I, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  Experts ex;
  auto matrix = [&](int64_t rows, int64_t cols) {
    ex.mem.emplace_back(static_cast<size_t>(rows * cols));
    for (float& v : ex.mem.back()) v = u(rng);
    k3::WeightMatrix m;
    m.format = k3::WeightFormat::F32;
    m.data = ex.mem.back().data();
    m.rows = rows;
    m.cols = cols;
    return m;
  };
  ex.mem.reserve(static_cast<size_t>(3 * E));  // the matrices point into these vectors: no reallocation
  for (int64_t e = 0; e < E; ++e) ex.w.experts.push_back({matrix(I, X), matrix(I, X), matrix(X, I)});
  return ex;
}

// out[t] = sum over t's picks in expert-id order of p * down(silu(gate x_t) * up x_t), one token at a time; with
// `act` MXFP8 or Q8, x_t and the GLU output h are rounded first (core/moe_activation.h, each row on its own), as
// --moe-activation-dtype asks.
std::vector<float> reference(const k3::MoeWeights& w, const std::vector<float>& x, const std::vector<int32_t>& idx,
                             const std::vector<float>& wts, int64_t n, int64_t K, int64_t X,
                             k3::MoeActivationDType act = k3::MoeActivationDType::F32) {
  std::vector<float> out(static_cast<size_t>(n * X), 0.f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < static_cast<int64_t>(w.experts.size()); ++e)
      for (int64_t j = 0; j < K; ++j) {
        if (idx[static_cast<size_t>(t * K + j)] != e) continue;
        const k3::GluMlp& m = w.experts[static_cast<size_t>(e)];
        std::vector<float> g(static_cast<size_t>(m.gate.rows)), up(g.size()), y(static_cast<size_t>(X));
        std::vector<float> xt(x.begin() + t * X, x.begin() + (t + 1) * X);
        k3::fake_quant_moe_row(act, xt.data(), X);
        k3::cpu::matmul(m.gate, xt.data(), 1, g.data());
        k3::cpu::matmul(m.up, xt.data(), 1, up.data());
        k3::cpu::silu_glu(g.data(), up.data(), m.gate.rows, g.data());
        k3::fake_quant_moe_row(act, g.data(), m.gate.rows);
        k3::cpu::matmul(m.down, g.data(), 1, y.data());
        const float p = wts[static_cast<size_t>(t * K + j)];
        for (int64_t d = 0; d < X; ++d) out[static_cast<size_t>(t * X + d)] += p * y[static_cast<size_t>(d)];
      }
  return out;
}

TEST(CpuMoeExperts, ArenaHandedBackAndOutputIsPerTokenReference) {
  const int64_t E = 6, X = 48, I = 40, K = 2, n = 9;
  std::mt19937 rng(5);
  const Experts ex = make_experts(E, X, I, rng);
  std::vector<float> x(static_cast<size_t>(n * X)), wts(static_cast<size_t>(n * K));
  std::vector<int32_t> idx(static_cast<size_t>(n * K));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (float& v : x) v = u(rng);
  for (int64_t t = 0; t < n; ++t) {
    idx[static_cast<size_t>(t * K)] = static_cast<int32_t>(t % E);  // two distinct experts per token,
    idx[static_cast<size_t>(t * K + 1)] = static_cast<int32_t>((t * 5 + 1) % E == t % E ? (t + 1) % E : (t * 5 + 1) % E);
    wts[static_cast<size_t>(t * K)] = 0.25f + 0.05f * static_cast<float>(t);  // one expert (4) unused
    wts[static_cast<size_t>(t * K + 1)] = 0.5f;
  }
  const std::vector<float> want = reference(ex.w, x, idx, wts, n, K, X);
  const k3::graph::GluParams silu{false, 0.f, 0.f};

  for (bool in_step : {true, false}) {  // with the step's other scratch below it, and alone (mark 0)
    k3::cpu::CpuBackend be;
    k3::graph::StepPlan plan;
    be.begin_step(plan);
    if (in_step) be.scratch(3, 100, k3::graph::ElemType::F32);
    const size_t mark = be.scratch_mark();
    for (int rep = 0; rep < 3; ++rep) {
      std::vector<float> xin(x), out(static_cast<size_t>(n * X), -1.f);
      std::vector<int32_t> ii(idx);
      std::vector<float> ww(wts);
      be.moe_experts(ex.w, k3::graph::Tensor::f32(xin.data(), n, X), k3::graph::Tensor::i32(ii.data(), n, K),
                     k3::graph::Tensor::f32(ww.data(), n, K), silu, k3::graph::Tensor::f32(out.data(), n, X));
      ASSERT_EQ(be.scratch_mark(), mark) << "in_step " << in_step << " rep " << rep;
      ASSERT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0) << "in_step " << in_step << " rep " << rep;
    }
  }
}

// --moe-activation-dtype mxfp8 and q8: every expert reads its token's row rounded and down reads the rounded GLU
// output, bit for bit the per-token reference, at decode sizes (one fork-join, matmul_two_stage) and prefill sizes
// (two), so a token's result does not depend on the path. Widths 80 and 72 end in a short block (16, 8 values). The
// caller's x (the shared experts read it too) is left alone, and a product run beside the experts is not rounded.
TEST(CpuMoeExperts, ActivationDtypeRoundsEachInputAndGluOutputRowLikeThePerTokenReference) {
  const int64_t E = 6, X = 80, I = 72, K = 2;
  std::mt19937 rng(11);
  const Experts ex = make_experts(E, X, I, rng);
  const Experts beside_w = make_experts(1, X, X, rng);  // its gate matrix [X][X] is the beside product
  const k3::graph::GluParams silu{false, 0.f, 0.f};
  for (const auto act : {k3::MoeActivationDType::MXFP8, k3::MoeActivationDType::Q8})
  for (int64_t n : {1, 9, 40}) {
    std::vector<float> x(static_cast<size_t>(n * X)), wts(static_cast<size_t>(n * K)), bx(static_cast<size_t>(n * X));
    std::vector<int32_t> idx(static_cast<size_t>(n * K));
    std::uniform_real_distribution<float> u(-1.f, 1.f), mag(-6.f, 6.f);
    for (float& v : x) v = u(rng) * std::exp2(mag(rng));  // values over ~12 binades: subnormal codes too
    for (float& v : bx) v = u(rng);
    for (int64_t t = 0; t < n; ++t) {
      idx[static_cast<size_t>(t * K)] = static_cast<int32_t>(t % E);
      idx[static_cast<size_t>(t * K + 1)] = static_cast<int32_t>((t + 1 + t / E) % E == t % E ? (t + 2) % E : (t + 1 + t / E) % E);
      wts[static_cast<size_t>(t * K)] = 0.3f + 0.01f * static_cast<float>(t);
      wts[static_cast<size_t>(t * K + 1)] = 0.6f;
    }
    const std::vector<float> want = reference(ex.w, x, idx, wts, n, K, X, act);
    const std::vector<float> plain = reference(ex.w, x, idx, wts, n, K, X);
    std::vector<float> want_beside(static_cast<size_t>(n * X));
    k3::cpu::matmul(beside_w.w.experts[0].gate, bx.data(), n, want_beside.data());

    k3::cpu::CpuBackend be;
    be.set_moe_activation_dtype(act);
    SCOPED_TRACE(k3::moe_activation_dtype_name(act));
    k3::graph::StepPlan plan;
    be.begin_step(plan);
    std::vector<float> xin(x), out(static_cast<size_t>(n * X), -1.f), by(static_cast<size_t>(n * X), -1.f);
    std::vector<int32_t> ii(idx);
    std::vector<float> ww(wts);
    const std::array<k3::graph::LinearJob, 1> beside = {{{&beside_w.w.experts[0].gate, k3::graph::Tensor::f32(bx.data(), n, X),
                                                          k3::graph::Tensor::f32(by.data(), n, X)}}};
    be.moe_experts_beside(ex.w, k3::graph::Tensor::f32(xin.data(), n, X), k3::graph::Tensor::i32(ii.data(), n, K),
                          k3::graph::Tensor::f32(ww.data(), n, K), silu, k3::graph::Tensor::f32(out.data(), n, X), beside);
    EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0) << "n " << n;
    EXPECT_NE(std::memcmp(out.data(), plain.data(), out.size() * sizeof(float)), 0) << "n " << n << ": nothing rounded";
    EXPECT_EQ(xin, x) << "n " << n << ": the caller's x was changed";
    EXPECT_EQ(std::memcmp(by.data(), want_beside.data(), by.size() * sizeof(float)), 0) << "n " << n << ": beside product";
  }
}

}  // namespace
