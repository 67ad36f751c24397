// `k3 serve`'s HTTP server: Boost.Beast/Asio, an io_context run by a small fixed thread pool, one
// strand per connection, keep-alive, body limit, read/write timeouts, SSE streaming (chunked), client
// disconnect detection -> Engine::cancel, graceful shutdown; limits on connections, descriptors and
// in-flight body bytes; parsing/tokenisation on a worker pool. See docs/serving.md.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/engine_api.h"
#include "k3/serve/metrics.h"
#include "k3/serve/openai_api.h"

namespace k3::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;           // 0: any free port (see Server::port())
  // Non-empty: /v1/* needs "Authorization: Bearer <one of them>"; each key is its own prefix-cache
  // partition (cache_salt), so a client cannot probe what another key's clients sent.
  std::vector<std::string> api_keys;
  int threads = 2;                // I/O threads running the io_context
  size_t max_body_bytes = 8u << 20;
  int64_t max_waiting = 64;       // engine requests beyond max_num_seqs that may wait; more -> 429
  double read_timeout_s = 30;     // idle keep-alive + reading one request (headers and body)
  double write_timeout_s = 60;    // one write to a client that does not read -> disconnect
  double shutdown_grace_s = 30;   // in-flight requests may finish for this long after SIGTERM
  bool log_requests = false;      // one line per request on stderr
  int64_t max_connections = 0;    // open client connections; 0: from RLIMIT_NOFILE (soft limit - 64, at least 8)
  // Request-body bytes being received/parsed, all connections; 0: max(128 MiB, 2 x max_body_bytes).
  int64_t max_inflight_body_bytes = 0;
  int parse_threads = 2;          // workers that parse JSON and tokenise prompts (off the I/O threads)
  size_t parse_queue = 128;       // requests that may wait for a parse worker; more get 503
  // CORS (--allowed-origins): origins whose browser pages may call the API; "*" any. Empty: no CORS headers,
  // so browsers keep other sites' scripts out (the default; vLLM's is "*").
  std::vector<std::string> allowed_origins;
  // The web chat at / and /static/* (webui.h); --no-webui turns it off (404 there, as any unknown path).
  bool webui = true;
  // Set: /health answers 503 with its message while it returns one (a model that lost a rank).
  std::function<std::string()> health_problem;
};

// The CORS response headers for a request's Origin ("" when none applies): `Access-Control-Allow-Origin`
// (the origin itself, or * when "*" is allowed) and `Vary: Origin`; a preflight (OPTIONS) adds the methods,
// headers and max-age. Each header line ends in CRLF.
std::string cors_headers(const std::vector<std::string>& allowed, std::string_view origin, bool preflight);

// The limits of ServerOptions, checked: throws k3::Error naming the flag (`--timeout`, ...) for a value that
// makes no sense (0, negative, NaN, infinite...).
void validate(const ServerOptions& opt);

class Server {
 public:
  // engine, ctx.tok, ctx.chat and metrics must outlive the server.
  Server(ServerOptions opt, engine::Engine& engine, ApiContext ctx, Metrics& metrics);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Takes over SIGINT and SIGTERM from now on (queued until run_until_signal waits for them). Call it before start():
  // a signal sent as soon as the server answers -- an orchestrator stopping a replica it just saw healthy -- must be
  // a graceful shutdown, not the default action's kill (the e2e test that stops a server right after two requests
  // died of SIGTERM once on a loaded machine, session 60).
  void catch_signals();
  // Binds, listens and starts the I/O threads. Throws k3::Error (e.g. address in use).
  void start();
  uint16_t port() const;
  int64_t max_connections() const;  // as resolved by start()
  // Blocks until SIGINT or SIGTERM (catching them from here if catch_signals() was not called), then runs
  // shutdown(). A second signal exits at once (status 1).
  void run_until_signal();
  // Graceful: stop accepting, answer new requests 503, let in-flight requests finish within the
  // grace period, then abort the rest (their streams end with a final chunk, finish_reason
  // "abort"), stop the I/O threads. Calls engine.shutdown(). Idempotent.
  void shutdown();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::serve
