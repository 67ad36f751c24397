// CpuBackend::moe_experts: the routed experts' buffers come from the step arena (cpu_backend_moe.cpp), so
// a call must hand back exactly what it took, whether the arena holds the step's other scratch (a CPU
// step) or nothing (the CUDA backend's host experts, no steps), and its output must be the per-token
// reference: each routed expert's GLU MLP on that token alone, weighted, added in expert-id order.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"

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

// out[t] = sum over t's picks in expert-id order of p * down(silu(gate x_t) * up x_t), one token at a time.
std::vector<float> reference(const k3::MoeWeights& w, const std::vector<float>& x, const std::vector<int32_t>& idx,
                             const std::vector<float>& wts, int64_t n, int64_t K, int64_t X) {
  std::vector<float> out(static_cast<size_t>(n * X), 0.f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < static_cast<int64_t>(w.experts.size()); ++e)
      for (int64_t j = 0; j < K; ++j) {
        if (idx[static_cast<size_t>(t * K + j)] != e) continue;
        const k3::GluMlp& m = w.experts[static_cast<size_t>(e)];
        std::vector<float> g(static_cast<size_t>(m.gate.rows)), up(g.size()), y(static_cast<size_t>(X));
        k3::cpu::matmul(m.gate, x.data() + t * X, 1, g.data());
        k3::cpu::matmul(m.up, x.data() + t * X, 1, up.data());
        k3::cpu::silu_glu(g.data(), up.data(), m.gate.rows, g.data());
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

}  // namespace
