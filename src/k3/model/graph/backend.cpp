// The composed defaults of the fused ops (backend.h).
#include "k3/model/graph/backend.h"

#include "k3/core/error.h"

namespace k3::graph {

void Backend::attn_res_mix_rmsnorm(Tensor blocks, int64_t nb, Tensor partial, const float* w, float eps,
                                   const float* norm_w, Tensor out) {
  ScratchScope scope(*this);
  Tensor mixed = scratch(out.rows, out.cols);
  attn_res_mix(blocks, nb, partial, w, eps, mixed);
  rmsnorm(mixed, norm_w, out.cols, eps, out);
}

void Backend::add_rmsnorm(Tensor y, Tensor x, const float* w, float eps, Tensor out) {
  add(y, x);
  rmsnorm(y, w, y.cols, eps, out);
}

void Backend::linear_group(Tensor x, std::span<const Projection> ps) {
  for (const Projection& p : ps) linear(*p.W, x, p.y);
}

void Backend::linear_batch(std::span<const LinearJob> jobs) {
  for (const LinearJob& j : jobs) linear(*j.W, j.x, j.y);
}

void Backend::kda_mix(int64_t layer, const KdaWeights& w, const KdaDims& d, const KdaGate& gate, float eps, Tensor pq,
                      Tensor pk, Tensor pv, Tensor graw, Tensor braw, Tensor gate_proj, Tensor o) {
  ScratchScope scope(*this);
  const int64_t N = pq.rows, C = d.channels();
  Tensor q = scratch(N, C), k = scratch(N, C), v = scratch(N, C);
  kda_conv_l2norm(layer, w, d, pq, pk, pv, q, k, v);
  kda_gates(w, d, gate, graw, braw);
  kda_recurrence(layer, d, q, k, v, graw, braw, o);
  kda_output_gate(w, d, eps, o, gate_proj);
}

void Backend::mla_absorbed(int64_t layer, const MlaWeights& w, const MlaDims& d, Tensor q, float scale, Tensor o) {
  ScratchScope scope(*this);
  const int64_t N = q.rows, nh = d.heads;
  Tensor ql = scratch(N, nh * d.row()), ol = scratch(N, nh * d.rank);
  mla_absorb_q(w, d, q, ql);
  mla_attend_latent(layer, d, ql, scale, ol);
  mla_up_v(w, d, ol, o);
}

// No defaults for the collectives: where the tensors live decides how they move (host buffers through
// MPI, device buffers through NCCL on the backend's stream), so each backend that runs sharded says so.
void Backend::moe_experts_with_shared(const MoeWeights&, Tensor, Tensor, Tensor, const GluParams&, Tensor) {
  throw Error("this backend does not fuse the shared experts into the routed ones (moe_experts_with_shared)");
}
void Backend::all_reduce_sum(Tensor) { throw Error("this backend does not run tensor parallel (all_reduce_sum)"); }
void Backend::embed_rows(const WeightMatrix&, int64_t, Tensor) {
  throw Error("this backend does not run tensor parallel (embed_rows)");
}
void Backend::gather_cols(Tensor, int64_t, Tensor) {
  throw Error("this backend does not run tensor parallel (gather_cols)");
}
void Backend::moe_keep_experts(Tensor, const dist::ShardPlan&) {
  throw Error("this backend does not run expert parallel (moe_keep_experts)");
}
void Backend::moe_experts_all_to_all(const MoeWeights&, Tensor, Tensor, Tensor, const GluParams&, Tensor,
                                     const dist::ShardPlan&) {
  throw Error("this backend does not run expert parallel with all-to-all dispatch (moe_experts_all_to_all)");
}

}  // namespace k3::graph
