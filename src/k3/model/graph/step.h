// StepPlan: one forward step's batch as every backend sees it, built once on the host from the engine's
// BatchItems (what vLLM calls the forward context / attention metadata): each sequence's rows in the
// activations, its cache and past length, which attention forms it takes, the token ids, and the rows
// whose logits are wanted. Backends prepare their own step data from it in Backend::begin_step.
#pragma once
#include <cstdint>
#include <vector>

#include "k3/runtime/model_runner.h"

namespace k3::graph {

struct StepSeq {
  int64_t offset = 0, n = 0;  // rows [offset, offset + n) of the step's activations
  int64_t past = 0;           // tokens already in the cache (positions of the new tokens: past ..)
  SequenceCache* cache = nullptr;
  bool prefill_form = false;  // chunked KDA + MHA MLA; else the KDA recurrence + absorbed MLA
  // > 0: the ops that update the KDA state save it after snapshot_after + j rows into
  // cache->kda_snapshot(., j), j < n_snapshots (BatchItem::snapshot_after: speculative decoding).
  int64_t snapshot_after = 0, n_snapshots = 0;
};

struct StepPlan {
  std::vector<StepSeq> seqs;
  std::vector<int32_t> tokens;      // [N] token ids, sequences one after another
  std::vector<int32_t> logit_rows;  // activation rows whose logits are wanted, in output order
  int kda_chunk = 0;                // KDA chunk of the prefill form; 0: the backend's default
  std::vector<int32_t> tap_layers;  // ForwardOptions::tap_layers: taps saved for every logits row

  int64_t n_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t n_logits() const { return static_cast<int64_t>(logit_rows.size()); }
  // Every sequence appends exactly one token in the decode forms (a decode step; fused kernels apply).
  bool all_decode() const;
  bool any_prefill_form() const;
  bool any_decode_form() const;
  bool any_snapshot() const;
};

// Validates the items (tokens in [0, vocab), at least one item, every cache of the runner's spec),
// reserves room in every cache and lays the batch out. Throws k3::Error.
StepPlan plan_step(const std::vector<BatchItem>& items, const ForwardOptions& opt, int64_t vocab, const CacheSpec& spec);
// After the forward: each sequence's new tokens become part of its cache.
void finish_step(const StepPlan& plan);

}  // namespace k3::graph
