// The block drafter's forward pass (docs/block-drafter.md, "Arithmetic"), written once over the graph's op
// contract (model/graph/backend.h) as the target's forward is: R drafts at once, each a block of
// block_size positions that attend to each other (not causally), then the target's lm_head on the first
// n_out positions of every block.
#pragma once
#include <cstdint>

#include "k3/model/drafter/drafter_config.h"
#include "k3/model/drafter/drafter_weights.h"
#include "k3/model/graph/backend.h"

namespace k3::drafter {

// plan.tokens: the R drafts' last tokens a_i (the target's embedding of each is block position 0's input;
// the plan has no sequences: the drafter keeps no cache). ctx [R][T * H]: each draft's taps. logits
// [R * n_out][V]: block position j of draft i at row i * n_out + j, 1 <= n_out <= block_size. All three in
// the backend's memory; calls b.begin_step(plan). Throws k3::Error on mismatched shapes.
void drafter_forward(const DrafterConfig& c, const DrafterWeights& w, graph::Backend& b, const graph::StepPlan& plan,
                     graph::Tensor ctx, int64_t n_out, graph::Tensor logits);

}  // namespace k3::drafter
