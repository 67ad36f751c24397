// One client connection of `k3 serve`: reads requests, routes them (and checks API keys), writes
// responses and SSE streams, and watches for the client going away in every state. What a generation
// request sends is built by its GenerationJob (generation_job.h); this file only frames and writes it.
// See docs/serving.md ("Connections and limits") for the rules this file implements.
#include <poll.h>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>

#include "k3/serve/generation_job.h"
#include "k3/serve/server_impl.h"
#include "k3/serve/webui.h"

namespace k3::serve {

namespace beast = boost::beast;
namespace http = beast::http;
using Clock = std::chrono::steady_clock;

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
std::chrono::steady_clock::duration dur(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s));
}
bool const_time_eq(std::string_view a, std::string_view b) {
  unsigned char d = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) d |= static_cast<unsigned char>(a[i] ^ b[i % (b.empty() ? 1 : b.size())]);
  return d == 0 && !b.empty();
}
std::string hex(size_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%zx", n);
  return buf;
}
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

constexpr size_t kHeaderLimit = 64 * 1024;
// Bytes read but not yet consumed by the parser: a header, a chunk-size line, pipelined requests.
// Unbounded, a chunk extension ("1;aaaa..." without end) grew it by the megabyte (+64 MiB for 64 MiB sent).
constexpr size_t kMaxBuffered = kHeaderLimit + 64 * 1024;
// How often a connection whose request is being parsed or generated checks that its client is still there.
constexpr auto kWatchEvery = std::chrono::milliseconds(50);

// What a parse worker hands back to the connection.
struct Parsed {
  std::optional<GenRequest> req;
  std::optional<std::string> response;  // a whole JSON answer (/tokenize, /detokenize)
  std::optional<ApiError> error;
};

// What a POST body is parsed for on the parse pool.
enum class BodyJob { Chat, Completions, Tokenize, Detokenize };

class Session final : public Connection, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& s, Server::Impl& srv)
      : stream_(std::move(s)), srv_(srv), write_timer_(stream_.get_executor()), watch_timer_(stream_.get_executor()) {
    chunk_cb_ = [this](std::uint64_t size, beast::string_view, beast::error_code& ec) {
      if (size > 0 && !body_res_.grow(size)) {
        budget_refused_ = true;
        ec = http::error::body_limit;
      }
    };
  }
  ~Session() override { srv_.conns.remove(reg_); }

  void start(ConnRegistry::Handle h) {
    reg_ = h;
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  int64_t idle_since() const override { return idle_since_.load(); }
  bool shed() override {
    int64_t t = idle_since_.load();
    if (t < 0 || !idle_since_.compare_exchange_strong(t, -1)) return false;
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      if (!self->awaiting_header_ || self->closed_) return;
      self->srv_.metrics.count_rejection("shed_idle");
      self->close();
    });
    return true;
  }

  // Engine thread -> strand. The copy made here is the only one: it is moved on into the job.
  void post_output(int index, const engine::RequestOutput& o) {
    net::post(stream_.get_executor(),
              [self = shared_from_this(), index, out = o]() mutable { self->on_output(index, std::move(out)); });
  }

 private:
  // ---- reading requests --------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(srv_.opt.max_body_bytes);
    parser_->header_limit(kHeaderLimit);
    parser_->on_chunk_header(chunk_cb_);
    body_res_ = BodyReservation(srv_.body_budget);
    budget_refused_ = false;
    awaiting_header_ = true;
    header_bytes_ = 0;
    idle_since_ = buf_.size() == 0 ? steady_ns() : -1;  // pipelined bytes waiting: not idle
    stream_.expires_after(dur(srv_.opt.read_timeout_s));
    read_header();
  }

  // http::async_read_header would do, but Beast's header_limit holds per parser.put() call, not per
  // header: a client sending fields without end (a header flood) grew the field list without bound
  // until the read timeout. So the header is fed to the parser here, and its bytes counted.
  void read_header() {
    beast::error_code ec;
    while (buf_.size() > 0 && !parser_->is_header_done()) {
      const size_t used = parser_->put(buf_.data(), ec);
      buf_.consume(used);
      header_bytes_ += used;
      if (ec == http::error::need_more) {
        ec = {};
        break;
      }
      if (ec) return on_header(ec);
    }
    if (parser_->is_header_done()) return on_header({});
    if (header_bytes_ + buf_.size() >= kHeaderLimit) return on_header(http::error::header_limit);
    stream_.async_read_some(buf_.prepare(16 * 1024), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec == net::error::eof)  // before any byte: the client is done; inside a header: truncated
        return self->on_header(self->parser_->got_some() || self->buf_.size() ? http::error::partial_message
                                                                              : http::error::end_of_stream);
      if (ec) return self->on_header(ec);
      self->buf_.commit(n);
      self->read_header();
    });
  }

  void on_header(beast::error_code ec) {
    awaiting_header_ = false;
    idle_since_ = -1;
    if (ec) return on_read_error(ec);
    const auto& h = parser_->get();
    http10_ = h.version() < 11;
    if (const char* why = framing_error(h)) {
      close_after_ = linger_ = true;
      srv_.metrics.count_rejection("bad_framing");
      return send_error("other", ApiError(400, std::string("malformed HTTP request: ") + why));
    }
    if (auto len = parser_->content_length(); len && *len > 0 && !body_res_.grow(*len)) {
      budget_refused_ = true;
      return on_read_error(http::error::body_limit);
    }
    if (!http10_ && beast::iequals(trim(h[http::field::expect]), "100-continue") && !parser_->is_done())
      queue_write("HTTP/1.1 100 Continue\r\n\r\n");
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  // RFC 9112: 6.1 (Transfer-Encoding: only "chunked", which we decode; never with HTTP/1.0), 6.3 (never
  // together with Content-Length: request smuggling), 3.2 (exactly one Host in HTTP/1.1).
  static const char* framing_error(const http::request_parser<http::string_body>::value_type& h) {
    int te = 0, host = 0;
    bool te_chunked = true;
    for (const auto& f : h) {
      if (f.name() == http::field::transfer_encoding) {
        ++te;
        te_chunked = te_chunked && beast::iequals(trim(f.value()), "chunked");
      } else if (f.name() == http::field::host) {
        ++host;
      }
    }
    if (te > 1 || (te == 1 && !te_chunked)) return "Transfer-Encoding must be exactly \"chunked\"";
    if (te && h.count(http::field::content_length)) return "Transfer-Encoding together with Content-Length";
    if (te && h.version() < 11) return "Transfer-Encoding in an HTTP/1.0 request";
    if (h.version() >= 11 && host != 1) return "an HTTP/1.1 request needs exactly one Host header";
    return nullptr;
  }

  void on_read_error(beast::error_code ec) {
    body_res_.reset();
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || ec == net::error::eof) {
      return close();
    }
    close_after_ = linger_ = true;
    if (budget_refused_) {
      srv_.metrics.count_rejection("body_budget");
      return send_error("other", ApiError(503, "the server is receiving too many request bodies at once; retry later",
                                          "", "server_error"));
    }
    if (ec == http::error::body_limit) {
      srv_.metrics.count_rejection("body_too_large");
      return send_error("other", ApiError(413, "the request body is larger than the limit of " +
                                                   std::to_string(srv_.opt.max_body_bytes) + " bytes",
                                          "", "invalid_request_error", "request_too_large"));
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      srv_.metrics.count_rejection("headers_too_large");
      return send_error("other", ApiError(431, "the request headers (or a chunk-size line) are too large"));
    }
    srv_.metrics.count_rejection("bad_framing");
    return send_error("other", ApiError(400, std::string("malformed HTTP request: ") + ec.message()));
  }

  void on_read(beast::error_code ec) {
    if (ec) return on_read_error(ec);
    stream_.expires_never();
    req_ = parser_->release();
    close_after_ = !req_.keep_alive();
    arrival_ = Clock::now();
    try {
      handle();
    } catch (const ApiError& e) {
      send_error(endpoint_, e);
    } catch (const std::exception& e) {
      send_error(endpoint_, ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"));
    }
    if (!parsing_) body_res_.reset();  // else the parse worker holds it
  }

  // ---- routing -----------------------------------------------------------------------------------
  void handle() {
    std::string path(req_.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    const auto method = req_.method();
    // The route's one method; true when the request was a CORS preflight (OPTIONS), answered 204 here: no auth,
    // no body (the allowed headers are in cors_).
    auto only = [&](http::verb v, const char* allow) {
      if (method == http::verb::options) {
        send_response(204, "", "text/plain");
        return true;
      }
      if (method != v) {
        allow_ = allow;
        throw ApiError(405, "method " + std::string(req_.method_string()) + " is not allowed for " + path, "",
                       "invalid_request_error", "method_not_allowed");
      }
      return false;
    };
    const auto origin = req_.find(http::field::origin);
    const std::string_view origin_v = origin == req_.end() ? std::string_view() : std::string_view(origin->value().data(), origin->value().size());
    cors_ = cors_headers(srv_.opt.allowed_origins, origin_v, method == http::verb::options);
    if (path == "/health") {
      endpoint_ = "/health";
      if (only(http::verb::get, "GET")) return;
      if (srv_.opt.health_problem)
        if (const std::string p = srv_.opt.health_problem(); !p.empty())
          throw ApiError(503, "unhealthy: " + p, "", "server_error");
      if (srv_.draining) throw ApiError(503, "the server is shutting down", "", "server_error");
      return send_response(200, "{\"status\":\"ok\"}", "application/json");
    }
    if (path == "/metrics") {
      endpoint_ = "/metrics";
      if (only(http::verb::get, "GET")) return;
      return send_response(200, srv_.metrics.render(srv_.engine.stats()), "text/plain; version=0.0.4; charset=utf-8");
    }
    if (path == "/v1/models") {
      endpoint_ = "/v1/models";
      if (only(http::verb::get, "GET")) return;
      check_auth();
      return send_response(200, dump(models_json(srv_.ctx.model_name, srv_.ctx.model_root, srv_.created, srv_.ctx.max_model_len)),
                           "application/json");
    }
    if (path == "/version") {  // vLLM's
      endpoint_ = "/version";
      if (only(http::verb::get, "GET")) return;
      return send_response(200, "{\"version\":\"" K3_VERSION "\"}", "application/json");
    }
    if (path == "/v1/chat/completions" || path == "/v1/completions" || path == "/tokenize" || path == "/detokenize") {
      endpoint_ = path;
      if (only(http::verb::post, "POST")) return;
      const int key = check_auth();
      if (srv_.draining) {
        close_after_ = true;
        throw ApiError(503, "the server is shutting down", "", "server_error");
      }
      const BodyJob job = path == "/v1/chat/completions" ? BodyJob::Chat
                          : path == "/v1/completions"   ? BodyJob::Completions
                          : path == "/tokenize"         ? BodyJob::Tokenize
                                                        : BodyJob::Detokenize;
      return start_parse(job, key);
    }
    if (const WebAsset* asset = srv_.opt.webui ? find_web_asset(path) : nullptr) return send_web_asset(*asset, only);
    endpoint_ = "other";
    throw ApiError(404, "no such endpoint: " + std::string(req_.method_string()) + " " + path, "",
                   "invalid_request_error", "not_found");
  }

  // The web chat's files: public like /health (the page asks for the API key and sends it to /v1/*), same
  // origin as the API, so it needs no CORS. A matching If-None-Match gets 304 without the body.
  template <class Only>
  void send_web_asset(const WebAsset& asset, Only& only) {
    endpoint_ = "/webui";
    if (only(http::verb::get, "GET")) return;
    cors_.clear();  // the page calls the API from its own origin; other sites have no use for its files
    std::string extra = web_asset_headers(asset);
    const auto inm = req_.find(http::field::if_none_match);
    if (inm != req_.end() && etag_matches(std::string_view(inm->value().data(), inm->value().size()), asset)) {
      srv_.metrics.count_request(endpoint_, 304);
      if (srv_.opt.log_requests) std::fprintf(stderr, "k3 serve: GET %s 304\n", std::string(req_.target()).c_str());
      if (srv_.draining) close_after_ = true;
      // 304: no body, and Content-Length (if any) must be the representation's (RFC 9110 8.6).
      after_flush_ = [this] { finish_exchange(); };
      return queue_write(head(304, std::string(asset.content_type), extra, false, asset.body.size()));
    }
    send_response(200, std::string(asset.body), std::string(asset.content_type), std::move(extra));
  }

  // The index of the matching API key; -1 when none are configured.
  int check_auth() {
    if (srv_.opt.api_keys.empty()) return -1;
    auto it = req_.find(http::field::authorization);
    std::string_view v = it == req_.end() ? std::string_view() : std::string_view(it->value().data(), it->value().size());
    const std::string_view pre = "Bearer ";
    int match = -1;
    if (v.size() >= pre.size() && v.substr(0, pre.size()) == pre)
      for (size_t i = 0; i < srv_.opt.api_keys.size(); ++i)  // every key compared: no early exit to time
        if (const_time_eq(v.substr(pre.size()), srv_.opt.api_keys[i]) && match < 0) match = static_cast<int>(i);
    if (match >= 0) return match;
    throw ApiError(401, "invalid or missing API key (send \"Authorization: Bearer <key>\")", "",
                   "invalid_request_error", "invalid_api_key");
  }

  // JSON parsing and tokenisation of a generation request run on the parse pool: a prompt of megabytes
  // takes long enough to stall every connection of an I/O thread (issue 11, /health). The body and its
  // share of the body budget go with the task; the result comes back on this connection's strand.
  // key: the index of the API key that authorised it (-1: none configured); each key is its own
  // prefix-cache partition, so a client cannot probe what another key's clients sent.
  void start_parse(BodyJob job, int key) {
    struct Task {
      std::string body;
      BodyReservation res;
    };
    auto task = std::make_shared<Task>();
    task->body = std::move(req_.body());
    task->res = std::move(body_res_);
    std::function<void()> fn = [self = shared_from_this(), job, key, task] {
      Parsed p;
      try {
        if (job == BodyJob::Tokenize || job == BodyJob::Detokenize) {
          const auto body = parse_json_body(task->body);
          p.response = dump(job == BodyJob::Tokenize ? tokenize_response(body, self->srv_.ctx)
                                                     : detokenize_response(body, self->srv_.ctx));
        } else {
          p.req = parse_generation_request(job == BodyJob::Chat ? Endpoint::Chat : Endpoint::Completions,
                                           parse_json_body(task->body), self->srv_.ctx);
          if (key >= 0) p.req->cache_salt = "api-key-" + std::to_string(key) + '\x1f' + p.req->cache_salt;
        }
      } catch (const ApiError& e) {
        p.error = e;
      } catch (const std::exception& e) {
        p.error = ApiError(500, std::string("internal error: ") + e.what(), "", "server_error");
      }
      task->body = std::string();
      task->res.reset();
      net::post(self->stream_.get_executor(),
                [self, p = std::make_shared<Parsed>(std::move(p))]() mutable { self->on_parsed(std::move(*p)); });
    };
    if (!srv_.parse_pool.try_submit(fn)) {
      srv_.metrics.count_rejection("parse_queue_full");
      throw ApiError(503, "too many requests are waiting to be parsed; retry later", "", "server_error");
    }
    parsing_ = true;
    start_watch();
  }

  void on_parsed(Parsed p) {
    parsing_ = false;
    if (closed_ || client_gone_) return close();
    if (p.error) return send_error(endpoint_, *p.error);
    if (p.response) return send_response(200, std::move(*p.response), "application/json");
    const int n = p.req->n;
    if (!srv_.reserve_inflight(n)) {
      srv_.metrics.count_rejection("saturated");
      return send_error(endpoint_, ApiError(429, "the server is saturated (" + std::to_string(srv_.inflight.load()) +
                                                     " requests in flight); retry later",
                                            "", "rate_limit_error"));
    }
    try {
      start_job(std::move(*p.req));
    } catch (const std::exception& e) {
      send_error(endpoint_, ApiError(500, std::string("internal error: ") + e.what(), "", "server_error"));
    }
  }

  // ---- plain responses ---------------------------------------------------------------------------
  std::string head(int status, const std::string& ctype, const std::string& extra, bool stream, size_t len) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " +
                    std::string(http::obsolete_reason(static_cast<http::status>(status))) + "\r\n";
    h += "Server: k3.cpp\r\nContent-Type: " + ctype + "\r\n";
    if (stream)  // HTTP/1.0 has no chunked coding: the stream ends when the connection closes
      h += http10_ ? "Cache-Control: no-cache\r\n" : "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    else
      h += "Content-Length: " + std::to_string(len) + "\r\n";
    h += extra;
    h += cors_;
    h += close_after_ ? "Connection: close\r\n\r\n" : "Connection: keep-alive\r\n\r\n";
    return h;
  }

  void send_response(int status, std::string body, const std::string& ctype, std::string extra = {}) {
    srv_.metrics.count_request(endpoint_, status);
    if (srv_.opt.log_requests)
      std::fprintf(stderr, "k3 serve: %s %s %d\n", std::string(req_.method_string()).c_str(),
                   std::string(req_.target()).c_str(), status);
    if (srv_.draining) close_after_ = true;
    std::string msg = head(status, ctype, extra, false, body.size());
    msg += body;
    after_flush_ = [this] { finish_exchange(); };
    queue_write(std::move(msg));
  }

  void send_error(const std::string& endpoint, const ApiError& e) {
    endpoint_ = endpoint.empty() ? "other" : endpoint;
    std::string extra;
    if (e.status == 405 && !allow_.empty()) extra += "Allow: " + allow_ + "\r\n";
    if (e.status == 429 || e.status == 503) extra += "Retry-After: 1\r\n";
    if (e.status == 413 || (e.status == 400 && parser_ && !parser_->is_done())) close_after_ = linger_ = true;
    send_response(e.status, dump(error_json(e)), "application/json", extra);
  }

  // Response fully written: next request, or close.
  void finish_exchange() {
    if (linger_ && !client_gone_) return linger();
    if (close_after_ || client_gone_ || srv_.draining) return close();
    do_read();
  }

  // The request was rejected before it was read to the end (413, 431, malformed HTTP): the client may
  // still be sending. Closing now, with its bytes unread, makes the kernel send a RST that can destroy
  // our error response in flight (the client sees "connection reset" / EPIPE instead of the 413).
  // So: half-close, then read and discard until the client closes too, at most kLingerSeconds.
  static constexpr double kLingerSeconds = 5.0;
  void linger() {
    linger_ = false;
    beast::error_code ignore;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignore);
    stream_.expires_after(dur(kLingerSeconds));
    linger_buf_.resize(64 * 1024);
    drain();
  }
  void drain() {
    stream_.async_read_some(net::buffer(linger_buf_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) {
        self->linger_buf_.clear();
        self->linger_buf_.shrink_to_fit();
        return self->close();
      }
      self->drain();
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    idle_since_ = -1;
    write_timer_.cancel();
    watch_timer_.cancel();
    body_res_.reset();
    beast::error_code ignore;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignore);
    stream_.socket().close(ignore);
  }

  // ---- writes ------------------------------------------------------------------------------------
  void queue_write(std::string bytes) {
    // Not cleared here: a non-empty queue means a write is in flight, and its buffer is outq_.front().
    // on_write clears the queue when that write fails.
    if (client_gone_ || closed_) return;
    outq_.push_back(std::move(bytes));
    do_write();
  }

  void do_write() {
    if (writing_ || outq_.empty()) return;
    writing_ = true;
    write_timer_.expires_after(dur(srv_.opt.write_timeout_s));
    write_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && self->writing_) {  // the client stopped reading
        beast::error_code ignore;
        self->stream_.socket().close(ignore);
      }
    });
    net::async_write(stream_, net::buffer(outq_.front()),
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    write_timer_.cancel();
    if (ec) {
      outq_.clear();
      on_client_gone();
      return;
    }
    outq_.pop_front();
    if (!outq_.empty()) return do_write();
    if (after_flush_) {
      auto f = std::move(after_flush_);
      after_flush_ = nullptr;
      f();
    }
  }

  // ---- disconnect detection while a request is parsed or generated --------------------------------
  // No read is kept pending meanwhile: bytes the client pipelines stay in the kernel's socket buffer
  // (bounded, TCP backpressure) for the next do_read. Instead the socket is polled every kWatchEvery:
  // POLLHUP/POLLERR (a reset) means gone. POLLRDHUP (the client's FIN) is ambiguous: it half-closed
  // (shutdown(SHUT_WR)) and waits for the answer, or it closed. A byte it must accept tells them apart:
  // a closed socket answers it with a reset, which the next poll sees. The byte is an SSE comment in
  // a stream, else an interim "100 Continue" (RFC 9110 15.2: HTTP/1.1 clients must accept 1xx).
  // HTTP/1.0 has no 1xx: its FIN counts as gone.
  bool busy() const { return parsing_ || (job_ && !job_->complete()); }

  void start_watch() {
    if (watching_ || closed_) return;
    watching_ = true;
    watch_timer_.expires_after(kWatchEvery);
    watch_timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->on_watch(ec); });
  }

  void on_watch(beast::error_code ec) {
    watching_ = false;
    if (ec || closed_ || client_gone_ || !busy()) return;
    pollfd p{stream_.socket().native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0) {
      if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return on_client_gone();
      if ((p.revents & POLLRDHUP) && !peer_fin_) {
        peer_fin_ = true;
        if (http10_) return on_client_gone();
        if (job_ && job_->stream_started())
          send_event_raw(": probe\n\n");
        else
          queue_write("HTTP/1.1 100 Continue\r\n\r\n");
      }
    }
    start_watch();
  }

  void on_client_gone() {
    if (client_gone_) return;
    client_gone_ = true;
    if (busy()) srv_.metrics.count_disconnect();
    if (job_ && !job_->complete()) {
      job_->cancel_all();
    } else if (job_ && job_->complete()) {
      end_job();
    } else {
      close();
    }
  }

  // ---- generation --------------------------------------------------------------------------------
  // `srv_.inflight` already holds n for this job (reserve_inflight); unsubmitted ones are given back.
  void start_job(GenRequest gr) {
    const int n = gr.n;
    auto job = std::make_shared<GenerationJob>(std::move(gr), arrival_,
                                               JobEnv{srv_.engine, srv_.ctx, srv_.metrics, srv_.inflight});
    job_ = job;
    ++srv_.active_jobs;
    start_watch();
    // The engine thread only posts the output to this connection's strand (never blocks on it).
    const int submitted = job->submit(
        [self = shared_from_this()](int i, const engine::RequestOutput& o) { self->post_output(i, o); },
        srv_.draining);
    srv_.inflight -= n - submitted;
    if (job->failed()) {
      if (job->remaining() == 0) complete_job();
      return;  // the rest completes when the cancelled ones report back
    }
    if (job->req().stream) {
      job->set_stream_started();
      srv_.metrics.count_request(endpoint_, 200);
      if (srv_.draining || http10_) close_after_ = true;
      queue_write(head(200, "text/event-stream", "", true, 0));
    }
  }

  // One SSE event, framed as a chunk (HTTP/1.1) or raw (HTTP/1.0: the stream ends with the connection).
  void send_event_raw(const std::string& data) {
    queue_write(http10_ ? data : hex(data.size()) + "\r\n" + data + "\r\n");
  }

  void on_output(int i, engine::RequestOutput&& o) {
    auto job = job_;
    if (!job || job->complete()) return;
    if (auto ev = job->on_output(i, std::move(o), !client_gone_)) send_event_raw(*ev);
    if (job->remaining() == 0) complete_job();
  }

  void complete_job() {
    auto job = job_;
    job->mark_complete();
    if (client_gone_) return end_job();
    if (job->stream_started()) {
      // Set before the last bytes are queued; it runs only once the queue has drained (writes are async).
      after_flush_ = [this] { end_job(); };
      for (const auto& ev : job->stream_tail()) send_event_raw(ev);
      if (!http10_) queue_write("0\r\n\r\n");
      return;
    }
    if (job->failed()) {
      after_flush_ = nullptr;
      job_.reset();
      --srv_.active_jobs;
      return send_error(endpoint_, job->error_response());
    }
    std::string body = job->response_body();
    job_.reset();
    --srv_.active_jobs;
    send_response(200, std::move(body), "application/json");
  }

  // Streaming finished (or the client left): release the job and go on.
  void end_job() {
    if (job_) {
      job_.reset();
      --srv_.active_jobs;
    }
    if (client_gone_) return close();
    finish_exchange();
  }

  beast::tcp_stream stream_;
  Server::Impl& srv_;
  ConnRegistry::Handle reg_;
  net::steady_timer write_timer_, watch_timer_;
  beast::flat_buffer buf_{kMaxBuffered};
  std::optional<http::request_parser<http::string_body>> parser_;
  std::function<void(std::uint64_t, beast::string_view, beast::error_code&)> chunk_cb_;
  BodyReservation body_res_;
  bool budget_refused_ = false;
  size_t header_bytes_ = 0;
  http::request<http::string_body> req_;
  std::string endpoint_ = "other", allow_;
  std::string cors_;  // this request's CORS headers (cors_headers), added to every response to it
  bool close_after_ = false, closed_ = false, writing_ = false, linger_ = false, http10_ = false;
  std::vector<char> linger_buf_;
  bool parsing_ = false, watching_ = false, peer_fin_ = false, client_gone_ = false, awaiting_header_ = false;
  std::atomic<int64_t> idle_since_{-1};
  Clock::time_point arrival_;
  std::deque<std::string> outq_;
  std::function<void()> after_flush_;
  std::shared_ptr<GenerationJob> job_;
};

}  // namespace

void start_session(tcp::socket s, Server::Impl& srv) {
  auto session = std::make_shared<Session>(std::move(s), srv);
  session->start(srv.conns.add(session));
}

}  // namespace k3::serve
