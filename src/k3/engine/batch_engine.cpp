#include "k3/engine/batch_engine.h"

#include <random>

#include "k3/core/error.h"
#include "k3/core/thread_pool.h"
#include "k3/model/drafter/block_drafter.h"

namespace k3::engine {

BatchEngine::BatchEngine(const ModelRunner& model, const text::Tokenizer& tok, BatchEngineOptions opt)
    : model_(model), tok_(tok), opt_(opt) {
  opt_.cache.max_num_seqs = opt_.sched.max_num_seqs;
  if (!opt_.cache.memory) opt_.cache.memory = model.cache_memory();
  if (opt_.speculative) {
    if (!model.supports_state_snapshots())
      throw Error("--speculative-config: speculative decoding is not implemented on " + model.device_name() +
                  " yet (it needs exact KDA state rollback: the CPU backend has it)");
    opt_.cache.state_snapshots = opt_.speculative->state_slots();
    opt_.sched.num_speculative_tokens = opt_.speculative->num_speculative_tokens;
    if (opt_.proposer) {
      proposer_ = opt_.proposer;
    } else {
      own_proposer_ = make_proposer(*opt_.speculative, opt_.draft_model, model.config().vocab_size, opt_.block_drafter);
      proposer_ = own_proposer_.get();
      if (opt_.block_drafter) drafter::check_drafter_target(opt_.block_drafter->config(), model.config());
    }
    if (!proposer_->tap_layers().empty() && !model.supports_taps())
      throw Error("--speculative-config: method \"" + opt_.speculative->method + "\" reads the target's hidden states, which " +
                  model.device_name() + " does not return (taps: CPU and single-GPU CUDA runners)");
    stats_.num_speculative_tokens = opt_.speculative->num_speculative_tokens;
    stats_.spec_accepted_per_pos.assign(static_cast<size_t>(stats_.num_speculative_tokens), 0);
  }
  cache_ = std::make_unique<cache::HybridCache>(model.cache_spec(), opt_.cache);
  choose_max_model_len(model.config().max_position_embeddings);
  if (opt_.sched.checkpoint_interval < 0) throw Error("the prefix checkpoint interval must be >= 0 (0: auto)");
  if (opt_.sched.checkpoint_interval == 0) opt_.sched.checkpoint_interval = cache_->auto_checkpoint_interval();
  if (opt_.sched.checkpoint_interval % cache_->page_tokens() != 0)
    throw Error("the prefix checkpoint interval (" + std::to_string(opt_.sched.checkpoint_interval) +
                ") must be a multiple of the page size (" + std::to_string(cache_->page_tokens()) + " tokens)");
  sched_ = std::make_unique<Scheduler>(opt_.sched, *cache_);
  update_cache_stats_locked();  // no other thread yet
  seed_counter_ = (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  thread_ = std::thread([this] { loop(); });
}

BatchEngine::~BatchEngine() { shutdown(false); }

// The default was once the whole cache (822,032 tokens for k3-tiny, trained for 4,096): requests far
// past the model's trained positions were accepted and one sequence could take every page.
void BatchEngine::choose_max_model_len(int64_t model_max) {
  const int64_t cache_max = cache_->max_tokens_per_sequence();
  const std::string cache_note = "what the cache holds for one sequence (" + std::to_string(cache_max) + " tokens)";
  const std::string model_note = "the model's max_position_embeddings (" + std::to_string(model_max) + ")";
  if (opt_.max_model_len > 0) {
    if (opt_.max_model_len > cache_max)
      throw Error("max_model_len " + std::to_string(opt_.max_model_len) + " does not fit: " + cache_note +
                  "; raise the cache memory or lower max_model_len");
    max_model_len_reason_ = "as configured";
    if (model_max > 0 && opt_.max_model_len > model_max)
      max_model_len_reason_ += "; WARNING: beyond " + model_note + ", output past it is unreliable";
  } else if (model_max > 0 && model_max <= cache_max) {
    opt_.max_model_len = model_max;
    max_model_len_reason_ = model_note;
  } else {
    opt_.max_model_len = cache_max;
    max_model_len_reason_ = cache_note + (model_max > 0 ? ", less than " + model_note + "; more cache memory allows more"
                                                        : "; config.json states no max_position_embeddings");
  }
}

void BatchEngine::submit(Request req, OutputCallback on_output) {
  req.params.validate();
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  if (n == 0) throw Error("empty prompt: at least one token is needed");
  if (n >= opt_.max_model_len)
    throw Error("the prompt has " + std::to_string(n) + " tokens, but this server holds at most " +
                std::to_string(opt_.max_model_len) + " tokens per sequence (prompt + completion, max_model_len)");
  const int64_t V = model_.config().vocab_size;
  for (int32_t id : req.prompt)
    if (id < 0 || id >= V)
      throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (req.top_logprobs > 20) throw Error("top_logprobs must be <= 20");
  std::lock_guard lk(mu_);
  if (!accepting_) throw Error("the engine is shutting down");
  auto s = std::make_unique<Sequence>(std::move(req), std::move(on_output), tok_, model_.config(), *cache_,
                                      opt_.max_model_len, seed_counter_++);
  inbox_.push_back(std::move(s));
  ++stats_.waiting;
  cv_.notify_all();
}

void BatchEngine::cancel(const std::string& id) {
  std::lock_guard lk(mu_);
  cancels_.insert(id);
  cv_.notify_all();
}

EngineStats BatchEngine::stats() const {
  EngineStats s;
  {
    std::lock_guard lk(mu_);
    s = stats_;
  }
  s.expert_cache = model_.expert_cache_stats();  // the residency's own lock; outside the engine's
  return s;
}

cache::CacheStats BatchEngine::cache_stats() const {
  std::lock_guard lk(mu_);
  return cache_stats_;
}

EngineLimits BatchEngine::limits() const {
  EngineLimits l;
  l.max_model_len = opt_.max_model_len;
  l.max_num_seqs = opt_.sched.max_num_seqs;
  l.vocab_size = model_.config().vocab_size;
  return l;
}

void BatchEngine::shutdown(bool drain) {
  {
    std::lock_guard lk(mu_);
    accepting_ = false;
    stop_ = true;
    drain_ = drain_ && drain;
    cv_.notify_all();
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void BatchEngine::finish(Sequence* s, RequestOutput o) {
  // Keep the state after the whole output as a checkpoint (a follow-up turn may start with it).
  if (cache_->prefix_caching() && o.finish_reason != "error") {
    cache_->commit_pages(s->cache(), s->tokens());
    cache_->save_checkpoint(s->cache(), s->tokens());
  }
  tap_rows_.erase(s);
  std::unique_ptr<Sequence> owned = sched_->remove(s);
  {
    std::lock_guard lk(mu_);
    stats_.running = sched_->num_running();
    stats_.waiting = sched_->num_waiting() + static_cast<int64_t>(inbox_.size());
    update_cache_stats_locked();
  }
  owned->deliver(o);  // after the books are updated: a client seeing its final output sees it gone
}

void BatchEngine::loop() {
  for (;;) {
    std::deque<std::unique_ptr<Sequence>> fresh;
    std::set<std::string> cancels;
    bool stop, drain;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !inbox_.empty() || !cancels_.empty() || !sched_->idle(); });
      fresh.swap(inbox_);
      cancels.swap(cancels_);
      stop = stop_;
      drain = drain_;
    }
    for (auto& s : fresh) sched_->add(std::move(s));
    for (const auto& id : cancels)
      if (Sequence* s = sched_->find(id)) finish(s, s->finish_now("abort"));
    if (stop && !drain)
      for (Sequence* s : sched_->all()) finish(s, s->finish_now("abort"));
    if (stop && sched_->idle()) {
      std::lock_guard lk(mu_);
      if (inbox_.empty()) return;
      continue;
    }
    if (!sched_->idle()) step();
  }
}

void BatchEngine::propose_drafts() {
  const int64_t k = opt_.sched.num_speculative_tokens;
  draft_slots_.clear();
  for (Sequence* s : sched_->all()) {
    s->drafts().clear();
    const int64_t pending = s->remaining();
    if (!s->decoding() || pending < 1 || pending > k + 1) continue;  // prefilling, or waiting
    if (s->constrained()) continue;  // its drafts would need the grammar's mask row by row: not speculated
    DraftSlot slot{s->tokens(), s, std::min(k, s->draft_room()), &s->drafts()};
    // The taps of the row that produced the last token; none (no drafts) if the engine has not seen it.
    if (auto it = tap_rows_.find(s); it != tap_rows_.end() && it->second.n_tokens == s->tokens().size())
      slot.ctx = it->second.ctx;
    draft_slots_.push_back(slot);
  }
  if (!draft_slots_.empty()) proposer_->propose(draft_slots_);
}

void BatchEngine::keep_tap_row(const Sequence* s, int64_t row) {
  const size_t dim = step_taps_.size() / std::max<size_t>(1, n_step_rows_);
  TapRow& t = tap_rows_[s];
  t.ctx.assign(step_taps_.begin() + row * static_cast<int64_t>(dim), step_taps_.begin() + (row + 1) * static_cast<int64_t>(dim));
  t.n_tokens = s->tokens().size();
}

void BatchEngine::count_verification_locked(int64_t drafted, int64_t accepted) {
  ++stats_.spec_num_drafts;
  stats_.spec_num_draft_tokens += drafted;
  stats_.spec_num_accepted_tokens += accepted;
  for (int64_t j = 0; j < accepted && j < static_cast<int64_t>(stats_.spec_accepted_per_pos.size()); ++j)
    ++stats_.spec_accepted_per_pos[static_cast<size_t>(j)];
}

// One engine step. With speculation a decoding sequence's chunk is [pending tokens][drafts]: the KDA
// state is saved after the pending ones (BatchItem::snapshot_after), logits come for the last pending
// token and every draft, and a rejection restores the saved state and position, so the kept tokens
// after it (the accepted drafts and the token that replaced the first rejected one) run again at the
// head of the next step's chunk: exact rollback at the cost of re-running those rows, with no extra
// forward pass (docs/perf/speculative.md).
void BatchEngine::step() {
  if (proposer_) propose_drafts();
  std::vector<ScheduledSeq> plan = sched_->schedule();
  if (plan.empty()) {
    // Nothing fits right now (e.g. every slot is taken by sequences waiting on memory): fail the
    // oldest waiting request rather than spin. Cannot happen while anything runs.
    if (sched_->num_running() == 0 && sched_->num_waiting() > 0) {
      Sequence* s = sched_->all().front();
      finish(s, s->finish_now("error", "the request does not fit in the cache"));
    }
    return;
  }
  for (const ScheduledSeq& p : plan) p.seq->drafts().resize(static_cast<size_t>(p.n_drafts));  // cut to what runs
  std::vector<BatchItem> items;
  std::vector<std::vector<int32_t>> chunks(plan.size());  // pending + drafts, where there are drafts
  std::vector<int64_t> snapshot_pos(plan.size(), -1);  // where the first snapshot is taken
  const bool per_position = opt_.speculative && opt_.speculative->rollback == SpeculativeConfig::Rollback::Snapshots;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledSeq& p = plan[i];
    const auto& toks = p.seq->tokens();
    const int64_t past = p.seq->cache().n_past();
    std::span<const int32_t> span(toks.data() + past, static_cast<size_t>(p.n_tokens));
    BatchItem item{span, &p.seq->cache(), p.sample};
    if (p.n_drafts > 0) {
      const int64_t pending = p.n_tokens - p.n_drafts;
      chunks[i].assign(toks.begin() + past, toks.end());
      chunks[i].insert(chunks[i].end(), p.seq->drafts().begin(), p.seq->drafts().end());
      item.tokens = chunks[i];
      item.n_logit_rows = 1 + p.n_drafts;
      item.snapshot_after = pending;
      item.n_snapshots = per_position ? p.n_drafts : 1;
      snapshot_pos[i] = past + pending;
    }
    items.push_back(item);
  }
  // The grammar masks of the constrained sequences first, in parallel on the CPU pool (idle between
  // forward passes; 64 JSON-object masks over k3-tiny's vocabulary took 0.9 ms on one core per step on the
  // H200 host). vLLM fills its xgrammar bitmasks on a thread pool the same way.
  std::vector<Sequence*> constrained;
  for (const ScheduledSeq& p : plan)
    if (p.sample && p.seq->constrained()) constrained.push_back(p.seq);
  k3::parallel_for(static_cast<int64_t>(constrained.size()), constrained.size() > 1,
                   [&](int64_t i) { constrained[static_cast<size_t>(i)]->prepare_mask(); });
  // How each sampled row picks its token; the runner samples (on the GPU: only ids come back).
  std::vector<RowSample> samples;
  for (const ScheduledSeq& p : plan)
    if (p.sample) {
      const auto rows = p.seq->next_samples();
      samples.insert(samples.end(), rows.begin(), rows.end());
    }
  std::vector<sampling::SampleResult> picked;
  std::vector<float> raw;
  ForwardOptions fo;
  fo.path = model_.engine_path();  // CPU: the decode forms (batch- and chunk-invariant numerics)
  if (proposer_ && !proposer_->tap_layers().empty()) {  // a block drafter reads the target's hidden states
    fo.tap_layers = proposer_->tap_layers();
    fo.taps = &step_taps_;
    n_step_rows_ = samples.size();
  }
  try {
    model_.forward_sample(items, samples, picked, raw, fo);
  } catch (const std::exception& e) {
    for (const ScheduledSeq& p : plan) finish(p.seq, p.seq->finish_now("error", e.what()));
    return;
  }
  const int64_t V = model_.config().vocab_size;
  int64_t row = 0, raw_row = 0, prompt_tokens = 0, gen_tokens = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const ScheduledSeq& p = plan[i];
    Sequence* s = p.seq;
    const int64_t past = s->cache().n_past();
    const bool in_prompt = past <= s->prompt_len();
    if (in_prompt) prompt_tokens += p.n_tokens;
    Sequence::Verified v;
    if (p.sample) {
      const int64_t rows = 1 + p.n_drafts;
      std::span<float> lg;
      if (samples[static_cast<size_t>(row)].raw_logits) {
        lg = std::span<float>(raw.data() + raw_row * V, static_cast<size_t>(rows * V));
        raw_row += rows;
      }
      const std::span<const sampling::SampleResult> results(picked.data() + row, static_cast<size_t>(rows));
      row += rows;
      const size_t before = s->tokens().size();
      try {
        v = s->on_verified(results, lg, V);
      } catch (const std::exception& e) {  // one bad sequence must not take the engine (and server) down
        finish(s, s->finish_now("error", e.what()));
        continue;
      }
      gen_tokens += static_cast<int64_t>(s->tokens().size() - before);
      // The row whose logits produced the sequence's (new) last token: the one after the accepted drafts.
      if (fo.taps) keep_tap_row(s, row - rows + v.accepted);
      if (p.n_drafts > 0) {
        {
          std::lock_guard lk(mu_);
          count_verification_locked(p.n_drafts, v.accepted);
        }
        // A rejected draft ran through the model: back to the state after the accepted ones (snapshots),
        // or before the drafts (replay: the accepted ones run again next step).
        const int64_t keep = static_cast<int64_t>(s->tokens().size());
        if (v.accepted < p.n_drafts) {
          if (per_position)
            cache_->restore_state(s->cache(), v.accepted, snapshot_pos[i] + v.accepted, keep);
          else
            cache_->restore_state(s->cache(), 0, snapshot_pos[i], keep);
        }
      }
    }
    if (cache_->prefix_caching()) {
      cache_->commit_pages(s->cache(), s->tokens());
      // Checkpoints inside the prompt: at every interval and at the prompt's end.
      if (in_prompt && (past == s->prompt_len() || past % opt_.sched.checkpoint_interval == 0))
        cache_->save_checkpoint(s->cache(), s->tokens());
    }
    if (!p.sample) continue;
    if (v.out.finished)
      finish(s, std::move(v.out));
    else
      s->deliver(v.out);
  }
  std::lock_guard lk(mu_);
  stats_.running = sched_->num_running();
  stats_.waiting = sched_->num_waiting() + static_cast<int64_t>(inbox_.size());
  stats_.preemptions = sched_->preemptions();
  stats_.prompt_tokens_total += prompt_tokens;
  stats_.generation_tokens_total += gen_tokens;
  update_cache_stats_locked();
}

void BatchEngine::update_cache_stats_locked() {
  cache_stats_ = cache_->stats();
  stats_.cache_bytes_total = cache_stats_.bytes_total;
  stats_.cache_bytes_used = cache_stats_.bytes_used;
  stats_.cache_pages_total = cache_stats_.pages_total;
  stats_.cache_pages_used = cache_stats_.pages_used;
  stats_.cache_pages_cached = cache_stats_.pages_cached;
  stats_.cache_slots_total = cache_stats_.slots_total;
  stats_.cache_slots_used = cache_stats_.slots_used;
  stats_.cache_checkpoints = cache_stats_.checkpoints;
  stats_.prefix_queries_tokens = cache_stats_.prefix_query_tokens;
  stats_.prefix_hit_tokens = cache_stats_.prefix_hit_tokens;
}

}  // namespace k3::engine
