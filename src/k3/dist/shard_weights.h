// One rank's ModelWeights from the whole model's, as a ShardPlan says (shard_plan.h). Row slices (the
// output features of column-parallel linears: q/k/v, gates, q_b, kv_b, MLP gate/up, lm_head) are views
// into the same storage, no copy. Column slices of row-major matrices (the input features of
// row-parallel linears: KDA / MLA o_proj, MLP and expert down) cannot be views, since a WeightMatrix has
// no row stride: they are copied, whole blocks of the format per row (a slice must start and end on a
// block boundary, else a clear error). Small vectors are copied. The result borrows from `full` (keep it
// alive) and owns its copies.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "k3/dist/shard_plan.h"
#include "k3/model/weights.h"

namespace k3::dist {

struct ShardedWeights {
  ModelWeights w;
  std::vector<std::unique_ptr<uint8_t[]>> copies;  // the column slices' bytes
  int64_t copied_bytes = 0;
};

// Throws k3::Error when a column slice does not fall on the format's blocks.
ShardedWeights shard_weights(const ModelWeights& full, const ModelConfig& c, const ShardPlan& p);

// Rows [first, first + count) of m: a view.
WeightMatrix row_slice(const WeightMatrix& m, Range rows);
// Columns [first, first + count) of m with only `keep` (relative to first) left as they are and the rest
// zeroed: a replicated head's share of o_proj (float formats only). keep = all: column_slice.
WeightMatrix masked_column_slice(const WeightMatrix& m, Range cols, Range keep, ShardedWeights& out,
                                 const std::string& what, int tp);
// Columns [first, first + count) of m, copied into out.copies, whole blocks of the format per row. Throws
// k3::Error naming `what` (and `tp`, the group size) when the range splits a block.
WeightMatrix column_slice(const WeightMatrix& m, Range cols, ShardedWeights& out, const std::string& what, int tp);

}  // namespace k3::dist
