// Gated MLA layer (model-spec 3.3): latent projections over the batch, the new latents into the cache,
// then the absorbed form (decode-form sequences: attention directly over the 576-value latent rows) and
// the MHA form (prefill-form sequences: k/v expanded from the cached latents), output gate, o_proj.
#include <array>
#include <cmath>

#include "k3/model/graph/blocks.h"

namespace k3::graph {

MlaDims mla_dims(const ModelConfig& c) {
  return {c.mla_heads, c.qk_nope_dim, c.qk_rope_dim, c.v_head_dim, c.kv_lora_rank};
}

void mla_block(const Ctx& g, const MlaWeights& w, int64_t mla_index, Tensor x, Tensor out) {
  Backend& b = g.b;
  const ModelConfig& c = g.c;
  ScratchScope scope(b);
  const MlaDims d = mla_dims(c);
  const int64_t N = x.rows, nh = d.heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.qk()));
  Tensor q = b.scratch(N, nh * d.qk());
  Tensor lat = b.scratch(N, d.row());  // [c_kv (normed) | k_pe]
  // The projections of x (q or q_a, kv_a, the output gate) as one group.
  Tensor qa, gt;
  std::array<Projection, 3> ps;
  size_t np = 0;
  if (!w.q_a.empty()) {
    qa = b.scratch(N, c.q_lora_rank);
    ps[np++] = {&w.q_a, qa};
  } else {
    ps[np++] = {&w.q, q};
  }
  ps[np++] = {&w.kv_a, lat};
  if (c.mla_output_gate) {
    gt = b.scratch(N, nh * d.value);
    ps[np++] = {&w.g, gt};
  }
  b.linear_group(x, std::span<const Projection>(ps.data(), np));
  if (!w.q_a.empty()) {
    b.rmsnorm(qa, w.q_a_norm.data(), c.q_lora_rank, c.mla_norm_eps, qa);
    b.linear(w.q_b, qa, q);
  }
  b.rmsnorm(lat, w.kv_a_norm.data(), d.rank, c.mla_norm_eps, lat);
  b.mla_write_latents(mla_index, d, lat);

  Tensor o = b.scratch(N, nh * d.value);
  if (g.plan.any_decode_form()) b.mla_absorbed(mla_index, w, d, q, scale, o);
  if (g.plan.any_prefill_form()) b.mla_attend_mha(mla_index, w, d, q, scale, o);
  if (c.mla_output_gate) b.sigmoid_mul(o, gt);
  b.linear(w.o, o, out);
  g.reduce(out);  // o_proj is row-parallel: its input channels are this rank's heads
}

}  // namespace k3::graph
