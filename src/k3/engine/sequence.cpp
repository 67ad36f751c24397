#include "k3/engine/sequence.h"

#include <algorithm>

namespace k3::engine {

Sequence::Sequence(Request req, OutputCallback cb, const text::Tokenizer& tok, const ModelConfig& cfg,
                   cache::HybridCache& cache, int64_t max_model_len, uint64_t default_seed)
    : req_(std::move(req)),
      cb_(std::move(cb)),
      tok_(tok),
      cache_(std::make_unique<cache::PagedSequence>(cache)),
      sampler_(req_.params, default_seed),
      stops_(req_.params.stop),
      detok_(tok) {
  cache_->set_salt(cache::cache_salt_id(req_.cache_salt));
  tokens_ = req_.prompt;
  vocab_ = cfg.vocab_size;
  n_prompt_ = static_cast<int64_t>(tokens_.size());
  budget_ = std::min<int64_t>(req_.params.max_tokens, max_model_len - n_prompt_);
  stop_ids_ = req_.params.stop_token_ids;
  if (!req_.params.ignore_eos) {
    if (cfg.eos_token_id >= 0) stop_ids_.push_back(static_cast<int32_t>(cfg.eos_token_id));
    if (tok.eos_id() >= 0) stop_ids_.push_back(tok.eos_id());
  }
  if (req_.grammar) {
    matcher_ = req_.grammar->new_matcher();
    allowed_.assign(static_cast<size_t>(req_.grammar->mask_words()), 0);
  }
  arrival = std::chrono::steady_clock::now();
}

void Sequence::prepare_mask() {
  if (!matcher_ || mask_ready_) return;
  try {
    matcher_->fill_allowed(allowed_);
  } catch (const std::exception&) {
    // Nothing allowed: the sampler reports "all logits are -inf" and this sequence ends in an error
    // (the engine thread must not see an exception here).
    std::fill(allowed_.begin(), allowed_.end(), 0u);
  }
  mask_ready_ = true;
}

void Sequence::constrain(sampling::RowSampling& row) {
  if (!matcher_) return;
  prepare_mask();
  mask_ready_ = false;  // used for this step: the next token moves the matcher on
  row.allowed = allowed_;
}

RequestOutput Sequence::base() const {
  RequestOutput o;
  o.request_id = req_.id;
  o.prompt_tokens = n_prompt_;
  o.completion_tokens = static_cast<int64_t>(tokens_.size()) - n_prompt_;
  o.cached_prompt_tokens = cached_prompt_;
  return o;
}

void Sequence::emit_text(RequestOutput& o, const std::string& text) {
  if (text.empty() || finished_) return;
  auto r = stops_.push(text);
  if (!r.emit.empty()) o.pieces.push_back({-1, r.emit});
  if (r.stopped) {
    finished_ = true;
    o.finished = true;
    o.finish_reason = "stop";
  }
}

// Ends the current text run: bytes held by the detokeniser and the stop matcher are released (a stop
// string cannot span a special token or the end of the output).
void Sequence::flush_text(RequestOutput& o) {
  emit_text(o, detok_.flush());
  if (finished_) return;
  std::string rest = stops_.flush();
  if (!rest.empty()) o.pieces.push_back({-1, rest});
}

RowSample Sequence::next_sample() {
  const std::span<const int32_t> prompt(tokens_.data(), static_cast<size_t>(n_prompt_));
  const std::span<const int32_t> gen(tokens_.data() + n_prompt_, tokens_.size() - static_cast<size_t>(n_prompt_));
  RowSample rs;
  // Ids the tokenizer cannot render (a model vocab padded past the tokenizer's) are never sampled.
  rs.sampling = sampler_.next_row(prompt, gen, vocab_, tok_.n_vocab());
  constrain(rs.sampling);
  rs.raw_logits = req_.top_logprobs >= 0;
  return rs;
}

RequestOutput Sequence::on_sampled(const sampling::SampleResult& r, std::span<float> raw) {
  RequestOutput o = base();
  if (budget_ <= 0) {  // nothing may be generated (max_tokens 0 or the context is full)
    finished_ = true;
    o.finished = true;
    o.finish_reason = "length";
    return o;
  }
  const int32_t id = Sampler::token_or_throw(r);
  // The mask allowed only what the grammar accepts; a refusal here is a bug, not the client's doing.
  if (matcher_ && !matcher_->terminated() && !matcher_->accept(id))
    throw k3::Error("the grammar rejected sampled token " + std::to_string(id));
  TokenLogprob lp;
  if (req_.top_logprobs >= 0) {
    // Log-probabilities of the raw logits over the ids that can be sampled at all.
    mask_untokenizable(raw, tok_.n_vocab());
    if (req_.top_logprobs > 0) lp.top = Sampler::top_logprobs(raw, req_.top_logprobs);
    lp.id = id;
    lp.logprob = Sampler::logprob_of(raw, id);
  }
  // A grammar that took its stop token has ended the output, whatever the stop list says (ignore_eos).
  const bool grammar_done = matcher_ && matcher_->terminated();
  if (grammar_done || std::find(stop_ids_.begin(), stop_ids_.end(), id) != stop_ids_.end()) {
    // The stop token is counted as generated, but neither emitted as text nor as an id.
    tokens_.push_back(id);
    o.completion_tokens += 1;
    flush_text(o);
    finished_ = true;
    o.finished = true;
    o.finish_reason = "stop";
    return o;
  }
  tokens_.push_back(id);
  o.completion_tokens += 1;
  o.new_token_ids.push_back(id);
  if (req_.top_logprobs >= 0) o.logprobs.push_back(std::move(lp));
  if (req_.skip_special_text && tok_.is_special(id)) {
    flush_text(o);
    if (!finished_) o.pieces.push_back({id, {}});
  } else {
    emit_text(o, detok_.push(id));
  }
  if (!finished_ && o.completion_tokens >= budget_) {
    flush_text(o);
    if (!finished_) {
      finished_ = true;
      o.finished = true;
      o.finish_reason = "length";
    }
  }
  return o;
}

int64_t Sequence::draft_room() const {
  const int64_t generated = static_cast<int64_t>(tokens_.size()) - n_prompt_;
  return std::max<int64_t>(0, budget_ - generated - 1);
}

std::span<const RowSample> Sequence::next_samples() {
  const std::span<const int32_t> prompt(tokens_.data(), static_cast<size_t>(n_prompt_));
  const std::span<const int32_t> gen(tokens_.data() + n_prompt_, tokens_.size() - static_cast<size_t>(n_prompt_));
  const auto rows = sampler_.next_rows(prompt, gen, drafts_, vocab_, tok_.n_vocab());
  rows_.clear();
  for (const sampling::RowSampling& r : rows) rows_.push_back(RowSample{r, req_.top_logprobs >= 0});
  // Constrained sequences get no drafts: their one row carries the grammar's mask.
  if (matcher_ && rows_.size() == 1) constrain(rows_[0].sampling);
  if (matcher_ && rows_.size() > 1) throw k3::Error("a constrained sequence was given speculative drafts");
  return rows_;
}

Sequence::Verified Sequence::on_verified(std::span<const sampling::SampleResult> results, std::span<float> raw,
                                         int64_t vocab) {
  Verified v;
  v.out = base();
  int64_t used = 0;
  for (size_t j = 0; j < results.size(); ++j) {
    std::span<float> lg;
    if (!raw.empty()) lg = raw.subspan(j * static_cast<size_t>(vocab), static_cast<size_t>(vocab));
    const size_t before = tokens_.size();
    RequestOutput o = on_sampled(results[j], lg);
    ++used;
    RequestOutput& m = v.out;
    m.new_token_ids.insert(m.new_token_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    for (auto& lp : o.logprobs) m.logprobs.push_back(std::move(lp));
    for (auto& pc : o.pieces) m.pieces.push_back(std::move(pc));
    m.completion_tokens = o.completion_tokens;
    const bool matches = tokens_.size() > before && j < drafts_.size() && tokens_.back() == drafts_[j];
    if (matches) ++v.accepted;
    if (o.finished) {
      m.finished = true;
      m.finish_reason = o.finish_reason;
      break;
    }
    if (!matches) break;
  }
  sampler_.consume_draws(used);
  drafts_.clear();
  return v;
}

RequestOutput Sequence::finish_now(const std::string& reason, const std::string& error) {
  RequestOutput o = base();
  finished_ = true;
  o.finished = true;
  o.finish_reason = reason;
  o.error = error;
  return o;
}

}  // namespace k3::engine
