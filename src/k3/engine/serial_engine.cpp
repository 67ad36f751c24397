#include "k3/engine/serial_engine.h"

#include <algorithm>
#include <random>

#include "k3/core/error.h"
#include "k3/engine/sampler.h"
#include "k3/engine/stop_matcher.h"
#include "k3/text/stream_decoder.h"

namespace k3::engine {

SerialEngine::SerialEngine(const Model& model, const text::Tokenizer& tok, SerialEngineOptions opt)
    : model_(model), tok_(tok), opt_(opt) {
  thread_ = std::thread([this] { loop(); });
}

SerialEngine::~SerialEngine() { shutdown(false); }

void SerialEngine::submit(Request req, OutputCallback on_output) {
  req.params.validate();
  if (req.prompt.empty()) throw Error("empty prompt: at least one token is needed");
  const int64_t n = static_cast<int64_t>(req.prompt.size());
  if (n >= opt_.max_model_len)
    throw Error("the prompt has " + std::to_string(n) + " tokens, but max_model_len is " +
                std::to_string(opt_.max_model_len) + " (prompt + completion); shorten the prompt");
  const int64_t vocab = model_.config().vocab_size;
  for (int32_t id : req.prompt)
    if (id < 0 || id >= vocab)
      throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(vocab) + ")");
  if (req.top_logprobs > 20) throw Error("top_logprobs must be <= 20");
  std::lock_guard lk(mu_);
  if (!accepting_) throw Error("the engine is shutting down");
  queue_.push_back(Item{std::move(req), std::move(on_output)});
  ++stats_.waiting;
  cv_.notify_all();
}

void SerialEngine::cancel(const std::string& request_id) {
  Item aborted;
  bool found = false;
  {
    std::lock_guard lk(mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(), [&](const Item& i) { return i.req.id == request_id; });
    if (it != queue_.end()) {
      aborted = std::move(*it);
      queue_.erase(it);
      --stats_.waiting;
      found = true;
    } else if (running_id_ == request_id) {
      cancelled_.insert(request_id);
    }
  }
  if (found) {  // never started: report it as aborted right away (the interface's "engine thread"
                // rule is about not blocking; the callback only posts, so the caller's thread is fine)
    RequestOutput o;
    o.request_id = aborted.req.id;
    o.finished = true;
    o.finish_reason = "abort";
    o.prompt_tokens = static_cast<int64_t>(aborted.req.prompt.size());
    aborted.cb(o);
  }
}

bool SerialEngine::take_cancel(const std::string& id) {
  std::lock_guard lk(mu_);
  if (abort_all_) return true;
  return cancelled_.erase(id) > 0;
}

EngineStats SerialEngine::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

EngineLimits SerialEngine::limits() const {
  EngineLimits l;
  l.max_model_len = opt_.max_model_len;
  l.max_num_seqs = opt_.max_num_seqs;
  l.vocab_size = model_.config().vocab_size;
  return l;
}

void SerialEngine::shutdown(bool drain) {
  std::deque<Item> dropped;
  {
    std::lock_guard lk(mu_);
    accepting_ = false;
    if (!drain) {
      abort_all_ = true;
      dropped.swap(queue_);
      stats_.waiting = 0;
    }
    stop_ = true;
    cv_.notify_all();
  }
  for (auto& it : dropped) {
    RequestOutput o;
    o.request_id = it.req.id;
    o.finished = true;
    o.finish_reason = "abort";
    o.prompt_tokens = static_cast<int64_t>(it.req.prompt.size());
    it.cb(o);
  }
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
}

void SerialEngine::loop() {
  for (;;) {
    Item item;
    {
      std::unique_lock lk(mu_);
      cv_.wait(lk, [&] { return !queue_.empty() || stop_; });
      if (queue_.empty()) return;  // stop_ and drained
      item = std::move(queue_.front());
      queue_.pop_front();
      --stats_.waiting;
      ++stats_.running;
      running_id_ = item.req.id;
    }
    run_one(item);  // updates stats_ before delivering the final output
  }
}

void SerialEngine::run_one(Item& item) {
  const Request& req = item.req;
  RequestOutput out;
  out.request_id = req.id;
  out.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  bool reported = false;
  auto deliver_final = [&](const std::string& reason, const std::string& err = {}) {
    if (reported) return;
    reported = true;
    {  // the request is gone from stats() before its final output is seen
      std::lock_guard lk(mu_);
      --stats_.running;
      running_id_.clear();
      cancelled_.erase(req.id);
    }
    out.finished = true;
    out.finish_reason = reason;
    out.error = err;
    item.cb(out);
  };
  try {
    const auto& cfg = model_.config();
    const SamplingParams& p = req.params;
    std::vector<int32_t> stop_ids = p.stop_token_ids;
    if (!p.ignore_eos) {
      if (cfg.eos_token_id >= 0) stop_ids.push_back(static_cast<int32_t>(cfg.eos_token_id));
      if (tok_.eos_id() >= 0) stop_ids.push_back(tok_.eos_id());
    }
    Sampler sampler(p, std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32));
    StopMatcher stops(p.stop);
    text::StreamDecoder detok(tok_);

    auto st = model_.new_sequence();
    std::vector<float> logits, raw;
    const std::span<const int32_t> prompt(req.prompt);
    for (size_t i = 0; i < prompt.size(); i += static_cast<size_t>(opt_.prefill_chunk)) {
      if (take_cancel(req.id)) return deliver_final("abort");
      const size_t n = std::min(prompt.size() - i, static_cast<size_t>(opt_.prefill_chunk));
      model_.forward(prompt.subspan(i, n), st, logits);
    }
    {
      std::lock_guard lk(mu_);
      stats_.prompt_tokens_total += out.prompt_tokens;
    }
    const int64_t budget = std::min<int64_t>(p.max_tokens, opt_.max_model_len - out.prompt_tokens);
    std::vector<int32_t> generated;
    while (static_cast<int64_t>(generated.size()) < budget) {
      if (take_cancel(req.id)) {
        out.pieces.clear();
        return deliver_final("abort");
      }
      if (req.top_logprobs >= 0) raw = logits;
      const int32_t id = sampler.sample(logits, prompt, generated);
      out.new_token_ids.assign(1, id);
      out.pieces.clear();
      out.logprobs.clear();
      if (req.top_logprobs >= 0) {
        TokenLogprob lp;
        lp.id = id;
        lp.logprob = Sampler::logprob_of(raw, id);
        if (req.top_logprobs > 0) lp.top = Sampler::top_logprobs(raw, req.top_logprobs);
        out.logprobs.push_back(std::move(lp));
      }
      ++out.completion_tokens;
      {
        std::lock_guard lk(mu_);
        ++stats_.generation_tokens_total;
      }
      const bool is_stop_id = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
      if (is_stop_id) {  // the stop token is counted but neither emitted nor reported
        out.new_token_ids.clear();
        out.logprobs.clear();
        auto r = stops.push(detok.flush());
        if (!r.emit.empty()) out.pieces.push_back({-1, r.emit});
        if (!r.stopped) {
          std::string rest = stops.flush();
          if (!rest.empty()) out.pieces.push_back({-1, rest});
        }
        return deliver_final("stop");
      }
      generated.push_back(id);
      if (req.skip_special_text && tok_.is_special(id)) {
        // Text before a control token is released first (a stop string cannot span it).
        auto r = stops.push(detok.flush());
        if (!r.emit.empty()) out.pieces.push_back({-1, r.emit});
        if (r.stopped) return deliver_final("stop");
        std::string rest = stops.flush();
        if (!rest.empty()) out.pieces.push_back({-1, rest});
        out.pieces.push_back({id, {}});
      } else {
        auto r = stops.push(detok.push(id));
        if (!r.emit.empty()) out.pieces.push_back({-1, r.emit});
        if (r.stopped) return deliver_final("stop");
      }
      if (static_cast<int64_t>(generated.size()) == budget) break;
      item.cb(out);
      model_.forward(std::span<const int32_t>(&generated.back(), 1), st, logits);
    }
    // Length limit: release what is still held back.
    auto r = stops.push(detok.flush());
    if (!r.emit.empty()) out.pieces.push_back({-1, r.emit});
    if (r.stopped) return deliver_final("stop");
    std::string rest = stops.flush();
    if (!rest.empty()) out.pieces.push_back({-1, rest});
    deliver_final("length");
  } catch (const std::exception& e) {
    out.pieces.clear();
    out.new_token_ids.clear();
    out.logprobs.clear();
    deliver_final("error", e.what());
  }
}

}  // namespace k3::engine
