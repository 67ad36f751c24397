// The load generator of `k3 bench serve`: an async HTTP/1.1 client on Boost.Beast/Asio, one
// io_context on one thread, keep-alive connection pool, streamed SSE parsing with per-chunk
// timestamps. Requests are launched at their arrival times, at most max_concurrency in flight.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "k3/bench/dataset.h"
#include "k3/bench/stats.h"

namespace k3::bench {

struct Url {
  std::string host, port = "80", path;  // path without a trailing '/'
};
// "http://host:port[/prefix]" (https is not supported). Throws k3::Error.
Url parse_url(const std::string& s);

struct ClientOptions {
  Url url;                       // base URL; the endpoint path is appended
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string api_key;           // Authorization: Bearer
  bool ignore_eos = false;
  double temperature = 0.0;
  bool token_id_prompts = true;  // completions: send prompt_ids as a list when present
  double timeout_s = 6 * 3600;   // per-read inactivity timeout
};

bool is_chat_endpoint(const std::string& endpoint);

// The JSON body of one streaming request.
std::string request_body(const ClientOptions& o, const BenchRequest& r);

struct LoadResult {
  std::vector<RequestOutcome> outcomes;  // in request order
  double duration_s = 0;                 // first send -> last completion
  int64_t connections_opened = 0;
  bool usage_missing = false;            // some stream had no usage (output tokens = chunks then)
};

// Sends reqs[i] at arrivals[i] seconds (arrivals.size() == reqs.size()); max_concurrency <= 0: no
// limit. on_done (optional) is called on the client thread after each request.
LoadResult run_load(const ClientOptions& o, const std::vector<BenchRequest>& reqs, const std::vector<double>& arrivals,
                    int64_t max_concurrency, const std::function<void(size_t done)>& on_done = {});

// Blocking GET (for /metrics, /v1/models). Throws k3::Error on connection errors; returns the body
// and sets *status.
// `api_key`: sent as "Authorization: Bearer KEY" when not empty (a server with --api-key guards /v1/models).
std::string http_get(const Url& base, const std::string& path, int* status = nullptr, double timeout_s = 10,
                     const std::string& api_key = {});

// Sum of a Prometheus counter/gauge's samples (all label sets) in exposition text; nullopt if absent.
std::optional<double> prometheus_value(const std::string& text, const std::string& name);

// A tiny OpenAI-compatible mock: every POST streams max_tokens (or max_completion_tokens) one-token
// chunks immediately, each its own write, then a usage chunk and [DONE] (keep-alive). It measures
// what the client alone sustains (`k3 bench serve --dry-run-server`).
class MockServer {
 public:
  explicit MockServer(int threads = 1);
  ~MockServer();
  uint16_t port() const;
  int64_t requests() const;
  void stop();
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::bench
