// The op contract between the forward graph (model/graph/forward.h: the model written once) and a
// backend (backend/cpu, backend/cuda: the kernels). The graph owns the model logic: which ops run in
// which order on which tensors; a backend owns where the memory is, how each op is computed, and the
// step data its kernels need (Backend::begin_step). No model logic in a backend beyond one op's
// definition below; no device code in the graph.
//
// Conventions: activations are fp32 Tensors [rows][cols] in this backend's memory (tensor.h); an op
// writes every element of its outputs; an output never aliases an input unless the op says so.
// Cache-reading ops take the layer's index among layers of its kind (KDA or MLA) and read the caches of
// the step's sequences (StepPlan). Fused ops are virtual with a composed default here; a backend
// overrides them only where it has a faster kernel with the same results (within the stated tolerance).
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "k3/core/weight.h"
#include "k3/dist/communicator.h"
#include "k3/model/graph/step.h"
#include "k3/model/graph/tensor.h"
#include "k3/model/weights.h"

namespace k3::dist {
struct ShardPlan;
}

namespace k3::graph {

// GLU activation: gate = act(gate) * up.  SiLU: g * sigmoid(g); SiTU (K3): beta * tanh(g / beta) *
// sigmoid(g) * linear_beta * tanh(u / linear_beta) (model-spec section 3.4).
struct GluParams {
  bool situ = false;
  float beta = 0, linear_beta = 0;
};

// KDA shapes (per rank): Hk heads of D channels (C = Hk * D), short conv of W taps.
struct KdaDims {
  int64_t heads = 0, head_dim = 0, conv = 0;
  int64_t channels() const { return heads * head_dim; }
};
// KDA decay gate: bounded: lower_bound * sigmoid(exp(A_log) * z), else -exp(A_log) * softplus(z), z = g + dt_bias.
struct KdaGate {
  bool bounded = false;
  float lower_bound = 0;
};

// MLA shapes (per rank): heads, nope / rope / value head dims, latent rank kr; cache rows are kr + dr.
struct MlaDims {
  int64_t heads = 0, nope = 0, rope = 0, value = 0, rank = 0;
  int64_t qk() const { return nope + rope; }
  int64_t row() const { return rank + rope; }
};

// MoE routing: sigmoid scores, top-k by score + bias (ties to the lower expert id), weight = (renormalise ?
// s / (sum of the k chosen s + 1e-20) : s) * scale.
struct RouteParams {
  int64_t top_k = 0;
  bool renormalize = true;
  float scale = 1;
};

// One projection of a linear_group: y = x . W^T.
struct Projection {
  const WeightMatrix* W;
  Tensor y;
};

// One product of a linear_batch: y = x . W^T, each with its own input.
struct LinearJob {
  const WeightMatrix* W;
  Tensor x, y;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // ---- step and memory ----
  // Called once per step before any op; the plan outlives the step's ops.
  virtual void begin_step(const StepPlan& plan) = 0;
  // Scratch memory for the step, stack-ordered: release(mark) frees everything taken after mark().
  // Taking the same sizes in the same order gives the same addresses (CUDA graphs rely on it).
  virtual Tensor scratch(int64_t rows, int64_t cols, ElemType type = ElemType::F32) = 0;
  virtual size_t scratch_mark() const = 0;
  virtual void scratch_release(size_t mark) = 0;

  // ---- dense ----
  // out[t] = table row plan.tokens[t], as fp32.
  virtual void embed(const WeightMatrix& table, Tensor out) = 0;
  // y = x . W^T   (x [n][W.cols], y [n][W.rows])
  virtual void linear(const WeightMatrix& W, Tensor x, Tensor y) = 0;
  // y_i = x . W_i^T for projections that read the same x (a layer's q / k / v / gates): a backend may run
  // them as one launch (CUDA: a grouped kernel for decode batches); each y_i as `linear` would give it.
  // Default: `linear` for each, in order.
  virtual void linear_group(Tensor x, std::span<const Projection> ps);
  // y_i = x_i . W_i^T for independent products with their own inputs (a KDA layer's two low-rank second
  // halves): a backend may run them as one fork-join / launch (at 16 CPU threads a small projection costs its
  // hand-over more than its bytes); each y_i as `linear` would give it. Default: `linear` for each, in order.
  virtual void linear_batch(std::span<const LinearJob> jobs);
  // y = x * rsqrt(mean(x^2) + eps) * w over the first `dim` values of each row (w null: no weight);
  // y may alias x; values past dim are left as they are.
  virtual void rmsnorm(Tensor x, const float* w, int64_t dim, float eps, Tensor y) = 0;
  // gate = act(gate) * up
  virtual void glu(Tensor gate, Tensor up, const GluParams& p) = 0;
  virtual void add(Tensor y, Tensor x) = 0;          // y += x
  // y += x, then out = rmsnorm(y) * w over all of y's columns: the residual add and the next sublayer's input
  // norm (a backend may fuse them; CUDA: one kernel). Default: `add`, then `rmsnorm`.
  virtual void add_rmsnorm(Tensor y, Tensor x, const float* w, float eps, Tensor out);
  // dst = src, row by row (the same rows x cols): either may be a strided view (a column range of a wider
  // tensor), and src.stride == 0 repeats src's one row into every row of dst (a broadcast).
  virtual void copy(Tensor dst, Tensor src) = 0;
  virtual void sigmoid_mul(Tensor y, Tensor g) = 0;  // y *= sigmoid(g)
  // out[r] = h[plan.logit_rows[r]]
  virtual void gather_logit_rows(Tensor h, Tensor out) = 0;

  // ---- the block drafter (docs/block-drafter.md) ----
  // Attention inside blocks, not causal: rows come in blocks of `block` consecutive rows (N % block == 0);
  // per head m (columns m * head_dim .. of q, k, v, o, all [N][heads * head_dim], contiguous), row i's
  // o = sum_j softmax_j(q_i . k_j * scale) v_j over the rows j of i's block.
  virtual void block_attention(Tensor q, Tensor k, Tensor v, int64_t block, int64_t heads, int64_t head_dim,
                               float scale, Tensor o) = 0;

  // ---- Attention Residuals (model-spec 3.1) ----
  // For each row: softmax over the nb + 1 sources [block 0 .. block nb-1, partial] of
  // (RMSNorm_noweight(v) . w), mixing the raw v. blocks: [nb * N][H], block b = rows [b N, (b+1) N).
  virtual void attn_res_mix(Tensor blocks, int64_t nb, Tensor partial, const float* w, float eps, Tensor out) = 0;
  // The mix followed by rmsnorm(., norm_w, eps).
  virtual void attn_res_mix_rmsnorm(Tensor blocks, int64_t nb, Tensor partial, const float* w, float eps,
                                    const float* norm_w, Tensor out);

  // ---- KDA (model-spec 3.2) ----
  // Short causal conv + SiLU of each projection over each sequence's conv state (read and updated), then
  // per-head L2 norm of q (times 1/sqrt(D)) and k. pq/pk/pv -> q/k/v, all [N][C].
  virtual void kda_conv_l2norm(int64_t layer, const KdaWeights& w, const KdaDims& d, Tensor pq, Tensor pk, Tensor pv,
                               Tensor q, Tensor k, Tensor v) = 0;
  // In place: g [N][C] (f_b output) -> per-channel log decay; beta [N][Hk] (b_proj output) -> sigmoid.
  virtual void kda_gates(const KdaWeights& w, const KdaDims& d, const KdaGate& gate, Tensor g, Tensor beta) = 0;
  // The gated delta rule over each sequence's recurrent state: chunked for prefill-form sequences
  // (plan.kda_chunk, or the backend's default), token by token otherwise. o [N][C].
  virtual void kda_recurrence(int64_t layer, const KdaDims& d, Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta,
                              Tensor o) = 0;
  // In place: o = RMSNorm_D(o) * o_norm * sigmoid(gate), per head.
  virtual void kda_output_gate(const KdaWeights& w, const KdaDims& d, float eps, Tensor o, Tensor gate) = 0;
  // Everything between the projections and o_proj: conv + norms, gates, recurrence, output gate, from
  // the raw projections (pq, pk, pv, f_b output graw, b_proj output braw, output-gate projection gate);
  // graw and braw may be overwritten. Default: the four ops above.
  virtual void kda_mix(int64_t layer, const KdaWeights& w, const KdaDims& d, const KdaGate& gate, float eps, Tensor pq,
                       Tensor pk, Tensor pv, Tensor graw, Tensor braw, Tensor gate_proj, Tensor o);

  // ---- MLA (model-spec 3.3) ----
  // Writes the new tokens' latent rows lat [N][kr + dr] into each sequence's cache (positions past ..).
  virtual void mla_write_latents(int64_t layer, const MlaDims& d, Tensor lat) = 0;
  // Absorbed (decode) form, for the rows of decode-form sequences (other rows: unspecified):
  //   ql[t][h] = [W_UK_h^T q_nope[t][h] | q_pe[t][h]]     q [N][nh * (dn + dr)] -> ql [N][nh * (kr + dr)]
  virtual void mla_absorb_q(const MlaWeights& w, const MlaDims& d, Tensor q, Tensor ql) = 0;
  //   ol[t][h] = sum_s softmax_s(ql[t][h] . row_s * scale) c_kv_s over the cached rows 0 .. past + t
  virtual void mla_attend_latent(int64_t layer, const MlaDims& d, Tensor ql, float scale, Tensor ol) = 0;
  //   o[t][h] = W_UV_h ol[t][h]                            ol [N][nh * kr] -> o [N][nh * dv]
  virtual void mla_up_v(const MlaWeights& w, const MlaDims& d, Tensor ol, Tensor o) = 0;
  // The whole absorbed form, q -> o for the rows of decode-form sequences: by default the three ops above in
  // turn (their intermediates in scratch); a backend may run them as one pass (the CPU, per (token, head)).
  virtual void mla_absorbed(int64_t layer, const MlaWeights& w, const MlaDims& d, Tensor q, float scale, Tensor o);
  // MHA (prefill) form for the rows of prefill-form sequences (other rows untouched): k_nope / v expanded
  // from the cached latents, causal softmax attention. q [N][nh * (dn + dr)] -> o [N][nh * dv].
  virtual void mla_attend_mha(int64_t layer, const MlaWeights& w, const MlaDims& d, Tensor q, float scale,
                              Tensor o) = 0;

  // ---- MoE (model-spec 3.4) ----
  // logits [N][E] (router output, before the sigmoid), bias [E] -> idx [N][k] (I32, rank order), wts [N][k].
  virtual void moe_route(Tensor logits, const float* bias, const RouteParams& p, Tensor idx, Tensor wts) = 0;
  // out[t] = sum_k wts[t][k] * expert_idx[t][k](x[t]) over the layer's routed experts (GLU FFNs); entries
  // with idx < 0 (experts of another rank: moe_keep_experts) add nothing.
  virtual void moe_experts(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const GluParams& p, Tensor out) = 0;
  // moe_experts in two halves: `out` is defined once moe_experts_wait() returns, and the graph issues
  // independent work (the shared experts) in between. A backend whose routed experts live elsewhere
  // (CUDA with --cpu-moe: experts on the CPU) runs that work on the device while the CPU computes the
  // experts. The inputs must stay untouched until the wait. Default: all of it at the start.
  virtual void moe_experts_start(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const GluParams& p, Tensor out) {
    moe_experts(w, x, idx, wts, p, out);
  }
  virtual void moe_experts_wait() {}
  // moe_experts, plus independent products that run beside the routed experts (the shared experts' down
  // projection, its input ready): a backend may put them in the experts' own fork-join (CPU: first-stage jobs
  // of the two-stage batch; at 16 threads a 2048 x 384 projection alone costs twice its bytes). Each product
  // as `linear` gives it. Default: moe_experts, then linear_batch.
  virtual void moe_experts_beside(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const GluParams& p, Tensor out,
                                  std::span<const LinearJob> beside) {
    moe_experts(w, x, idx, wts, p, out);
    linear_batch(beside);
  }
  // The routed experts and the layer's shared experts in one op, out = routed + shared, where this backend has a
  // form that pays for N tokens (CUDA: its batch-1 GEMV kernels take the shared expert as one more pair, saving the
  // shared MLP's own launches). The MoE block asks moe_fuses_shared first (no latent space, not sharded); the default
  // says no and moe_experts_with_shared throws.
  virtual bool moe_fuses_shared(const MoeWeights& w, int64_t n) const {
    (void)w;
    (void)n;
    return false;
  }
  virtual void moe_experts_with_shared(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const GluParams& p,
                                       Tensor out);
  // True when the routed experts run beside the graph's next ops (start / wait above): the MoE block then
  // leaves the shared experts between start and wait. False (the default: experts done in start), the block
  // computes the router and the shared experts' gate / up in ONE linear_group (they read the same x), which at
  // decode saves the router's own hand-over (the same bits: each product as `linear` gives it).
  virtual bool moe_experts_overlap() const { return false; }

  // ---- collectives (tensor / expert parallel: dist/shard_plan.h, docs/multi-gpu.md) ----
  // The graph calls these only when the step runs sharded; a backend without them throws k3::Error.
  // The communicator they run over is the runner's (null: one process).
  void set_communicator(dist::Communicator* c) { comm_ = c; }
  dist::Communicator* communicator() const { return comm_; }
  // Vocab-parallel embedding: out[t] = table row (plan.tokens[t] - first) for the tokens this rank's rows
  // [first, first + table.rows) hold, zeros for the others (the all-reduce that follows fills them in).
  virtual void embed_rows(const WeightMatrix& table, int64_t first, Tensor out);
  // In place: x = the sum over ranks of x (after a row-parallel linear: each rank holds a partial sum).
  virtual void all_reduce_sum(Tensor x);
  // On rank 0: out [rows][V] = every rank's local [rows][<= chunk] side by side, rank r's at columns
  // r * chunk, the columns past out.cols dropped (the vocab-parallel head's logits). Other ranks: out is
  // not written (its data may be null): only rank 0 samples.
  virtual void gather_cols(Tensor local, int64_t chunk, Tensor out);
  // Expert parallel, in place over idx [N][k] (moe_route's output): an expert this rank computes becomes
  // its index among this rank's experts (ShardPlan::local_expert), any other -1, which moe_experts skips.
  virtual void moe_keep_experts(Tensor idx, const dist::ShardPlan& shard);
  // Expert parallel with dispatch / combine (ShardPlan::expert_all_to_all): this rank takes its share of
  // the N tokens (a balanced block), sends each (token, routed expert) row of x to the rank owning the
  // expert (all_to_all_v), computes the rows it receives with its experts (moe_experts, weighted),
  // returns them, and sums each of its tokens' K results: out = the routed experts' sum on this rank's
  // tokens, zeros on the others (the all-reduce that follows fills them in). idx holds expert ids.
  virtual void moe_experts_all_to_all(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const GluParams& p,
                                      Tensor out, const dist::ShardPlan& shard);

 protected:
  dist::Communicator* comm_ = nullptr;
};

// Scratch taken inside a scope is given back when the scope ends.
class ScratchScope {
 public:
  explicit ScratchScope(Backend& b) : b_(b), mark_(b.scratch_mark()) {}
  ~ScratchScope() { b_.scratch_release(mark_); }
  ScratchScope(const ScratchScope&) = delete;
  ScratchScope& operator=(const ScratchScope&) = delete;

 private:
  Backend& b_;
  size_t mark_;
};

}  // namespace k3::graph
