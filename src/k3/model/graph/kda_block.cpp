// KDA layer (model-spec 3.2): the projections run over the whole batch; the per-sequence parts (conv,
// recurrence) are the backend's kda_mix over each sequence's state.
#include <algorithm>

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
  Tensor low = b.scratch(N, std::max(w.f_a.rows, w.g_a.rows)), beta = b.scratch(N, d.heads), o = b.scratch(N, C);
  b.linear(w.q, x, pq);
  b.linear(w.k, x, pk);
  b.linear(w.v, x, pv);
  b.linear(w.f_a, x, low);  // decay gate, low rank
  b.linear(w.f_b, low, decay);
  b.linear(w.b, x, beta);
  if (c.kda_full_rank_gate) {
    b.linear(w.g, x, gate);
  } else {
    b.linear(w.g_a, x, low);  // output gate, low rank
    b.linear(w.g_b, low, gate);
  }
  KdaGate kg;
  if (c.gate_lower_bound) kg = {true, *c.gate_lower_bound};
  b.kda_mix(kda_index, w, d, kg, c.rms_norm_eps, pq, pk, pv, decay, beta, gate, o);
  b.linear(w.o, o, out);
  g.reduce(out);  // o_proj is row-parallel: its input channels are this rank's heads
}

}  // namespace k3::graph
