// FFNs (model-spec section 3.4): dense GLU MLP and the MoE with sigmoid routing, correction bias,
// renormalisation, scaling, shared experts and K3's LatentMoE.
#include <algorithm>
#include <numeric>

#include "k3/backend/cpu/ops.h"
#include "k3/core/thread_pool.h"
#include "k3/model/layers.h"

namespace k3 {

namespace {
void glu_act(const ModelConfig& c, float* gate, const float* up, int64_t count) {
  if (c.act == Activation::SiTU)
    cpu::situ_glu(gate, up, count, c.situ_beta, c.situ_linear_beta, gate);
  else
    cpu::silu_glu(gate, up, count, gate);
}
}  // namespace

void glu_mlp(const ModelConfig& c, const GluMlp& w, const float* x, int64_t n, float* out) {
  const int64_t I = w.gate.rows;
  std::vector<float> g(static_cast<size_t>(n * I)), u(static_cast<size_t>(n * I));
  cpu::matmul(w.gate, x, n, g.data());
  cpu::matmul(w.up, x, n, u.data());
  glu_act(c, g.data(), u.data(), n * I);
  cpu::matmul(w.down, g.data(), n, out);
}

void moe_layer(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t n, float* out) {
  const int64_t H = c.hidden_size, E = c.num_experts, K = c.top_k, X = c.expert_in_dim();

  // Routing: the router reads x (not the latent); the bias only selects.
  std::vector<float> s(static_cast<size_t>(n * E));
  cpu::matmul(w.router, x, n, s.data());
  for (auto& v : s) v = cpu::sigmoidf(v);
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(E));  // (token, weight)
  std::vector<int64_t> idx(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* st = s.data() + t * E;
    std::iota(idx.begin(), idx.end(), 0);
    // Highest biased score first; ties to the lower expert id (stable, deterministic).
    std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int64_t a, int64_t b) {
      const float sa = st[a] + w.correction_bias[static_cast<size_t>(a)];
      const float sb = st[b] + w.correction_bias[static_cast<size_t>(b)];
      return sa > sb || (sa == sb && a < b);
    });
    float denom = 0;
    for (int64_t j = 0; j < K; ++j) denom += st[idx[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = idx[static_cast<size_t>(j)];
      const float p = (c.moe_renormalize ? st[e] / (denom + 1e-20f) : st[e]) * c.routed_scaling_factor;
      by_expert[static_cast<size_t>(e)].emplace_back(t, p);
    }
  }

  // Expert inputs: x itself, or K3's down-projected latent z.
  std::vector<float> z;
  const float* xin = x;
  if (!w.latent_down.empty()) {
    z.resize(static_cast<size_t>(n * X));
    cpu::matmul(w.latent_down, x, n, z.data());
    xin = z.data();
  }
  // Experts run in parallel (each one's matmuls single-threaded, nested); their outputs are then
  // added per token in expert-id order, so results do not depend on the thread count or on batching.
  const int64_t I = c.moe_intermediate_size;
  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[static_cast<size_t>(e)].empty()) active.push_back(e);
  std::vector<std::vector<float>> ys(static_cast<size_t>(E));
  const int64_t n_active = static_cast<int64_t>(active.size());
  auto one = [&](int64_t ai) {
    const int64_t e = active[static_cast<size_t>(ai)];
    const auto& toks = by_expert[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(toks.size());
    std::vector<float> xe(static_cast<size_t>(m * X)), ge(static_cast<size_t>(m * I)), ue(static_cast<size_t>(m * I));
    std::vector<float>& ye = ys[static_cast<size_t>(e)];
    ye.resize(static_cast<size_t>(m * X));
    for (int64_t j = 0; j < m; ++j)
      std::copy(xin + toks[static_cast<size_t>(j)].first * X, xin + (toks[static_cast<size_t>(j)].first + 1) * X, xe.data() + j * X);
    const GluMlp& ex = w.experts[static_cast<size_t>(e)];
    cpu::matmul(ex.gate, xe.data(), m, ge.data());
    cpu::matmul(ex.up, xe.data(), m, ue.data());
    glu_act(c, ge.data(), ue.data(), m * I);
    cpu::matmul(ex.down, ge.data(), m, ye.data());
    };
  if (n < 4) {  // a handful of tokens: the matmuls parallelise inside
    for (int64_t ai = 0; ai < n_active; ++ai) one(ai);
  } else {
    ThreadPool::global().parallel_for(n_active, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t ai = b; ai < e; ++ai) one(ai);
    });
  }
  std::vector<float> acc(static_cast<size_t>(n * X), 0.f);
  for (int64_t e : active) {
    const auto& toks = by_expert[static_cast<size_t>(e)];
    const std::vector<float>& ye = ys[static_cast<size_t>(e)];
    for (size_t j = 0; j < toks.size(); ++j) {
      const auto [t, p] = toks[j];
      float* a = acc.data() + t * X;
      const float* y = ye.data() + static_cast<int64_t>(j) * X;
      for (int64_t d = 0; d < X; ++d) a[d] += p * y[d];
    }
  }

  if (!w.latent_up.empty()) {
    if (!w.latent_norm.empty()) cpu::rmsnorm(acc.data(), w.latent_norm.data(), n, X, c.rms_norm_eps, acc.data());
    cpu::matmul(w.latent_up, acc.data(), n, out);
  } else {
    std::copy(acc.begin(), acc.end(), out);
  }
  if (!w.shared.gate.empty()) {
    std::vector<float> sh(static_cast<size_t>(n * H));
    glu_mlp(c, w.shared, x, n, sh.data());
    for (size_t i = 0; i < sh.size(); ++i) out[i] += sh[i];
  }
}

}  // namespace k3
