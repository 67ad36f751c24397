#include "k3/dist/shard_plan.h"

#include <algorithm>

#include "k3/core/error.h"

namespace k3::dist {

namespace {

// The block of `total` this rank owns when `size` must divide it; `what` names it in the error.
Range even_block(int64_t total, int rank, int size, const std::string& what) {
  if (total % size != 0) {
    std::string ok;
    for (int64_t d = 1; d <= total; ++d)
      if (total % d == 0) ok += (ok.empty() ? "" : ", ") + std::to_string(d);
    throw Error("--tensor-parallel-size " + std::to_string(size) + " does not divide the " + what + " (" +
                std::to_string(total) + ") and is no multiple of it; sizes that work: the divisors " + ok + " and the multiples of " +
                std::to_string(total));
  }
  const int64_t n = total / size;
  return {rank * n, n};
}

// Heads of one kind: blocks of heads/size when size divides them; when the heads divide size, each head
// on size/heads ranks, each replica keeping an equal share of the head's `width` output channels.
HeadShard head_shard(int64_t heads, int64_t width, int rank, int size, const std::string& what) {
  HeadShard h;
  if (heads % size == 0 || size % heads != 0) {
    h.heads = even_block(heads, rank, size, what);
    h.o_channels = {0, h.heads.count * width};
    return h;
  }
  h.replicas = static_cast<int>(size / heads);
  h.heads = {rank / h.replicas, 1};
  if (width % h.replicas != 0)
    throw Error("--tensor-parallel-size " + std::to_string(size) + ": " + std::to_string(h.replicas) +
                " ranks per head do not divide the " + std::to_string(width) + " output channels of a head of the " + what);
  const int64_t share = width / h.replicas;
  h.o_channels = {(rank % h.replicas) * share, share};
  return h;
}

// A contiguous block of `total` items for any size <= total: the first total % size ranks take one more.
Range balanced_block(int64_t total, int rank, int size) {
  const int64_t base = total / size, extra = total % size;
  return {rank * base + std::min<int64_t>(rank, extra), base + (rank < extra ? 1 : 0)};
}

// Columns of an intermediate (MLP, experts): the all-reduce after the down projection sums over the
// hidden size, so the ranks' column counts may differ. They are split in units of a quantisation block
// where the width allows (256: GGUF K-quants, 32: MXFP4, Q8_0), so a column slice of a quantised down
// projection falls on whole blocks (shard_weights.cpp checks it).
Range aligned_block(int64_t total, int rank, int size) {
  for (int64_t unit : {256, 32, 1})
    if (total % unit == 0 && total / unit >= size) {
      const Range u = balanced_block(total / unit, rank, size);
      return {u.first * unit, u.count * unit};
    }
  throw Error("--tensor-parallel-size " + std::to_string(size) + " is more than the " + std::to_string(total) +
              " intermediate columns of an MLP");
}

}  // namespace

int32_t ShardPlan::local_expert(int32_t e) const {
  if (e < 0 || static_cast<size_t>(e) >= expert_slot.size()) return -1;
  const int64_t slot = expert_slot[static_cast<size_t>(e)];
  return slot >= experts.first && slot < experts.end() ? static_cast<int32_t>(slot - experts.first) : -1;
}

int ShardPlan::owner_of_expert(int32_t e) const {
  if (e < 0 || static_cast<size_t>(e) >= expert_slot.size()) throw Error("expert id " + std::to_string(e) + " out of range");
  const int64_t slot = expert_slot[static_cast<size_t>(e)];
  // expert_bounds is sorted: the last bound <= slot is the owner.
  const auto it = std::upper_bound(expert_bounds.begin(), expert_bounds.end(), slot);
  return static_cast<int>(it - expert_bounds.begin()) - 1;
}

int32_t ShardPlan::index_on_owner(int32_t e) const {
  const int owner = owner_of_expert(e);
  return static_cast<int32_t>(expert_slot[static_cast<size_t>(e)] - expert_bounds[static_cast<size_t>(owner)]);
}

namespace {
// The placement's permutation, checked (identity when empty).
std::vector<int32_t> expert_order_of(const ExpertPlacement& pl, int64_t E) {
  std::vector<int32_t> order = pl.expert_order;
  if (order.empty())
    for (int64_t e = 0; e < E; ++e) order.push_back(static_cast<int32_t>(e));
  if (static_cast<int64_t>(order.size()) != E)
    throw Error("expert placement: " + std::to_string(order.size()) + " entries for " + std::to_string(E) + " experts");
  std::vector<bool> seen(static_cast<size_t>(E), false);
  for (int32_t e : order) {
    if (e < 0 || e >= E || seen[static_cast<size_t>(e)])
      throw Error("expert placement: not a permutation of 0.." + std::to_string(E - 1) + " (entry " + std::to_string(e) + ")");
    seen[static_cast<size_t>(e)] = true;
  }
  return order;
}
}  // namespace

ShardPlan make_shard_plan(const ModelConfig& c, int rank, int size, bool expert_parallel,
                          const ExpertPlacement& placement) {
  if (size < 1) throw Error("--tensor-parallel-size must be at least 1 (got " + std::to_string(size) + ")");
  if (rank < 0 || rank >= size)
    throw Error("rank " + std::to_string(rank) + " is outside a group of " + std::to_string(size) + " ranks");
  ShardPlan p;
  p.rank = rank;
  p.size = size;
  p.expert_parallel = expert_parallel;
  if (c.num_kda_layers() > 0) p.kda = head_shard(c.kda_heads, c.kda_head_dim, rank, size, "KDA head count");
  if (c.num_mla_layers() > 0) p.mla = head_shard(c.mla_heads, c.v_head_dim, rank, size, "MLA head count");
  if (c.first_k_dense > 0) p.dense_inter = aligned_block(c.intermediate_size, rank, size);
  if (c.num_experts > 0) {
    const int64_t shared = c.moe_intermediate_size * c.num_shared_experts;
    if (shared > 0) p.shared_inter = aligned_block(shared, rank, size);
    if (expert_parallel) {
      if (c.num_experts < size)
        throw Error("--enable-expert-parallel: " + std::to_string(size) + " ranks for " + std::to_string(c.num_experts) +
                    " routed experts (each rank needs at least one)");
      p.experts = balanced_block(c.num_experts, rank, size);
      p.expert_inter = {0, c.moe_intermediate_size};
      p.expert_order = expert_order_of(placement, c.num_experts);
      p.expert_slot.assign(p.expert_order.size(), 0);
      for (size_t slot = 0; slot < p.expert_order.size(); ++slot)
        p.expert_slot[static_cast<size_t>(p.expert_order[slot])] = static_cast<int32_t>(slot);
      for (int r = 0; r < size; ++r) p.expert_bounds.push_back(balanced_block(c.num_experts, r, size).first);
      p.expert_bounds.push_back(c.num_experts);
      p.expert_all_to_all = placement.all_to_all;
    } else {
      p.experts = {0, c.num_experts};
      p.expert_inter = aligned_block(c.moe_intermediate_size, rank, size);
    }
  }
  if (c.vocab_size < size)
    throw Error("--tensor-parallel-size " + std::to_string(size) + " is larger than the vocabulary");
  p.vocab_chunk = (c.vocab_size + size - 1) / size;
  const int64_t v0 = std::min<int64_t>(c.vocab_size, rank * p.vocab_chunk);
  p.vocab = {v0, std::min<int64_t>(c.vocab_size, v0 + p.vocab_chunk) - v0};
  if (p.vocab.count == 0)
    throw Error("--tensor-parallel-size " + std::to_string(size) + " leaves rank " + std::to_string(rank) +
                " no rows of the vocabulary (" + std::to_string(c.vocab_size) + ")");
  return p;
}

ModelConfig shard_config(const ModelConfig& c, const ShardPlan& p) {
  ModelConfig s = c;
  if (p.kda.heads.count > 0) s.kda_heads = p.kda.heads.count;
  if (p.mla.heads.count > 0) s.mla_heads = p.mla.heads.count;
  return s;
}

std::string describe(const ShardPlan& p) {
  auto r = [](const Range& x) { return "[" + std::to_string(x.first) + ", " + std::to_string(x.end()) + ")"; };
  auto heads = [&](const HeadShard& h) {
    return r(h.heads) + (h.replicas > 1 ? " (o_proj channels " + r(h.o_channels) + " of " + std::to_string(h.replicas) +
                                              " replicas)"
                                        : "");
  };
  std::string s = "rank " + std::to_string(p.rank) + "/" + std::to_string(p.size) + ": KDA heads " + heads(p.kda) +
                  ", MLA heads " + heads(p.mla) + ", MLP columns " + r(p.dense_inter) + ", shared-expert columns " +
                  r(p.shared_inter);
  if (p.expert_parallel) {
    // The experts themselves when a placement moved them, else their range.
    bool identity = true;
    for (size_t i = 0; i < p.expert_order.size(); ++i) identity = identity && p.expert_order[i] == static_cast<int32_t>(i);
    std::string list;
    for (int64_t slot = p.experts.first; slot < p.experts.end() && !identity; ++slot)
      list += (list.empty() ? "" : " ") + std::to_string(p.expert_order[static_cast<size_t>(slot)]);
    s += ", routed experts " + (identity ? r(p.experts) : "{" + list + "}") + " (EP" +
         (p.expert_all_to_all ? ", all-to-all dispatch" : "") + ")";
  }
  else
    s += ", routed-expert columns " + r(p.expert_inter) + " (TP)";
  return s + ", vocab rows " + r(p.vocab);
}

}  // namespace k3::dist
