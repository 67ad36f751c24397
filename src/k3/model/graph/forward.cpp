// The layer loop (model-spec 3): embedding, per layer the token mixer (KDA or MLA) and the FFN (dense or
// MoE), each reading an RMS-normed input, with Block Attention Residuals (3.1) or plain residuals, then
// the final norm and the head on the rows whose logits are wanted.
#include "k3/model/graph/forward.h"

#include "k3/model/graph/blocks.h"

#include <string>

#include "k3/core/error.h"

namespace k3::graph {

namespace {

// The residual stream. With AttnRes, P is the running partial sum of the current block and `blocks`
// holds the completed block summaries; a sublayer's input is the softmax mix over [blocks.., P]. Without
// it, P is the whole residual.
class Residual {
 public:
  Residual(Backend& b, const ModelConfig& c, int64_t N) : b_(b), attn_res_(c.attn_res_block_size > 0), N_(N) {
    const int64_t H = c.hidden_size;
    const int64_t max_blocks = attn_res_ ? (c.num_layers + c.attn_res_block_size - 1) / c.attn_res_block_size : 0;
    P_ = b.scratch(N, H);
    if (max_blocks > 0) blocks_ = b.scratch(max_blocks * N, H);
  }
  Tensor partial() const { return P_; }
  // out = rmsnorm(sublayer input) * norm_w. A residual add still pending is done first (fused with the norm
  // when the input is P itself: one backend op instead of two).
  void normed_input(const float* res_w, const float* norm_w, float eps, Tensor out) {
    if (n_blocks_ == 0 && pending_) {
      b_.add_rmsnorm(P_, pending_y_, norm_w, eps, out);
      pending_ = false;
    } else if (n_blocks_ == 0) {
      b_.rmsnorm(P_, norm_w, P_.cols, eps, out);
    } else {
      flush();
      b_.attn_res_mix_rmsnorm(blocks_.slice_rows(0, n_blocks_ * N_), n_blocks_, P_, res_w, eps, norm_w, out);
    }
  }
  // The un-normed mix (the head's input); P itself without AttnRes.
  Tensor final_mix(const float* res_w, float eps, Tensor scratch) {
    flush();
    if (n_blocks_ == 0) return P_;
    b_.attn_res_mix(blocks_.slice_rows(0, n_blocks_ * N_), n_blocks_, P_, res_w, eps, scratch);
    return scratch;
  }
  // Layer l's attention output `y`: a new block starts at every block_size-th layer (P saved as a
  // block summary, then restarted from y); else P += y.
  // P += y is deferred to the next normed_input / final_mix: `y` must stay unchanged until then (the layer
  // loop reads the next input before it writes y again).
  void add_mixer(Tensor y, bool starts_block) {
    flush();
    if (starts_block) {
      b_.copy(blocks_.slice_rows(n_blocks_ * N_, N_), P_);
      ++n_blocks_;
      b_.copy(P_, y);
    } else {
      defer_add(y);
    }
  }
  void add_ffn(Tensor y) {
    flush();
    defer_add(y);
  }

 private:
  void defer_add(Tensor y) {
    pending_y_ = y;
    pending_ = true;
  }
  void flush() {
    if (pending_) b_.add(P_, pending_y_);
    pending_ = false;
  }

  Backend& b_;
  bool attn_res_;
  int64_t N_, n_blocks_ = 0;
  Tensor P_, blocks_;
  Tensor pending_y_;      // a residual add not yet done (P += pending_y_)
  bool pending_ = false;
};

// Saves `src` as tap id `id` where the plan asks for it: the logits rows of src (gather) or src itself
// (already those rows: the head's normed input).
void save_tap(Backend& b, const StepPlan& plan, Tensor taps, int64_t id, Tensor src, bool gather) {
  const int64_t R = plan.n_logits();
  for (size_t t = 0; t < plan.tap_layers.size(); ++t) {
    if (plan.tap_layers[t] != id || R == 0) continue;
    const Tensor dst = taps.slice_rows(static_cast<int64_t>(t) * R, R);
    if (gather)
      b.gather_logit_rows(src, dst);
    else
      b.copy(dst, src);
  }
}

}  // namespace

void forward(const ModelConfig& c, const ModelWeights& w, Backend& b, const StepPlan& plan, Tensor logits,
             const dist::ShardPlan* shard, Tensor taps) {
  if (!plan.tap_layers.empty() &&
      (taps.rows != static_cast<int64_t>(plan.tap_layers.size()) * plan.n_logits() || taps.cols != c.hidden_size))
    throw Error("forward: the taps tensor is not [" + std::to_string(plan.tap_layers.size()) + " * " +
                std::to_string(plan.n_logits()) + "][" + std::to_string(c.hidden_size) + "]");
  b.begin_step(plan);
  ScratchScope scope(b);
  const Ctx g{b, c, plan, shard};
  const int64_t N = plan.n_tokens(), H = c.hidden_size;
  const float eps = c.rms_norm_eps;
  const bool attn_res = c.attn_res_block_size > 0;
  Residual res(b, c, N);
  if (g.sharded()) {  // vocab-parallel embedding: each token's row is on one rank, zeros elsewhere
    b.embed_rows(w.embed, shard->vocab.first, res.partial());
    g.reduce(res.partial());
  } else {
    b.embed(w.embed, res.partial());
  }
  Tensor xin = b.scratch(N, H), y = b.scratch(N, H);
  int64_t kda_index = 0, mla_index = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerWeights& L = w.layers[static_cast<size_t>(l)];
    res.normed_input(L.attn_res.w.data(), L.input_norm.data(), eps, xin);
    save_tap(b, plan, taps, l, xin, true);
    if (L.is_kda)
      kda_block(g, L.kda, kda_index++, xin, y);
    else
      mla_block(g, L.mla, mla_index++, xin, y);
    res.add_mixer(y, attn_res && l % c.attn_res_block_size == 0);

    res.normed_input(L.mlp_res.w.data(), L.post_attn_norm.data(), eps, xin);
    if (L.is_moe)
      moe_block(g, L.moe, xin, y);
    else
      glu_mlp_block(g, L.mlp, xin, y);
    res.add_ffn(y);
  }
  const Tensor h = res.final_mix(w.out_res.w.data(), eps, xin);
  // Final norm + lm_head only on the rows whose logits are wanted.
  if (plan.n_logits() > 0) {
    Tensor hs = b.scratch(plan.n_logits(), H);
    b.gather_logit_rows(h, hs);
    b.rmsnorm(hs, w.final_norm.data(), H, eps, hs);
    save_tap(b, plan, taps, c.num_layers, hs, false);
    if (g.sharded()) {  // vocab-parallel head: each rank's rows of lm_head, then the logits gathered
      Tensor part = b.scratch(plan.n_logits(), w.lm_head.rows);
      b.linear(w.lm_head, hs, part);
      b.gather_cols(part, shard->vocab_chunk, logits);
    } else {
      b.linear(w.lm_head, hs, logits);
    }
  }
}

}  // namespace k3::graph
