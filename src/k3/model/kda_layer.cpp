// KDA layer: projections, short convs, gates and the output gate around the recurrence cores of
// backend/cpu/kda.h (model-spec section 3.2). Projections run over the whole batch; convs and the
// recurrence per sequence, on that sequence's state.
#include <cmath>

#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/thread_pool.h"
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

void kda_layer(const ModelConfig& c, const KdaWeights& w, int64_t kda_index, const float* x, int64_t N,
               const std::vector<SeqSpan>& seqs, int chunk, float* out) {
  const int64_t Hk = c.kda_heads, D = c.kda_head_dim, C = Hk * D, W = c.conv_kernel, r = c.kda_gate_rank;
  const size_t NC = static_cast<size_t>(N * C);
  std::vector<float> pq(NC), pk(NC), pv(NC), q(NC), k(NC), v(NC), g(NC), tmp(static_cast<size_t>(N * r)),
      beta(static_cast<size_t>(N * Hk));

  cpu::matmul(w.q, x, N, pq.data());
  cpu::matmul(w.k, x, N, pk.data());
  cpu::matmul(w.v, x, N, pv.data());
  // Decay gate (log space, per key channel) and beta.
  cpu::matmul(w.f_a, x, N, tmp.data());
  cpu::matmul(w.f_b, tmp.data(), N, g.data());
  for (int64_t t = 0; t < N; ++t)
    for (int64_t h = 0; h < Hk; ++h) {
      const float a = std::exp(w.A_log[static_cast<size_t>(h)]);
      float* gr = g.data() + t * C + h * D;
      const float* bias = w.dt_bias.data() + h * D;
      for (int64_t d = 0; d < D; ++d) {
        const float z = gr[d] + bias[d];
        gr[d] = c.gate_lower_bound ? *c.gate_lower_bound * cpu::sigmoidf(a * z) : -a * softplus(z);
      }
    }
  cpu::matmul(w.b, x, N, beta.data());
  for (auto& b : beta) b = cpu::sigmoidf(b);

  std::vector<float> o(NC);
  // Sequences are independent here: with several, parallelise over them (the kernels' own parallel
  // regions then run single-threaded, nested); results do not depend on the thread count.
  const int64_t n_seqs = static_cast<int64_t>(seqs.size());
  auto one = [&](const SeqSpan& s) {
    KdaStateView st = s.cache->kda_state(kda_index);
    const size_t off = static_cast<size_t>(s.offset * C);
    const int n = static_cast<int>(s.n);
    cpu::short_conv_silu(n, static_cast<int>(C), static_cast<int>(W), pq.data() + off, w.q_conv.data(), st.conv_q, q.data() + off);
    cpu::short_conv_silu(n, static_cast<int>(C), static_cast<int>(W), pk.data() + off, w.k_conv.data(), st.conv_k, k.data() + off);
    cpu::short_conv_silu(n, static_cast<int>(C), static_cast<int>(W), pv.data() + off, w.v_conv.data(), st.conv_v, v.data() + off);
    l2norm_heads(q.data() + off, s.n * Hk, D, 1.0f / std::sqrt(static_cast<float>(D)));
    l2norm_heads(k.data() + off, s.n * Hk, D, 1.0f);
    const float* bt = beta.data() + s.offset * Hk;
    if (s.prefill_form)
      cpu::kda_chunked(n, static_cast<int>(Hk), static_cast<int>(D), chunk, q.data() + off, k.data() + off, v.data() + off, g.data() + off, bt, st.S, o.data() + off);
    else
      cpu::kda_recurrent(n, static_cast<int>(Hk), static_cast<int>(D), q.data() + off, k.data() + off, v.data() + off, g.data() + off, bt, st.S, o.data() + off);
  };
  if (n_seqs == 1) {
    one(seqs[0]);  // the kernels parallelise inside
  } else {
    ThreadPool::global().parallel_for(n_seqs, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t si = b; si < e; ++si) one(seqs[static_cast<size_t>(si)]);
    });
  }

  // Output: per-head RMSNorm(o_norm) times sigmoid(output gate).
  if (c.kda_full_rank_gate) {
    cpu::matmul(w.g, x, N, pq.data());
  } else {
    cpu::matmul(w.g_a, x, N, tmp.data());
    cpu::matmul(w.g_b, tmp.data(), N, pq.data());
  }
  cpu::rmsnorm(o.data(), w.o_norm.data(), N * Hk, D, c.rms_norm_eps, o.data());
  for (size_t i = 0; i < NC; ++i) o[i] *= cpu::sigmoidf(pq[i]);
  cpu::matmul(w.o, o.data(), N, out);
}

}  // namespace k3
