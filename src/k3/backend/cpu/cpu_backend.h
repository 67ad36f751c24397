// The CPU backend: the graph's ops (model/graph/backend.h) over host memory with the fp32 kernels of
// ops.h, kda.h and mla_attention.h. Every op is batch-invariant: a token's result does not depend on
// which other sequences share the step (the serving engine relies on it).
#pragma once
#include <span>
#include <utility>
#include <vector>

#include "k3/backend/cpu/cpu_profile.h"
#include "k3/backend/cpu/host_arena.h"
#include "k3/core/moe_activation.h"
#include "k3/core/thread_pool.h"
#include "k3/model/graph/backend.h"

namespace k3 {
class ExpertResidency;
}

namespace k3::cpu {

// Sees what the CPU backend's matrix products read and the routed experts produce, as they run (expert
// pruning statistics: model/expert_prune.h; importance matrices: model/imatrix.h). Called on the thread that
// runs the op; every method defaults to nothing.
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  // `linear`: the n input rows (W.cols values each, contiguous) multiplied by W.
  virtual void on_linear_input(const WeightMatrix& /*W*/, const float* /*x*/, int64_t /*n*/) {}
  // A routed expert of layer `w`: its m input rows x [m][gate.cols] (gate and up read them) and h [m][down.cols]
  // (the GLU's output, which down reads).
  virtual void on_expert_inputs(const MoeWeights& /*w*/, int64_t /*expert*/, const float* /*x*/, const float* /*h*/,
                                int64_t /*m*/) {}
  // toks: (token row, routing weight) of the expert's tokens; y: their outputs [toks.size()][cols], before
  // the routing weight is applied.
  virtual void on_expert_outputs(const MoeWeights& /*w*/, int64_t /*expert*/,
                                 std::span<const std::pair<int64_t, float>> /*toks*/, const float* /*y*/, int64_t /*cols*/) {}
  // The absorbed MLA form of layer `w` (decode-form tokens; the rows of q / ol in `rows`): the queries q
  // [row][heads][qk] -- each head's first d.nope values are what kv_b's key half multiplies (llama.cpp's attn_k_b)
  // -- and the attention outputs in latent space ol [row][heads][rank], what its value half multiplies (attn_v_b).
  virtual void on_mla_absorbed(const MlaWeights& /*w*/, const graph::MlaDims& /*d*/, const float* /*q*/,
                               const float* /*ol*/, std::span<const int64_t> /*rows*/) {}
};

class CpuBackend final : public graph::Backend {
 public:
  // KDA chunk of the prefill form when the step does not set one.
  static constexpr int kDefaultKdaChunk = 64;

  // Told which experts each MoE step uses, before they are computed (prefetch, hit counting); may be null.
  void set_expert_residency(ExpertResidency* r) { residency_ = r; }
  // Observes activations (null: none, the default; costs nothing then).
  void set_activation_observer(ActivationObserver* o) { observer_ = o; }
  // --moe-activation-dtype: with MXFP8 or Q8 the routed experts read fake-quantised activations (core/moe_activation.h):
  // each token's input row before gate / up and each GLU output row before down, along the row in blocks of 32.
  // Nothing else changes (shared experts, dense MLPs, attention). Default F32.
  void set_moe_activation_dtype(MoeActivationDType t) { moe_act_ = t; }
  MoeActivationDType moe_activation_dtype() const { return moe_act_; }

  void begin_step(const graph::StepPlan& plan) override;
  graph::Tensor scratch(int64_t rows, int64_t cols, graph::ElemType type) override;
  size_t scratch_mark() const override { return arena_.mark(); }
  void scratch_release(size_t mark) override { arena_.release(mark); }

  void embed(const WeightMatrix& table, graph::Tensor out) override;
  void linear(const WeightMatrix& W, graph::Tensor x, graph::Tensor y) override;
  // Decode-sized groups (a layer's q / k / v / gates, a GLU's gate and up) in ONE fork-join (matmul_batch):
  // the pool is handed out once instead of once per projection, and the activations are converted once.
  void linear_group(graph::Tensor x, std::span<const graph::Projection> ps) override;
  void linear_batch(std::span<const graph::LinearJob> jobs) override;
  void rmsnorm(graph::Tensor x, const float* w, int64_t dim, float eps, graph::Tensor y) override;
  void glu(graph::Tensor gate, graph::Tensor up, const graph::GluParams& p) override;
  void add(graph::Tensor y, graph::Tensor x) override;
  void copy(graph::Tensor dst, graph::Tensor src) override;
  void sigmoid_mul(graph::Tensor y, graph::Tensor g) override;
  void gather_logit_rows(graph::Tensor h, graph::Tensor out) override;
  void block_attention(graph::Tensor q, graph::Tensor k, graph::Tensor v, int64_t block, int64_t heads,
                       int64_t head_dim, float scale, graph::Tensor o) override;
  void attn_res_mix(graph::Tensor blocks, int64_t nb, graph::Tensor partial, const float* w, float eps,
                    graph::Tensor out) override;

  // Decode: the per-head parts in one parallel pass (cpu_backend_kda.cpp); else the ops below in turn.
  // fused_kda_mix_calls(): how many kda_mix calls took the one-pass form, process-wide (tests).
  static uint64_t fused_kda_mix_calls();
  void kda_mix(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate, float eps,
               graph::Tensor pq, graph::Tensor pk, graph::Tensor pv, graph::Tensor graw, graph::Tensor braw,
               graph::Tensor gate_proj, graph::Tensor o) override;
  void kda_conv_l2norm(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, graph::Tensor pq, graph::Tensor pk,
                       graph::Tensor pv, graph::Tensor q, graph::Tensor k, graph::Tensor v) override;
  void kda_gates(const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate, graph::Tensor g,
                 graph::Tensor beta) override;
  void kda_recurrence(int64_t layer, const graph::KdaDims& d, graph::Tensor q, graph::Tensor k, graph::Tensor v,
                      graph::Tensor g, graph::Tensor beta, graph::Tensor o) override;
  void kda_output_gate(const KdaWeights& w, const graph::KdaDims& d, float eps, graph::Tensor o,
                       graph::Tensor gate) override;

  void mla_write_latents(int64_t layer, const graph::MlaDims& d, graph::Tensor lat) override;
  void mla_absorb_q(const MlaWeights& w, const graph::MlaDims& d, graph::Tensor q, graph::Tensor ql) override;
  void mla_attend_latent(int64_t layer, const graph::MlaDims& d, graph::Tensor ql, float scale,
                         graph::Tensor ol) override;
  void mla_up_v(const MlaWeights& w, const graph::MlaDims& d, graph::Tensor ol, graph::Tensor o) override;
  // The absorbed form as one parallel pass over (token, heads) pieces (cpu_backend_mla.cpp).
  void mla_absorbed(int64_t layer, const MlaWeights& w, const graph::MlaDims& d, graph::Tensor q, float scale,
                    graph::Tensor o) override;
  void mla_attend_mha(int64_t layer, const MlaWeights& w, const graph::MlaDims& d, graph::Tensor q, float scale,
                      graph::Tensor o) override;

  void moe_route(graph::Tensor logits, const float* bias, const graph::RouteParams& p, graph::Tensor idx,
                 graph::Tensor wts) override;
  void moe_experts(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                   const graph::GluParams& p, graph::Tensor out) override;
  void moe_experts_beside(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                          const graph::GluParams& p, graph::Tensor out, std::span<const graph::LinearJob> beside) override;

  // Collectives over host memory through the communicator (cpu_backend_dist.cpp).
  void embed_rows(const WeightMatrix& table, int64_t first, graph::Tensor out) override;
  void all_reduce_sum(graph::Tensor x) override;
  void gather_cols(graph::Tensor local, int64_t chunk, graph::Tensor out) override;
  void moe_keep_experts(graph::Tensor idx, const dist::ShardPlan& shard) override;
  void moe_experts_all_to_all(const MoeWeights& w, graph::Tensor x, graph::Tensor idx, graph::Tensor wts,
                              const graph::GluParams& p, graph::Tensor out, const dist::ShardPlan& shard) override;

 private:
  // fn(seq) for the step's sequences that match `want` (null: all), in parallel over sequences when there
  // are several (the kernels inside then run single-threaded, nested); results never depend on it.
  template <typename F>
  void for_seqs(bool (*want)(const graph::StepSeq&), F&& fn);
  // The cached latent rows 0 .. past + n - 1 of one sequence in MLA layer `layer`.
  static std::vector<const void*> latent_rows(const graph::StepSeq& s, int64_t layer);

  const graph::StepPlan* plan_ = nullptr;
  HostArena arena_;
  ExpertResidency* residency_ = nullptr;
  ActivationObserver* observer_ = nullptr;
  MoeActivationDType moe_act_ = MoeActivationDType::F32;
  CpuOpProfile prof_;  // K3_CPU_PROFILE=1: wall time per op, printed when the backend is destroyed
};

template <typename F>
void CpuBackend::for_seqs(bool (*want)(const graph::StepSeq&), F&& fn) {
  std::vector<const graph::StepSeq*> seqs;
  for (const graph::StepSeq& s : plan_->seqs)
    if (!want || want(s)) seqs.push_back(&s);
  if (seqs.size() == 1) {
    fn(*seqs[0]);  // the kernels parallelise inside
    return;
  }
  ThreadPool::global().parallel_for(static_cast<int64_t>(seqs.size()), 1, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) fn(*seqs[static_cast<size_t>(i)]);
  });
}

}  // namespace k3::cpu
