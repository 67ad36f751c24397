// ShardPlan: which part of the model one rank of a tensor / expert parallel group owns, decided once
// from (config, rank, size) and read by the weight sharding (shard_weights.h), the cache spec and the
// graph, so that no other code does rank arithmetic.
//
//   KDA / MLA heads        contiguous blocks of heads/size; with more ranks than heads (size a multiple
//                          of the heads), each head on size/heads ranks (replicas: the same state on
//                          each), which split its o_proj input channels (the others' columns zeroed)
//   dense / shared MLP     intermediate columns, balanced in units of 256 / 32 / 1 (quantisation blocks)
//   routed experts         TP (default): each expert's intermediate split like the MLP;
//                          EP (--enable-expert-parallel): whole experts, a contiguous block per rank
//   embedding, lm_head     vocabulary rows in chunks of ceil(V/size) (the last rank may own fewer)
//   everything else        replicated (norms, router, low-rank gates, q_a / kv_a, latent MoE)
#pragma once
#include <cstdint>
#include <string>

#include "k3/model/config.h"

namespace k3::dist {

struct Range {
  int64_t first = 0, count = 0;
  int64_t end() const { return first + count; }
};

// One kind of attention heads on this rank: the heads it computes and, of their o_proj input channels
// (local numbering), the ones it keeps: all of them unless a head is replicated over several ranks.
struct HeadShard {
  Range heads;
  int replicas = 1;
  Range o_channels;
};

struct ShardPlan {
  int rank = 0, size = 1;
  bool expert_parallel = false;
  HeadShard kda, mla;
  Range dense_inter;   // columns of the dense MLP's intermediate (first_k_dense layers)
  Range shared_inter;  // columns of the shared experts' intermediate
  Range expert_inter;  // columns of each routed expert's intermediate (TP; all of them under EP)
  Range experts;       // routed experts this rank computes (EP; all of them under TP)
  int64_t vocab_chunk = 0;  // embedding / lm_head rows per rank, ceil(V / size); the all-gather's unit
  Range vocab;              // embedding / lm_head rows of this rank

  bool sharded() const { return size > 1; }
};

// Throws k3::Error naming the dimension that `size` does not divide, and what would.
ShardPlan make_shard_plan(const ModelConfig& c, int rank, int size, bool expert_parallel);
// The config of one rank's shard: what the graph and the cache spec read (heads per rank).
ModelConfig shard_config(const ModelConfig& c, const ShardPlan& p);
// One line per rank: what it owns (printed at start-up).
std::string describe(const ShardPlan& p);

}  // namespace k3::dist
