// FFNs (model-spec 3.4): the dense GLU MLP, and the MoE: sigmoid routing with correction bias, routed
// experts (in K3's down-projected latent space when configured, RMS-normed before the up-projection)
// plus shared experts.
#include <array>

#include "k3/model/graph/blocks.h"

namespace k3::graph {

GluParams glu_params(const ModelConfig& c) {
  return {c.act == Activation::SiTU, c.situ_beta, c.situ_linear_beta};
}

void glu_mlp_block(const Ctx& g, const GluMlp& w, Tensor x, Tensor out) {
  glu_mlp_partial(g, w, x, out);
  g.reduce(out);  // down is row-parallel: its input columns are this rank's intermediate
}

void glu_mlp_partial(const Ctx& g, const GluMlp& w, Tensor x, Tensor out) {
  Backend& b = g.b;
  ScratchScope scope(b);
  const int64_t I = w.gate.rows;
  Tensor gate = b.scratch(x.rows, I), up = b.scratch(x.rows, I);
  const std::array<Projection, 2> ps = {{{&w.gate, gate}, {&w.up, up}}};
  b.linear_group(x, ps);
  b.glu(gate, up, glu_params(g.c));
  b.linear(w.down, gate, out);
}

void moe_block(const Ctx& g, const MoeWeights& w, Tensor x, Tensor out) {
  Backend& b = g.b;
  const ModelConfig& c = g.c;
  ScratchScope scope(b);
  const int64_t N = x.rows, E = c.num_experts, K = c.top_k, X = c.expert_in_dim();
  // Routing reads x (not the latent); the bias only selects.
  Tensor logits = b.scratch(N, E), idx = b.scratch(N, K, ElemType::I32), wts = b.scratch(N, K);
  // Experts done in moe_experts_start (no overlap to keep): the router and the shared experts' gate / up read
  // the same x, so one linear_group computes them (at 16 CPU threads the router alone is ~30 us of hand-over
  // for ~2 us of bytes); the shared GLU and down follow the routed experts.
  const bool has_shared = !w.shared.gate.empty();
  if (has_shared && w.latent_down.empty() && !g.sharded() && b.moe_fuses_shared(w, N)) {
    b.linear(w.router, x, logits);
    b.moe_route(logits, w.correction_bias.data(), RouteParams{K, c.moe_renormalize, c.routed_scaling_factor}, idx, wts);
    b.moe_experts_with_shared(w, x, idx, wts, glu_params(c), out);  // out = routed + shared
    return;
  }
  const bool shared_grouped = has_shared && !g.sharded() && !b.moe_experts_overlap();
  Tensor sh_gate, sh_up;
  Tensor ex = x;  // expert inputs: x itself, or K3's latent z (down-projected from x: in the group too)
  if (!w.latent_down.empty()) ex = b.scratch(N, X);
  if (shared_grouped) {
    sh_gate = b.scratch(N, w.shared.gate.rows);
    sh_up = b.scratch(N, w.shared.up.rows);
    std::array<Projection, 4> ps = {{{&w.router, logits}, {&w.shared.gate, sh_gate}, {&w.shared.up, sh_up}, {&w.latent_down, ex}}};
    b.linear_group(x, std::span<const Projection>(ps.data(), w.latent_down.empty() ? 3 : 4));
  } else {
    b.linear(w.router, x, logits);
  }
  b.moe_route(logits, w.correction_bias.data(), RouteParams{K, c.moe_renormalize, c.routed_scaling_factor}, idx, wts);
  // Expert parallel: the router is replicated, so every rank picks the same experts and computes its own
  // (on every token), or, with all-to-all dispatch, sends its share of the tokens to the experts' ranks.
  const bool ep = g.sharded() && g.shard->expert_parallel, dispatch = ep && g.shard->expert_all_to_all;
  if (ep && !dispatch) b.moe_keep_experts(idx, *g.shard);

  if (!w.latent_down.empty() && !shared_grouped) b.linear(w.latent_down, x, ex);
  Tensor acc = w.latent_up.empty() ? out : b.scratch(N, X);
  // The shared experts run between start and wait (they only read x), so that a backend with the
  // routed experts on another processor overlaps the two; the sums are the same in either order.
  Tensor sh;
  if (shared_grouped) {  // the shared down runs beside the routed experts (in their fork-join on the CPU)
    sh = b.scratch(N, c.hidden_size);
    b.glu(sh_gate, sh_up, glu_params(c));
    const std::array<LinearJob, 1> beside = {{{&w.shared.down, sh_gate, sh}}};
    b.moe_experts_beside(w, ex, idx, wts, glu_params(c), acc, beside);
  } else if (dispatch) {
    b.moe_experts_all_to_all(w, ex, idx, wts, glu_params(c), acc, *g.shard);
  } else {
    b.moe_experts_start(w, ex, idx, wts, glu_params(c), acc);
  }
  if (has_shared && !shared_grouped) {
    sh = b.scratch(N, c.hidden_size);
    glu_mlp_partial(g, w.shared, x, sh);
  }
  if (!dispatch) b.moe_experts_wait();
  // Sharded, acc and sh are partial sums (this rank's experts or expert columns, its shared columns).
  // The latent norm is not linear: acc is reduced before it; without a latent space one reduction
  // covers both.
  if (!w.latent_up.empty()) {
    g.reduce(acc);
    if (!w.latent_norm.empty()) b.rmsnorm(acc, w.latent_norm.data(), X, c.rms_norm_eps, acc);
    b.linear(w.latent_up, acc, out);
    if (has_shared) g.reduce(sh);
  }
  if (has_shared) b.add(out, sh);
  if (w.latent_up.empty()) g.reduce(out);
}

}  // namespace k3::graph
