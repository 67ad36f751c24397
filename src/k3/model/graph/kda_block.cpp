// KDA layer (model-spec 3.2): the projections run over the whole batch; the per-sequence parts (conv,
// recurrence) are the backend's kda_mix over each sequence's state.
#include <array>

#include "k3/model/graph/blocks.h"

namespace k3::graph {

KdaDims kda_dims(const ModelConfig& c) { return {c.kda_heads, c.kda_head_dim, c.conv_kernel}; }

void kda_block(const Ctx& g, const KdaWeights& w, int64_t kda_index, Tensor x, Tensor out) {
  Backend& b = g.b;
  const ModelConfig& c = g.c;
  ScratchScope scope(b);
  const KdaDims d = kda_dims(c);
  const int64_t N = x.rows, C = d.channels();
  Tensor pq = b.scratch(N, C), pk = b.scratch(N, C), pv = b.scratch(N, C), decay = b.scratch(N, C), gate = b.scratch(N, C);
  Tensor beta = b.scratch(N, d.heads), o = b.scratch(N, C);
  // Every projection of x in one group (one launch on CUDA at decode), then the low-rank second halves.
  Tensor f_low = b.scratch(N, w.f_a.rows);
  std::array<Projection, 6> ps = {{{&w.q, pq}, {&w.k, pk}, {&w.v, pv}, {&w.f_a, f_low}, {&w.b, beta}, {}}};
  Tensor g_low;
  if (c.kda_full_rank_gate) {
    ps[5] = {&w.g, gate};
  } else {
    g_low = b.scratch(N, w.g_a.rows);
    ps[5] = {&w.g_a, g_low};
  }
  b.linear_group(x, ps);
  // The low-rank second halves (decay gate; output gate unless full rank), one batch.
  std::array<LinearJob, 2> lows = {{{&w.f_b, f_low, decay}, {&w.g_b, g_low, gate}}};
  b.linear_batch(std::span<const LinearJob>(lows.data(), c.kda_full_rank_gate ? 1 : 2));
  KdaGate kg;
  if (c.gate_lower_bound) kg = {true, *c.gate_lower_bound};
  b.kda_mix(kda_index, w, d, kg, c.rms_norm_eps, pq, pk, pv, decay, beta, gate, o);
  b.linear(w.o, o, out);
  g.reduce(out);  // o_proj is row-parallel: its input channels are this rank's heads
}

}  // namespace k3::graph
