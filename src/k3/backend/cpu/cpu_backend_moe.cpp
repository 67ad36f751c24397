// CpuBackend's MoE ops (model-spec 3.4): routing, and the routed experts grouped by expert, run in
// parallel, their outputs added per token in expert-id order (so results do not depend on the thread
// count or on batching).
#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/core/moe_activation.h"
#include "k3/runtime/expert_residency.h"

namespace k3::cpu {

using graph::Tensor;

namespace {
// Batches up to this many tokens run the experts' two matmul stages in one fork-join (matmul_two_stage);
// larger ones keep two (their GLUs are big enough to split over the threads themselves).
constexpr int64_t kTwoStageMaxTokens = 32;
// K3_MOE_TWO_STAGE=0: the two fork-joins at every size (an A/B switch for the measurement; same bits).
bool two_stage_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("K3_MOE_TWO_STAGE");
    return e == nullptr || std::string(e) != "0";
  }();
  return on;
}
// out[t] = sum of token t's expert outputs weighted, in expert-id order (the order of the sum: results do not depend
// on the thread count or on batching). by_expert[e]: (token, weight) per row of expert e's output rows rows_of[e]
// (null: expert e unused).
void sum_expert_outputs(const std::vector<std::vector<std::pair<int64_t, float>>>& by_expert,
                        const std::vector<const float*>& rows_of, int64_t n, int64_t K, int64_t X, bool parallel, Tensor out) {
  std::vector<std::pair<const float*, float>> picks(static_cast<size_t>(n * K));  // (output row, weight), K per token
  std::vector<int32_t> n_picks(static_cast<size_t>(n), 0);
  for (size_t e = 0; e < by_expert.size(); ++e) {
    if (rows_of[e] == nullptr) continue;
    const auto& toks = by_expert[e];
    for (size_t j = 0; j < toks.size(); ++j) {
      const auto [t, p] = toks[j];
      picks[static_cast<size_t>(t * K + n_picks[static_cast<size_t>(t)]++)] = {rows_of[e] + static_cast<int64_t>(j) * X, p};
    }
  }
  parallel_for(n, parallel, [&](int64_t t) {
    float* a = out.row(t);
    std::fill(a, a + X, 0.f);
    for (int32_t i = 0; i < n_picks[static_cast<size_t>(t)]; ++i) {
      const auto [y, p] = picks[static_cast<size_t>(t * K + i)];
      for (int64_t d = 0; d < X; ++d) a[d] += p * y[d];
    }
  });
}
}  // namespace

void CpuBackend::moe_route(Tensor logits, const float* bias, const graph::RouteParams& p, Tensor idx, Tensor wts) {
  CpuOpProfile::Scope ps(prof_, "moe_route");
  const int64_t n = logits.rows, E = logits.cols, K = p.top_k;
  float* s = logits.f();  // the router output becomes the scores, in place
  sigmoid_inplace(s, n * E);
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < n; ++t) {
    const float* st = s + t * E;
    std::iota(order.begin(), order.end(), 0);
    // Highest biased score first; ties to the lower expert id (stable, deterministic).
    std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int64_t a, int64_t b) {
      const float sa = st[a] + bias[a];
      const float sb = st[b] + bias[b];
      return sa > sb || (sa == sb && a < b);
    });
    float denom = 0;
    for (int64_t j = 0; j < K; ++j) denom += st[order[static_cast<size_t>(j)]];
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = order[static_cast<size_t>(j)];
      idx.i()[t * K + j] = static_cast<int32_t>(e);
      wts.f()[t * K + j] = (p.renormalize ? st[e] / (denom + 1e-20f) : st[e]) * p.scale;
    }
  }
}

void CpuBackend::moe_experts(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& gp,
                             Tensor out) {
  moe_experts_beside(w, x, idx, wts, gp, out, {});
}

// The beside products join the experts' batch as first-stage jobs of their own group (no GLU, no second stage)
// at decode sizes, or their gate / up batch above; with an observer (imatrix) they run through `linear`, which
// reports their inputs.
void CpuBackend::moe_experts_beside(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& gp,
                                    Tensor out, std::span<const graph::LinearJob> beside) {
  if (observer_ != nullptr && !beside.empty()) {
    moe_experts_beside(w, x, idx, wts, gp, out, {});
    return graph::Backend::linear_batch(beside);
  }
  std::vector<MatmulJob> extra;
  for (const graph::LinearJob& j : beside) {
    if (!j.x.contiguous() || !j.y.contiguous() || j.x.cols != j.W->cols || j.y.cols != j.W->rows || j.x.rows != j.y.rows)
      throw Error("cpu backend: moe_experts_beside needs contiguous rows of matching shapes");
    extra.push_back({j.W, j.x.f(), j.x.rows, j.y.f()});
  }
  const int64_t n = x.rows, X = x.cols, K = idx.cols, E = static_cast<int64_t>(w.experts.size());
  CpuOpProfile::Scope ps(prof_, n <= kTwoStageMaxTokens ? "moe_experts n<=32" : "moe_experts n>32");
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(E));  // (token, weight)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = idx.i()[t * K + j];
      if (e < 0) continue;  // another rank's expert (expert parallel)
      by_expert[static_cast<size_t>(e)].emplace_back(t, wts.f()[t * K + j]);
    }

  std::vector<int64_t> active;
  for (int64_t e = 0; e < E; ++e)
    if (!by_expert[static_cast<size_t>(e)].empty()) active.push_back(e);
  // Routing is known: prefetch what is not resident and compute the resident experts first (the sum
  // below stays in expert-id order, so the order of computing changes nothing).
  if (residency_ && E > 0) {
    CpuOpProfile::Scope pr(prof_, "moe_experts: residency");
    residency_->on_routed(w.experts[0].gate.data, active);
  }
  if (prof_.on()) {  // the routed experts' bytes, each streamed once
    int64_t bytes = 0;
    for (int64_t e : active) {
      const GluMlp& ex = w.experts[static_cast<size_t>(e)];
      bytes += ex.gate.bytes() + ex.up.bytes() + ex.down.bytes();
    }
    for (const MatmulJob& j : extra) bytes += j.W->bytes();
    ps.set_bytes(bytes);
  }
  // Every active expert's gate and up, the GLUs, then every down, with the rows of all experts shared out: one
  // fork-join per layer at decode sizes (matmul_two_stage), two above (3 per expert, 24, before session 7).
  const size_t A = active.size();
  const size_t mark = arena_.mark();
  // The gathers and the sum below run in parallel at prefill sizes (serial they were ~3-5% of a kl-1b pp512's
  // wall time with 2 threads); they copy / add the same values in the same order on any thread.
  const bool big = n * K * X > 65536;
  // --moe-activation-dtype mxfp8 / q8: the experts read a fake-quantised copy of x (x itself may be the shared experts'
  // input too), one row per token, so a token's row is the same whether it comes alone or in a prefill batch.
  const bool act_q = moe_act_ != MoeActivationDType::F32;
  if (act_q) {
    float* xq = static_cast<float*>(arena_.take(static_cast<size_t>(n * X) * sizeof(float)));
    parallel_for(n, big, [&](int64_t t) {
      std::copy(x.row(t), x.row(t) + X, xq + t * X);
      fake_quant_moe_row(moe_act_, xq + t * X, X);
    });
    x = Tensor::f32(xq, n, X);
  }
  // Each active expert's gathered inputs, gate, up and output rows, from the step's arena: fresh vectors
  // here cost a zero-fill and page faults per call (pp512 on kl-1b: ~75 MB per layer, 5-10% of prefill in
  // the kernel's page-fault path); a warm arena is mapped already. Released before returning.
  struct Slot {
    float *x, *g, *u, *y;
    int64_t m, I;  // tokens, intermediate width
    const float* in;  // the gate / up input: x (gathered), or the token's own row when m == 1
  };
  std::vector<Slot> slots(A);
  int64_t total = 0;
  for (size_t ai = 0; ai < A; ++ai) {
    const int64_t m = static_cast<int64_t>(by_expert[static_cast<size_t>(active[ai])].size());
    total += m * (2 * X + 2 * w.experts[static_cast<size_t>(active[ai])].gate.rows);
  }
  float* next = static_cast<float*>(arena_.take(static_cast<size_t>(total) * sizeof(float)));
  std::vector<size_t> slot_of(static_cast<size_t>(E), A);  // expert id -> its slot in `active`
  std::vector<MatmulJob> gate_up, down;
  for (size_t ai = 0; ai < A; ++ai) {
    const int64_t e = active[ai];
    slot_of[static_cast<size_t>(e)] = ai;
    const auto& toks = by_expert[static_cast<size_t>(e)];
    const GluMlp& ex = w.experts[static_cast<size_t>(e)];
    const int64_t m = static_cast<int64_t>(toks.size()), I = ex.gate.rows;
    Slot& sl = slots[ai];
    sl = {next, next + m * X, next + m * X + m * I, next + m * X + 2 * m * I, m, I, next};
    next += m * (2 * X + 2 * I);
    // An expert with one token reads that token's row of x in place: at decode every routed expert then has the
    // same input pointer, and matmul_two_stage converts it once for all of them instead of once per expert.
    if (m == 1) sl.in = x.row(toks[0].first);
    gate_up.push_back({&ex.gate, sl.in, m, sl.g});
    gate_up.push_back({&ex.up, sl.in, m, sl.u});
    down.push_back({&ex.down, sl.g, m, sl.y});
  }
  parallel_for(static_cast<int64_t>(A), big, [&](int64_t ai) {
    const auto& toks = by_expert[static_cast<size_t>(active[static_cast<size_t>(ai)])];
    if (toks.size() == 1) return;  // read in place (Slot::in)
    for (size_t j = 0; j < toks.size(); ++j) {
      const float* src = x.row(toks[j].first);
      std::copy(src, src + X, slots[static_cast<size_t>(ai)].x + static_cast<int64_t>(j) * X);
    }
  });
  auto glu = [&](int64_t ai) {
    const Slot& sl = slots[static_cast<size_t>(ai)];
    const int64_t cnt = sl.m * sl.I;
    if (gp.situ)
      situ_glu(sl.g, sl.u, cnt, gp.beta, gp.linear_beta, sl.g);
    else
      silu_glu(sl.g, sl.u, cnt, sl.g);
    if (act_q)  // down reads h rounded like the input: each (token, expert) row of I values on its own
      for (int64_t r = 0; r < sl.m; ++r) fake_quant_moe_row(moe_act_, sl.g + r * sl.I, sl.I);
  };
  if (n <= kTwoStageMaxTokens && !observer_ && two_stage_enabled()) {
    // Decode-sized: gate/up, each expert's GLU (by the thread that finishes its gate/up) and the downs in ONE
    // fork-join (ops.h matmul_two_stage): per layer one hand-over of the pool instead of two, and the GLUs
    // and the downs' conversions spread over the threads instead of running on the caller in between.
    std::vector<int> gu_group(gate_up.size()), dn_group(down.size());
    for (size_t i = 0; i < gate_up.size(); ++i) gu_group[i] = static_cast<int>(i / 2);
    for (size_t i = 0; i < down.size(); ++i) dn_group[i] = static_cast<int>(i);
    for (const MatmulJob& j : extra) {  // group A: the beside products, nothing after them
      gate_up.push_back(j);
      gu_group.push_back(static_cast<int>(A));
    }
    CpuOpProfile::Scope pm(prof_, "moe_experts: matmul_two_stage");
    matmul_two_stage(gate_up, gu_group, down, dn_group, static_cast<int>(A + (extra.empty() ? 0 : 1)), [&](int ai) {
      if (static_cast<size_t>(ai) < A) glu(ai);
    });
  } else {
    gate_up.insert(gate_up.end(), extra.begin(), extra.end());
    matmul_batch(gate_up);
    int64_t glu_elems = 0;
    for (const Slot& sl : slots) glu_elems += sl.m * sl.I;
    parallel_for(static_cast<int64_t>(A), glu_elems > 65536, glu);
    if (observer_)
      for (size_t ai = 0; ai < A; ++ai) observer_->on_expert_inputs(w, active[ai], slots[ai].in, slots[ai].g, slots[ai].m);
    matmul_batch(down);
  }
  if (observer_)
    for (size_t ai = 0; ai < A; ++ai)
      observer_->on_expert_outputs(w, active[ai], by_expert[static_cast<size_t>(active[ai])], slots[ai].y, X);
  std::vector<const float*> rows_of(static_cast<size_t>(E), nullptr);  // expert id -> its output rows
  for (int64_t e = 0; e < E; ++e)
    if (slot_of[static_cast<size_t>(e)] != A) rows_of[static_cast<size_t>(e)] = slots[slot_of[static_cast<size_t>(e)]].y;
  sum_expert_outputs(by_expert, rows_of, n, K, X, big, out);
  arena_.release(mark);
  // Used standalone (the CUDA backend's host experts: no steps, nothing else on the arena), the arena is
  // merged here into one chunk of the high-water size, as begin_step does for a CPU step.
  if (mark == 0) arena_.reset();
}

}  // namespace k3::cpu
