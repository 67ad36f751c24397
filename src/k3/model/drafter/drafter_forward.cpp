#include "k3/model/drafter/drafter_forward.h"

#include <cmath>
#include <string>

#include "k3/core/error.h"

namespace k3::drafter {

using graph::Backend;
using graph::ScratchScope;
using graph::Tensor;

namespace {

// Block position j of every draft: rows j, j + B, j + 2B, .. of t ([R * B][..]), columns [c0, c0 + n).
Tensor position_rows(Tensor t, int64_t j, int64_t B, int64_t c0, int64_t n) {
  Tensor v = t;
  v.data = t.f() + j * t.stride + c0;
  v.rows = t.rows / B;
  v.cols = n;
  v.stride = t.stride * B;
  return v;
}

// One weight row seen as `rows` equal rows (a broadcast source for Backend::copy).
Tensor repeated(const float* row, int64_t rows, int64_t cols) {
  return Tensor{const_cast<float*>(row), rows, cols, 0, graph::ElemType::F32};
}

// h [R * B][H] = input_proj @ concat(rms(e_j, embed_norm), c) + position_embedding[j]; e_0 = the target's
// embedding of the draft's last token, e_j = mask_embedding for j >= 1; c = rms(context_proj @ ctx).
void block_inputs(const DrafterConfig& c, const DrafterWeights& w, Backend& b, Tensor ctx, Tensor h) {
  ScratchScope scope(b);
  const int64_t R = ctx.rows, B = c.block_size, H = c.hidden_size;
  const float eps = c.rms_norm_eps;
  Tensor cx = b.scratch(R, H), e0 = b.scratch(R, H), x = b.scratch(R * B, 2 * H), pos = b.scratch(R * B, H);
  b.linear(w.context_proj, ctx, cx);
  b.rmsnorm(cx, w.context_norm.data(), H, eps, cx);
  b.embed(w.target_embed, e0);
  for (int64_t j = 0; j < B; ++j) {
    b.copy(position_rows(x, j, B, 0, H), j == 0 ? e0 : repeated(w.mask_embedding.data(), R, H));
    b.copy(position_rows(x, j, B, H, H), cx);
    b.copy(position_rows(pos, j, B, 0, H), repeated(w.position_embedding.data() + j * H, R, H));
  }
  const Tensor e = position_rows(x, 0, 1, 0, H);  // the first half of every row: the embeddings
  b.rmsnorm(e, w.embed_norm.data(), H, eps, e);
  b.linear(w.input_proj, x, h);
  b.add(h, pos);
}

// One layer, in place on h [R * B][H]: block attention, then the SiLU GLU MLP, each pre-normed, residual.
void drafter_layer(const DrafterConfig& c, const DrafterLayerWeights& L, Backend& b, Tensor h) {
  ScratchScope scope(b);
  const int64_t N = h.rows, H = c.hidden_size, A = c.attn_dim(), I = c.intermediate_size;
  const float eps = c.rms_norm_eps;
  Tensor x = b.scratch(N, H), y = b.scratch(N, H);
  Tensor q = b.scratch(N, A), k = b.scratch(N, A), v = b.scratch(N, A), o = b.scratch(N, A);
  b.rmsnorm(h, L.attn_norm.data(), H, eps, x);
  const graph::Projection qkv[] = {{&L.q, q}, {&L.k, k}, {&L.v, v}};
  b.linear_group(x, qkv);
  b.block_attention(q, k, v, c.block_size, c.num_heads, c.head_dim, 1.0f / std::sqrt(static_cast<float>(c.head_dim)), o);
  b.linear(L.o, o, y);
  b.add(h, y);
  b.rmsnorm(h, L.mlp_norm.data(), H, eps, x);
  Tensor g = b.scratch(N, I), u = b.scratch(N, I);
  const graph::Projection gu[] = {{&L.gate, g}, {&L.up, u}};
  b.linear_group(x, gu);
  b.glu(g, u, graph::GluParams{});  // SiLU
  b.linear(L.down, g, y);
  b.add(h, y);
}

}  // namespace

void drafter_forward(const DrafterConfig& c, const DrafterWeights& w, Backend& b, const graph::StepPlan& plan,
                     Tensor ctx, int64_t n_out, Tensor logits) {
  const int64_t R = plan.n_tokens(), B = c.block_size, H = c.hidden_size;
  if (R < 1 || ctx.rows != R || ctx.cols != c.ctx_dim() || n_out < 1 || n_out > B || logits.rows != R * n_out ||
      logits.cols != w.target_lm_head.rows)
    throw Error("block drafter: forward of " + std::to_string(R) + " drafts with ctx [" + std::to_string(ctx.rows) + "][" +
                std::to_string(ctx.cols) + "], " + std::to_string(n_out) + " positions of " + std::to_string(B) +
                ", logits [" + std::to_string(logits.rows) + "][" + std::to_string(logits.cols) + "]: shapes do not fit");
  b.begin_step(plan);
  ScratchScope scope(b);
  Tensor h = b.scratch(R * B, H);
  block_inputs(c, w, b, ctx, h);
  for (const DrafterLayerWeights& L : w.layers) drafter_layer(c, L, b, h);
  // The head on the first n_out positions of every block only (the rest were needed as keys and values).
  Tensor hs = h;
  if (n_out < B) {
    hs = b.scratch(R * n_out, H);
    for (int64_t j = 0; j < n_out; ++j) b.copy(position_rows(hs, j, n_out, 0, H), position_rows(h, j, B, 0, H));
  }
  b.rmsnorm(hs, w.final_norm.data(), H, c.rms_norm_eps, hs);
  b.linear(w.target_lm_head, hs, logits);
}

}  // namespace k3::drafter
