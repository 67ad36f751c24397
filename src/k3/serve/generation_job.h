// One generation request of `k3 serve` (n engine requests): submits them, turns the engine's outputs
// into SSE events or the final JSON response, and keeps the job's metrics (TTFT, TPOT, e2e, tokens).
// It knows nothing of sockets or HTTP framing: the connection (session.cpp) writes what it returns.
// Threading: every method runs on the owning connection's strand; the engine's callbacks reach it
// only through the OutputPoster the connection hands to submit(), which must just post.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3/engine/engine_api.h"
#include "k3/serve/metrics.h"
#include "k3/serve/openai_api.h"

namespace k3::serve {

// What a job uses of the server: kept to these so the job cannot reach into the connection.
struct JobEnv {
  engine::Engine& engine;
  const ApiContext& ctx;
  Metrics& metrics;
  std::atomic<int64_t>& inflight;  // engine requests admitted and not finished (Server::Impl::inflight)
};

class GenerationJob {
 public:
  using Clock = std::chrono::steady_clock;
  // Called on the engine thread with (choice index, output); must only hand it over (post) to the strand.
  using OutputPoster = std::function<void(int, const engine::RequestOutput&)>;

  GenerationJob(GenRequest req, Clock::time_point arrival, JobEnv env);

  // Submits the n engine requests; returns how many were accepted. On a submit failure the ones
  // already submitted are cancelled and failed() turns true (status 503 while draining, else 400);
  // the job then completes when they have reported back (remaining() == 0).
  int submit(const OutputPoster& post, bool draining);
  // Cancels every submitted engine request (the client left).
  void cancel_all();

  // One engine output for choice i. Returns the SSE event ("data: ...\n\n") to send when the stream
  // has started and `stream_to_client`; updates the collected choices and usage either way (a
  // non-streamed job takes o's logprobs over rather than copying them).
  std::optional<std::string> on_output(int i, engine::RequestOutput&& o, bool stream_to_client);

  // All choices finished: records the job's e2e latency and token counts; complete() turns true.
  void mark_complete();
  // The SSE events that end a stream: an error event if generation failed, the usage chunk if
  // asked for, then "data: [DONE]".
  std::vector<std::string> stream_tail() const;
  // Non-streamed: the error to answer with (when failed()), else the response body.
  ApiError error_response() const;
  std::string response_body() const;

  const GenRequest& req() const { return req_; }
  int remaining() const { return remaining_; }
  bool failed() const { return !error_.empty(); }
  bool complete() const { return complete_; }
  bool stream_started() const { return stream_started_; }
  void set_stream_started() { stream_started_ = true; }  // the SSE response head has been queued

 private:
  JobEnv env_;
  GenRequest req_;
  std::string id_;
  int64_t created_ = 0;
  std::vector<std::string> engine_ids_;
  std::vector<ChoiceState> choices_;
  std::vector<std::unique_ptr<ChatOutputParser>> parsers_;
  std::vector<bool> first_sent_;
  std::vector<Clock::time_point> last_token_;
  int remaining_ = 0;
  Usage usage_;
  Clock::time_point arrival_;
  bool any_token_ = false;
  std::string error_;  // engine error or submit failure (non-stream: answered as an error)
  int error_status_ = 500;
  bool complete_ = false;        // all choices finished
  bool stream_started_ = false;  // SSE headers sent
};

}  // namespace k3::serve
