// KDA layer: projections, short convs, gates and the output gate around the recurrence cores of
// backend/cpu/kda.h (model-spec section 3.2).
#include <cmath>

#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/ops.h"
#include "k3/model/layers.h"

namespace k3 {

namespace {
inline float softplus(float z) { return z > 20.f ? z : std::log1p(std::exp(z)); }

// x / sqrt(sum x^2 + 1e-6) * scale, per head of D values.
void l2norm_heads(float* x, int64_t rows, int64_t D, float scale) {
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * D;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(v[d]) * v[d];
    const float inv = scale / std::sqrt(static_cast<float>(ss) + 1e-6f);
    for (int64_t d = 0; d < D; ++d) v[d] *= inv;
  }
}
}  // namespace

void kda_layer(const ModelConfig& c, const KdaWeights& w, const float* x, int64_t n, KdaLayerState& st, bool chunked,
               int chunk, float* out) {
  const int64_t Hk = c.kda_heads, D = c.kda_head_dim, C = Hk * D, W = c.conv_kernel, r = c.kda_gate_rank;
  const size_t nC = static_cast<size_t>(n * C);
  if (st.S.empty()) {
    st.S.assign(static_cast<size_t>(Hk * D * D), 0.f);
    st.conv_q.assign(static_cast<size_t>(C * (W - 1)), 0.f);
    st.conv_k = st.conv_q;
    st.conv_v = st.conv_q;
  }
  std::vector<float> pre(nC), q(nC), k(nC), v(nC), g(nC), tmp(static_cast<size_t>(n * r)), beta(static_cast<size_t>(n * Hk));

  cpu::matmul(w.q, x, n, pre.data());
  cpu::short_conv_silu(static_cast<int>(n), static_cast<int>(C), static_cast<int>(W), pre.data(), w.q_conv.data(), st.conv_q.data(), q.data());
  cpu::matmul(w.k, x, n, pre.data());
  cpu::short_conv_silu(static_cast<int>(n), static_cast<int>(C), static_cast<int>(W), pre.data(), w.k_conv.data(), st.conv_k.data(), k.data());
  cpu::matmul(w.v, x, n, pre.data());
  cpu::short_conv_silu(static_cast<int>(n), static_cast<int>(C), static_cast<int>(W), pre.data(), w.v_conv.data(), st.conv_v.data(), v.data());
  l2norm_heads(q.data(), n * Hk, D, 1.0f / std::sqrt(static_cast<float>(D)));
  l2norm_heads(k.data(), n * Hk, D, 1.0f);

  // Decay gate (log space, per key channel).
  cpu::matmul(w.f_a, x, n, tmp.data());
  cpu::matmul(w.f_b, tmp.data(), n, g.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < Hk; ++h) {
      const float a = std::exp(w.A_log[static_cast<size_t>(h)]);
      float* gr = g.data() + t * C + h * D;
      const float* bias = w.dt_bias.data() + h * D;
      for (int64_t d = 0; d < D; ++d) {
        const float z = gr[d] + bias[d];
        gr[d] = c.gate_lower_bound ? *c.gate_lower_bound * cpu::sigmoidf(a * z) : -a * softplus(z);
      }
    }
  cpu::matmul(w.b, x, n, beta.data());
  for (auto& b : beta) b = cpu::sigmoidf(b);

  std::vector<float> o(nC);
  if (chunked)
    cpu::kda_chunked(static_cast<int>(n), static_cast<int>(Hk), static_cast<int>(D), chunk, q.data(), k.data(), v.data(), g.data(), beta.data(), st.S.data(), o.data());
  else
    cpu::kda_recurrent(static_cast<int>(n), static_cast<int>(Hk), static_cast<int>(D), q.data(), k.data(), v.data(), g.data(), beta.data(), st.S.data(), o.data());

  // Output: per-head RMSNorm(o_norm) times sigmoid(output gate).
  if (c.kda_full_rank_gate) {
    cpu::matmul(w.g, x, n, pre.data());
  } else {
    cpu::matmul(w.g_a, x, n, tmp.data());
    cpu::matmul(w.g_b, tmp.data(), n, pre.data());
  }
  cpu::rmsnorm(o.data(), w.o_norm.data(), n * Hk, D, c.rms_norm_eps, o.data());
  for (size_t i = 0; i < nC; ++i) o[i] *= cpu::sigmoidf(pre[i]);
  cpu::matmul(w.o, o.data(), n, out);
}

}  // namespace k3
