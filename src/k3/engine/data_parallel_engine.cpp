#include "k3/engine/data_parallel_engine.h"

#include <algorithm>

#include "k3/core/error.h"

namespace k3::engine {

DataParallelEngine::DataParallelEngine(std::vector<std::unique_ptr<Engine>> replicas) : replicas_(std::move(replicas)) {
  if (replicas_.empty()) throw Error("data parallel: at least one replica is needed");
  for (const auto& r : replicas_)
    if (!r) throw Error("data parallel: a replica is missing");
  in_flight_.assign(replicas_.size(), 0);
}

// The replicas' final outputs run our callbacks, which use the books: stop them while the books exist.
DataParallelEngine::~DataParallelEngine() { shutdown(false); }

size_t DataParallelEngine::affinity(const std::string& cache_salt, const std::vector<int32_t>& prompt, size_t replicas) {
  // FNV-1a over the salt and the first tokens' bytes: the same request lands on the same replica in
  // every run (std::hash may differ between standard libraries).
  uint64_t h = 14695981039346656037ull;
  auto mix = [&h](uint8_t b) { h = (h ^ b) * 1099511628211ull; };
  for (char c : cache_salt) mix(static_cast<uint8_t>(c));
  mix(0xff);  // the salt "a" + token t differs from the salt "" + a token whose bytes begin with 'a'
  const size_t n = std::min(prompt.size(), kAffinityTokens);
  for (size_t i = 0; i < n; ++i)
    for (int b = 0; b < 4; ++b) mix(static_cast<uint8_t>(static_cast<uint32_t>(prompt[i]) >> (8 * b)));
  // FNV's low bits depend only on the inputs' low bits (token ids that differ in high bits would all
  // meet): mix every bit down (MurmurHash3's finaliser) before taking the remainder.
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return replicas ? static_cast<size_t>(h % replicas) : 0;
}

size_t DataParallelEngine::pick_locked(const Request& req) const {
  const size_t d = replicas_.size(), start = affinity(req.cache_salt, req.prompt, d);
  size_t best = start;
  for (size_t k = 1; k < d; ++k) {
    const size_t r = (start + k) % d;
    if (in_flight_[r] < in_flight_[best]) best = r;
  }
  return best;
}

void DataParallelEngine::finished(size_t replica, const std::string& request_id) {
  std::lock_guard lk(mu_);
  --in_flight_[replica];
  if (auto it = owner_.find(request_id); it != owner_.end() && it->second == replica) owner_.erase(it);
}

void DataParallelEngine::submit(Request req, OutputCallback on_output) {
  size_t r = 0;
  const std::string id = req.id;
  {
    std::lock_guard lk(mu_);
    if (!accepting_) throw Error("the engine is shutting down");
    r = pick_locked(req);
    ++in_flight_[r];  // before the replica's submit: its final output may come before submit returns
    owner_[id] = r;
  }
  // Runs on the replica's engine thread: the books first (under the lock), the caller's callback after.
  auto wrapped = [this, r, id, cb = std::move(on_output)](const RequestOutput& o) {
    if (o.finished) finished(r, id);
    cb(o);
  };
  try {
    replicas_[r]->submit(std::move(req), std::move(wrapped));
  } catch (...) {
    finished(r, id);  // refused before queueing: no output will come
    throw;
  }
}

void DataParallelEngine::cancel(const std::string& request_id) {
  Engine* owner = nullptr;
  {
    std::lock_guard lk(mu_);
    if (auto it = owner_.find(request_id); it != owner_.end()) owner = replicas_[it->second].get();
  }
  if (owner) owner->cancel(request_id);  // outside the lock: a replica may deliver the abort at once
}

namespace {

// Expert residency counters of several replicas (each maps the checkpoint and counts its own uses).
// The process's disk counters, the checkpoint's expert totals and the prefetch mode are the same in
// every replica: the first one's, not a sum.
void add_expert_cache(std::optional<ExpertCacheStats>& sum, const std::optional<ExpertCacheStats>& e) {
  if (!e) return;
  if (!sum) {
    sum = e;
    return;
  }
  sum->enabled = sum->enabled || e->enabled;
  sum->pinning = sum->pinning && e->pinning;
  sum->lookups += e->lookups;
  sum->hits += e->hits;
  sum->needed_bytes += e->needed_bytes;
  sum->missing_bytes += e->missing_bytes;
  sum->prefetched_experts += e->prefetched_experts;
  sum->hot_budget_bytes += e->hot_budget_bytes;
  sum->hot_bytes += e->hot_bytes;  // may overcount: replicas mapping one file can pin the same pages
  sum->hot_experts += e->hot_experts;
}

// The counters and gauges of EngineStats that add up over replicas.
constexpr int64_t EngineStats::*kSummed[] = {
    &EngineStats::running,           &EngineStats::waiting,          &EngineStats::cache_bytes_total,
    &EngineStats::cache_bytes_used,  &EngineStats::cache_pages_total, &EngineStats::cache_pages_used,
    &EngineStats::cache_pages_cached, &EngineStats::cache_slots_total, &EngineStats::cache_slots_used,
    &EngineStats::cache_checkpoints, &EngineStats::prefix_queries_tokens, &EngineStats::prefix_hit_tokens,
    &EngineStats::preemptions,       &EngineStats::prompt_tokens_total, &EngineStats::generation_tokens_total,
    &EngineStats::spec_num_drafts,   &EngineStats::spec_num_draft_tokens, &EngineStats::spec_num_accepted_tokens};

void add_stats(EngineStats& s, const EngineStats& r) {
  for (auto field : kSummed) s.*field += r.*field;
  s.num_speculative_tokens = std::max(s.num_speculative_tokens, r.num_speculative_tokens);
  if (s.spec_accepted_per_pos.size() < r.spec_accepted_per_pos.size())
    s.spec_accepted_per_pos.resize(r.spec_accepted_per_pos.size(), 0);
  for (size_t j = 0; j < r.spec_accepted_per_pos.size(); ++j) s.spec_accepted_per_pos[j] += r.spec_accepted_per_pos[j];
  add_expert_cache(s.expert_cache, r.expert_cache);
}

}  // namespace

EngineStats DataParallelEngine::stats() const {
  EngineStats s;
  for (const auto& r : replicas_) add_stats(s, r->stats());
  return s;
}

EngineLimits DataParallelEngine::limits() const {
  EngineLimits l = replicas_[0]->limits();
  for (size_t i = 1; i < replicas_.size(); ++i) {
    const EngineLimits r = replicas_[i]->limits();
    l.max_model_len = std::min(l.max_model_len, r.max_model_len);
    l.vocab_size = std::min(l.vocab_size, r.vocab_size);
    l.max_num_seqs += r.max_num_seqs;
  }
  return l;
}

std::vector<int64_t> DataParallelEngine::in_flight() const {
  std::lock_guard lk(mu_);
  return in_flight_;
}

void DataParallelEngine::shutdown(bool drain) {
  {
    std::lock_guard lk(mu_);
    accepting_ = false;
  }
  // One after the other: the replicas not yet told keep running their requests meanwhile (nothing new
  // reaches them: submit refuses now), so draining all takes as long as the slowest, not the sum.
  for (auto& r : replicas_) r->shutdown(drain);
}

}  // namespace k3::engine
