// The Kimi K3 / Kimi-Linear forward pass (model-spec section 3), written once over the op contract of
// backend.h: every backend runs this graph. `logits` [plan.n_logits()][V] is in the backend's memory.
// Sharded (tensor / expert parallel), `c` and `w` are this rank's shard (dist/shard_plan.h,
// dist/shard_weights.h), every rank runs the same plan, and rank 0 alone receives the logits (the other
// ranks' `logits` is not written: its data may be null). With plan.tap_layers, `taps` [T * n_logits][H]
// (backend memory, tap-major: tap t's rows at t * n_logits) receives the taps of the logits rows
// (runtime/model_runner.h, ForwardOptions::tap_layers; docs/block-drafter.md).
#pragma once
#include "k3/dist/shard_plan.h"
#include "k3/model/config.h"
#include "k3/model/graph/backend.h"
#include "k3/model/weights.h"

namespace k3::graph {

void forward(const ModelConfig& c, const ModelWeights& w, Backend& b, const StepPlan& plan, Tensor logits,
             const dist::ShardPlan* shard = nullptr, Tensor taps = {});

}  // namespace k3::graph
