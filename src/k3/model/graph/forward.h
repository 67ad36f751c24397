// The Kimi K3 / Kimi-Linear forward pass (model-spec section 3), written once over the op contract of
// backend.h: every backend runs this graph. `logits` [plan.n_logits()][V] is in the backend's memory.
#pragma once
#include "k3/model/config.h"
#include "k3/model/graph/backend.h"
#include "k3/model/weights.h"

namespace k3::graph {

void forward(const ModelConfig& c, const ModelWeights& w, Backend& b, const StepPlan& plan, Tensor logits);

}  // namespace k3::graph
