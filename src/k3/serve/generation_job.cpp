// One generation request: engine submission, engine outputs -> SSE events / final response, job metrics.
// See generation_job.h; the connection that writes the bytes is session.cpp.
#include "k3/serve/generation_job.h"

#include <algorithm>
#include <iterator>

namespace k3::serve {

namespace {
double secs(GenerationJob::Clock::time_point a, GenerationJob::Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
std::string event(const nlohmann::json& j) { return "data: " + dump(j) + "\n\n"; }
}  // namespace

GenerationJob::GenerationJob(GenRequest req, Clock::time_point arrival, JobEnv env)
    : env_(env), req_(std::move(req)), arrival_(arrival) {
  id_ = new_response_id(req_.endpoint);
  created_ = unix_now();
  const int n = req_.n;
  choices_.resize(n);
  first_sent_.assign(n, false);
  last_token_.assign(n, arrival_);
  if (req_.endpoint == Endpoint::Chat)
    for (int i = 0; i < n; ++i)
      parsers_.push_back(env_.ctx.chat->make_parser(req_.body, id_ + "-" + std::to_string(i)));
}

int GenerationJob::submit(const OutputPoster& post, bool draining) {
  int submitted = 0;
  for (int i = 0; i < req_.n; ++i) {
    engine::Request r;
    r.id = id_ + "-" + std::to_string(i);
    r.prompt = req_.prompt;
    r.params = req_.params;
    if (r.params.seed) r.params.seed = *r.params.seed + static_cast<uint64_t>(i);
    r.top_logprobs = req_.top_logprobs;
    r.cache_salt = req_.cache_salt;
    r.grammar = req_.grammar;
    engine_ids_.push_back(r.id);
    ++remaining_;
    try {
      env_.engine.submit(std::move(r), [post, i](const engine::RequestOutput& o) { post(i, o); });
      ++submitted;
    } catch (const std::exception& e) {
      --remaining_;
      engine_ids_.pop_back();
      error_ = e.what();
      error_status_ = draining ? 503 : 400;
      cancel_all();
      break;
    }
  }
  return submitted;
}

void GenerationJob::cancel_all() {
  for (const auto& id : engine_ids_) env_.engine.cancel(id);
}

std::optional<std::string> GenerationJob::on_output(int i, engine::RequestOutput&& o, bool stream_to_client) {
  auto& c = choices_[i];
  const auto now = Clock::now();
  const bool chat = req_.endpoint == Endpoint::Chat;

  if (!o.new_token_ids.empty()) {
    if (!any_token_) {
      any_token_ = true;
      env_.metrics.observe_ttft(secs(arrival_, now));
    } else if (c.completion_tokens > 0) {
      env_.metrics.observe_tpot(secs(last_token_[i], now) / double(o.new_token_ids.size()));
    }
    last_token_[i] = now;
  }
  c.completion_tokens = o.completion_tokens;

  ChatDelta delta;
  std::string text;
  if (chat) {
    delta = chat_step(*parsers_[i], o.pieces, o.finished);
  } else {
    for (const auto& p : o.pieces)
      if (p.special_id < 0) text += p.text;
  }
  if (o.finished) {
    c.finish_reason = o.finish_reason.empty() ? "stop" : o.finish_reason;
    if (!o.error.empty()) error_ = o.error;
    usage_.prompt_tokens = o.prompt_tokens;  // same prompt for every choice
    usage_.completion_tokens += o.completion_tokens;
    usage_.cached_tokens = std::max(usage_.cached_tokens, o.cached_prompt_tokens);
    --remaining_;
    --env_.inflight;
  }

  std::optional<std::string> out;
  if (stream_started_ && stream_to_client) {
    std::string fr = o.finished ? openai_finish_reason(c.finish_reason, !c.message.tool_calls.empty() ||
                                                                            !delta.tool_calls.empty())
                                : std::string();
    const bool first = chat && !first_sent_[i];
    if (first || !delta.empty() || !text.empty() || !o.logprobs.empty() || o.finished) {
      out = event(build_chunk(req_.endpoint, req_, id_, created_, i, first, delta, text, o.logprobs, fr,
                              *env_.ctx.tok, c.text_offset));
      first_sent_[i] = true;
    }
  }
  if (chat)
    c.message.append(std::move(delta));
  else
    c.text += text;
  if (!req_.stream)  // a stream sent them above; only a non-streamed response collects them
    c.logprobs.insert(c.logprobs.end(), std::make_move_iterator(o.logprobs.begin()),
                      std::make_move_iterator(o.logprobs.end()));
  return out;
}

void GenerationJob::mark_complete() {
  complete_ = true;
  env_.metrics.observe_e2e(secs(arrival_, Clock::now()));
  env_.metrics.add_tokens(usage_.prompt_tokens, usage_.completion_tokens);
}

std::vector<std::string> GenerationJob::stream_tail() const {
  std::vector<std::string> events;
  if (!error_.empty())
    events.push_back(event(error_json(ApiError(500, "generation failed: " + error_, "", "server_error"))));
  if (req_.include_usage) events.push_back(event(build_usage_chunk(req_.endpoint, req_, id_, created_, usage_)));
  events.push_back("data: [DONE]\n\n");
  return events;
}

ApiError GenerationJob::error_response() const {
  const int st = error_status_;
  return ApiError(st, st == 400 ? error_ : "generation failed: " + error_, "",
                  st == 400 ? "invalid_request_error" : "server_error");
}

std::string GenerationJob::response_body() const {
  return build_response_body(req_.endpoint, req_, id_, created_, choices_, usage_, *env_.ctx.tok);
}

}  // namespace k3::serve
