#include "k3/engine/batch_engine.h"

#include <random>

#include "k3/core/error.h"

namespace k3::engine {

BatchEngine::BatchEngine(const ModelRunner& model, const text::Tokenizer& tok, BatchEngineOptions opt)
    : model_(model), tok_(tok), opt_(opt) {
  opt_.cache.max_num_seqs = opt_.sched.max_num_seqs;
  if (!opt_.cache.memory) opt_.cache.memory = model.cache_memory();
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

void BatchEngine::step() {
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
  std::vector<BatchItem> items;
  for (const ScheduledSeq& p : plan) {
    const auto& toks = p.seq->tokens();
    const int64_t past = p.seq->cache().n_past();
    items.push_back(BatchItem{std::span<const int32_t>(toks.data() + past, static_cast<size_t>(p.n_tokens)),
                              &p.seq->cache(), p.sample});
  }
  // How each sampled row picks its token; the runner samples (on the GPU: only ids come back).
  std::vector<RowSample> samples;
  for (const ScheduledSeq& p : plan)
    if (p.sample) samples.push_back(p.seq->next_sample());
  std::vector<sampling::SampleResult> picked;
  std::vector<float> raw;
  ForwardOptions fo;
  fo.path = model_.engine_path();  // CPU: the decode forms (batch- and chunk-invariant numerics)
  try {
    model_.forward_sample(items, samples, picked, raw, fo);
  } catch (const std::exception& e) {
    for (const ScheduledSeq& p : plan) finish(p.seq, p.seq->finish_now("error", e.what()));
    return;
  }
  const int64_t V = model_.config().vocab_size;
  int64_t row = 0, raw_row = 0, prompt_tokens = 0, gen_tokens = 0;
  for (const ScheduledSeq& p : plan) {
    Sequence* s = p.seq;
    const int64_t past = s->cache().n_past();
    const bool in_prompt = past <= s->prompt_len();
    if (in_prompt) prompt_tokens += p.n_tokens;
    if (cache_->prefix_caching()) {
      cache_->commit_pages(s->cache(), s->tokens());
      // Checkpoints inside the prompt: at every interval and at the prompt's end.
      if (in_prompt && (past == s->prompt_len() || past % opt_.sched.checkpoint_interval == 0))
        cache_->save_checkpoint(s->cache(), s->tokens());
    }
    if (!p.sample) continue;
    std::span<float> lg;
    if (samples[static_cast<size_t>(row)].raw_logits) lg = std::span<float>(raw.data() + (raw_row++) * V, static_cast<size_t>(V));
    const sampling::SampleResult& r = picked[static_cast<size_t>(row)];
    ++row;
    RequestOutput o;
    try {
      o = s->on_sampled(r, lg);
    } catch (const std::exception& e) {  // one bad sequence must not take the engine (and server) down
      finish(s, s->finish_now("error", e.what()));
      continue;
    }
    ++gen_tokens;
    if (o.finished)
      finish(s, std::move(o));
    else
      s->deliver(o);
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
