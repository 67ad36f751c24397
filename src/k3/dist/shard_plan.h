// ShardPlan: which part of the model one rank of a tensor / expert parallel group owns, decided once
// from (config, rank, size) and read by the weight sharding (shard_weights.h), the cache spec and the
// graph, so that no other code does rank arithmetic.
//
//   KDA / MLA heads        contiguous blocks of heads/size; with more ranks than heads (size a multiple
//                          of the heads), each head on size/heads ranks (replicas: the same state on
//                          each), which split its o_proj input channels (the others' columns zeroed)
//   dense / shared MLP     intermediate columns, balanced in units of 256 / 32 / 1 (quantisation blocks)
//   routed experts         TP (default): each expert's intermediate split like the MLP;
//                          EP (--enable-expert-parallel): whole experts, a contiguous block of slots
//                          per rank; slot s holds expert expert_order[s] (identity unless a placement
//                          hook gave a permutation: load balancing)
//   embedding, lm_head     vocabulary rows in chunks of ceil(V/size) (the last rank may own fewer)
//   everything else        replicated (norms, router, low-rank gates, q_a / kv_a, latent MoE)
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

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
  Range experts;       // expert slots this rank computes (EP; all of them under TP)
  // EP placement: expert_order[slot] = the expert in that slot, expert_slot its inverse; rank r computes
  // slots [expert_bounds[r], expert_bounds[r + 1]). Empty without EP.
  std::vector<int32_t> expert_order, expert_slot;
  std::vector<int64_t> expert_bounds;
  // EP dispatch / combine (--ep-all-to-all): each rank sends its share of the tokens to the ranks owning
  // their experts and gets the results back (Communicator::all_to_all_v), instead of every rank routing
  // every token to its own experts.
  bool expert_all_to_all = false;
  int64_t vocab_chunk = 0;  // embedding / lm_head rows per rank, ceil(V / size); the all-gather's unit
  Range vocab;              // embedding / lm_head rows of this rank

  // The sharded graph's collectives at one rank too (TP1 "through the communicator": a check that the
  // collective path, e.g. NCCL on a GPU, changes nothing; every collective is then an identity).
  bool collectives_at_one_rank = false;

  bool sharded() const { return size > 1; }
  // Whether the graph runs the sharded path (vocab-parallel embedding / head, all-reduces).
  bool runs_collectives() const { return size > 1 || collectives_at_one_rank; }
  // EP: this rank's index of expert e among its experts, -1 when another rank computes it.
  int32_t local_expert(int32_t e) const;
  // EP: the rank computing expert e, and e's index among that rank's experts.
  int owner_of_expert(int32_t e) const;
  int32_t index_on_owner(int32_t e) const;
};

// How EP places the routed experts: a permutation of 0..E-1 (expert_order[slot] = expert; empty: the
// identity). The hook for a load-balanced placement (hot experts spread over the ranks).
struct ExpertPlacement {
  std::vector<int32_t> expert_order;
  bool all_to_all = false;  // ShardPlan::expert_all_to_all
};

// Throws k3::Error naming the dimension that `size` does not divide, and what would.
// `placement` applies with expert_parallel only (a permutation that is not one: k3::Error).
ShardPlan make_shard_plan(const ModelConfig& c, int rank, int size, bool expert_parallel,
                          const ExpertPlacement& placement = {});
// The config of one rank's shard: what the graph and the cache spec read (heads per rank).
ModelConfig shard_config(const ModelConfig& c, const ShardPlan& p);
// One line per rank: what it owns (printed at start-up).
std::string describe(const ShardPlan& p);

}  // namespace k3::dist
