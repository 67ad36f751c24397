#include "k3/model/graph/step.h"

#include <string>

#include "k3/core/error.h"

namespace k3::graph {

bool StepPlan::all_decode() const {
  for (const StepSeq& s : seqs)
    if (s.n != 1 || s.prefill_form) return false;
  return true;
}

bool StepPlan::any_prefill_form() const {
  for (const StepSeq& s : seqs)
    if (s.prefill_form) return true;
  return false;
}

bool StepPlan::any_decode_form() const {
  for (const StepSeq& s : seqs)
    if (!s.prefill_form) return true;
  return false;
}

bool StepPlan::any_snapshot() const {
  for (const StepSeq& s : seqs)
    if (s.snapshot_after > 0) return true;
  return false;
}

namespace {
void check_cache_spec(const CacheSpec& have, const CacheSpec& want) {
  if (have.mla_dtype != want.mla_dtype || have.kda_state_dtype != want.kda_state_dtype ||
      have.mla_layers != want.mla_layers || have.kda_layers != want.kda_layers || have.mla_row_bytes() != want.mla_row_bytes() ||
      have.kda_layer_bytes() != want.kda_layer_bytes())
    throw Error(std::string("forward: a cache with MLA rows in ") + cache_dtype_name(have.mla_dtype) + " and KDA state in " +
                cache_dtype_name(have.kda_state_dtype) + " was handed to a model whose cache is " +
                cache_dtype_name(want.mla_dtype) + " / " + cache_dtype_name(want.kda_state_dtype) + " (or of another shape)");
}
}  // namespace

StepPlan plan_step(const std::vector<BatchItem>& items, const ForwardOptions& opt, int64_t vocab, const CacheSpec& spec) {
  StepPlan p;
  p.kda_chunk = opt.kda_chunk;
  p.tap_layers.assign(opt.tap_layers.begin(), opt.tap_layers.end());
  for (const BatchItem& it : items) {
    check_batch_tokens(it, vocab);
    check_cache_spec(it.cache->spec(), spec);
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    const int64_t n_snap = it.snapshot_after > 0 ? it.n_snapshots : 0;
    if (it.snapshot_after < 0 || (it.snapshot_after > 0 && (n_snap < 1 || it.snapshot_after + n_snap > n)))
      throw Error("forward: " + std::to_string(it.n_snapshots) + " state snapshots after " + std::to_string(it.snapshot_after) +
                  " of " + std::to_string(n) + " tokens");
    if (n_snap > 0 && spec.kda_layers > 0 && it.cache->kda_snapshot(0, n_snap - 1).S == nullptr)
      throw Error("forward: " + std::to_string(n_snap) + " state snapshots were asked of a cache that keeps fewer");
    // A sequence whose state is saved mid-step (speculative verification) takes the decode forms: the
    // recurrence token by token is exact in any split, so the snapshots are the states the decode steps of
    // speculation off would have made (a chunked form would round differently).
    p.seqs.push_back(StepSeq{p.n_tokens(), n, it.cache->n_past(), it.cache,
                             n_snap == 0 && takes_prefill_form(opt.path, n), it.snapshot_after, n_snap});
    p.tokens.insert(p.tokens.end(), it.tokens.begin(), it.tokens.end());
  }
  if (p.seqs.empty()) throw Error("forward: empty batch");
  for (const StepSeq& s : p.seqs) s.cache->reserve(s.n);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].want_logits) continue;
    const StepSeq& s = p.seqs[i];
    for (int64_t t = s.n - logit_rows_of(items[i], opt); t < s.n; ++t) p.logit_rows.push_back(static_cast<int32_t>(s.offset + t));
  }
  return p;
}

void finish_step(const StepPlan& plan) {
  for (const StepSeq& s : plan.seqs) s.cache->advance(s.n);
}

}  // namespace k3::graph
