// The named builders of the forward graph (forward.cpp calls them per layer): each reads its input x
// [N][H] (the normed residual) and writes out [N][H]; its temporaries are the backend's scratch.
#pragma once
#include "k3/dist/shard_plan.h"
#include "k3/model/config.h"
#include "k3/model/graph/backend.h"
#include "k3/model/weights.h"

namespace k3::graph {

// What every builder reads: the backend it enqueues on, the model's shapes (of this rank's shard), the
// step's batch, and the shard this rank runs (null: the whole model in one process).
struct Ctx {
  Backend& b;
  const ModelConfig& c;
  const StepPlan& plan;
  const dist::ShardPlan* shard = nullptr;
  bool sharded() const { return shard != nullptr && shard->runs_collectives(); }
  // After a row-parallel linear: every rank's partial sums added (nothing in one process).
  void reduce(Tensor partial) const {
    if (sharded()) b.all_reduce_sum(partial);
  }
};

KdaDims kda_dims(const ModelConfig& c);
MlaDims mla_dims(const ModelConfig& c);
GluParams glu_params(const ModelConfig& c);

// KDA token mixer: projections, conv, gates, recurrence over the layer's state, gated output norm, o_proj.
void kda_block(const Ctx& g, const KdaWeights& w, int64_t kda_index, Tensor x, Tensor out);
// Gated MLA: latent projections, cache write, absorbed and/or MHA attention, output gate, o_proj.
void mla_block(const Ctx& g, const MlaWeights& w, int64_t mla_index, Tensor x, Tensor out);
// Dense GLU MLP (first layers, shared experts).
void glu_mlp_block(const Ctx& g, const GluMlp& w, Tensor x, Tensor out);
// The same without the reduction: `out` holds this rank's partial sum when sharded.
void glu_mlp_partial(const Ctx& g, const GluMlp& w, Tensor x, Tensor out);
// MoE: routing, routed experts (in K3's latent space when configured), shared experts.
void moe_block(const Ctx& g, const MoeWeights& w, Tensor x, Tensor out);

}  // namespace k3::graph
