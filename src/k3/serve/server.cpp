#include "k3/serve/server.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "k3/core/error.h"

namespace k3::serve {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
double secs(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
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
}  // namespace

struct Server::Impl {
  ServerOptions opt;
  engine::Engine& engine;
  ApiContext ctx;
  Metrics& metrics;
  net::io_context ioc;  // declared before everything that handlers may reference
  std::optional<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> inflight{0};     // engine requests submitted and not finished
  std::atomic<int64_t> active_jobs{0};  // generation requests whose response is not fully written
  std::mutex shutdown_mu;
  bool shut_down = false;
  int64_t created = unix_now();
  uint16_t bound_port = 0;

  Impl(ServerOptions o, engine::Engine& e, ApiContext c, Metrics& m)
      : opt(std::move(o)), engine(e), ctx(std::move(c)), metrics(m) {}
  void do_accept();
};

namespace {

// One generation request (n engine requests).
struct Job {
  GenRequest req;
  std::string id;
  int64_t created = 0;
  std::vector<std::string> engine_ids;
  std::vector<ChoiceState> choices;
  std::vector<std::unique_ptr<ChatOutputParser>> parsers;
  std::vector<bool> first_sent;
  std::vector<Clock::time_point> last_token;
  int remaining = 0;
  Usage usage;
  Clock::time_point arrival;
  bool any_token = false;
  std::string error;      // engine error or submit failure (non-stream: answered as an error)
  int error_status = 500;
  bool complete = false;  // all choices finished and the final bytes queued
  bool stream_started = false;  // SSE headers sent
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& s, Server::Impl& srv)
      : stream_(std::move(s)), srv_(srv), write_timer_(stream_.get_executor()) {}

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->do_read(); });
  }

  // Engine thread -> strand.
  void post_output(int index, const engine::RequestOutput& o) {
    net::post(stream_.get_executor(), [self = shared_from_this(), index, o] { self->on_output(index, o); });
  }

 private:
  // ---- reading requests --------------------------------------------------------------------------
  void do_read() {
    if (closed_) return;
    parser_.emplace();
    parser_->body_limit(srv_.opt.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(dur(srv_.opt.read_timeout_s));
    http::async_read(stream_, buf_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::operation_aborted ||
        ec == net::error::connection_reset || ec == net::error::eof) {
      return close();
    }
    if (ec == http::error::body_limit) {
      close_after_ = linger_ = true;
      return send_error("other", ApiError(413, "the request body is larger than the limit of " +
                                                   std::to_string(srv_.opt.max_body_bytes) + " bytes",
                                          "", "invalid_request_error", "request_too_large"));
    }
    if (ec == http::error::header_limit) {
      close_after_ = linger_ = true;
      return send_error("other", ApiError(431, "the request headers are too large"));
    }
    if (ec) {
      close_after_ = linger_ = true;
      return send_error("other", ApiError(400, std::string("malformed HTTP request: ") + ec.message()));
    }
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
  }

  // ---- routing -----------------------------------------------------------------------------------
  void handle() {
    std::string path(req_.target());
    if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
    const auto method = req_.method();
    auto only = [&](http::verb v, const char* allow) {
      if (method != v) {
        allow_ = allow;
        throw ApiError(405, "method " + std::string(req_.method_string()) + " is not allowed for " + path, "",
                       "invalid_request_error", "method_not_allowed");
      }
    };
    if (path == "/health") {
      endpoint_ = "/health";
      only(http::verb::get, "GET");
      if (srv_.draining) throw ApiError(503, "the server is shutting down", "", "server_error");
      return send_response(200, "{\"status\":\"ok\"}", "application/json");
    }
    if (path == "/metrics") {
      endpoint_ = "/metrics";
      only(http::verb::get, "GET");
      return send_response(200, srv_.metrics.render(srv_.engine.stats()), "text/plain; version=0.0.4; charset=utf-8");
    }
    if (path == "/v1/models") {
      endpoint_ = "/v1/models";
      only(http::verb::get, "GET");
      check_auth();
      return send_response(200, dump(models_json(srv_.ctx.model_name, srv_.created, srv_.ctx.max_model_len)),
                           "application/json");
    }
    if (path == "/v1/chat/completions" || path == "/v1/completions") {
      endpoint_ = path;
      only(http::verb::post, "POST");
      const int key = check_auth();
      if (srv_.draining) {
        close_after_ = true;
        throw ApiError(503, "the server is shutting down", "", "server_error");
      }
      const json body = parse_json_body(req_.body());
      const Endpoint ep = path == "/v1/chat/completions" ? Endpoint::Chat : Endpoint::Completions;
      GenRequest gr = parse_generation_request(ep, body, srv_.ctx);
      if (key >= 0) gr.cache_salt = "api-key-" + std::to_string(key) + '\x1f' + gr.cache_salt;
      const int64_t cap = srv_.engine.limits().max_num_seqs + srv_.opt.max_waiting;
      if (srv_.inflight.load() + gr.n > cap) {
        throw ApiError(429, "the server is saturated (" + std::to_string(srv_.inflight.load()) +
                                " requests in flight); retry later", "", "rate_limit_error");
      }
      return start_job(std::move(gr));
    }
    endpoint_ = "other";
    throw ApiError(404, "no such endpoint: " + std::string(req_.method_string()) + " " + path, "",
                   "invalid_request_error", "not_found");
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

  // ---- plain responses ---------------------------------------------------------------------------
  std::string head(int status, const std::string& ctype, const std::string& extra, bool chunked, size_t len) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " +
                    std::string(http::obsolete_reason(static_cast<http::status>(status))) + "\r\n";
    h += "Server: k3.cpp\r\nContent-Type: " + ctype + "\r\n";
    if (chunked)
      h += "Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n";
    else
      h += "Content-Length: " + std::to_string(len) + "\r\n";
    h += extra;
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
    if (linger_ && !client_gone_ && !monitor_pending_) return linger();
    if (close_after_ || client_gone_ || srv_.draining) return close();
    if (monitor_pending_) {
      resume_after_monitor_ = true;
      beast::error_code ignore;
      stream_.socket().cancel(ignore);
      return;
    }
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
    write_timer_.cancel();
    beast::error_code ignore;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignore);
    stream_.socket().close(ignore);
  }

  // ---- writes ------------------------------------------------------------------------------------
  void queue_write(std::string bytes) {
    if (client_gone_ || closed_) {
      outq_.clear();
      return;
    }
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

  // ---- disconnect detection while the engine works -----------------------------------------------
  void start_monitor() {
    if (monitor_pending_ || closed_) return;
    monitor_pending_ = true;
    stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_monitor(ec, n);
    });
  }

  void on_monitor(beast::error_code ec, size_t n) {
    monitor_pending_ = false;
    if (resume_after_monitor_) {  // we cancelled it to read the next request
      resume_after_monitor_ = false;
      if (!ec) buf_.commit(n);
      if (!ec || ec == net::error::operation_aborted) return do_read();
      return close();
    }
    if (!ec) {  // a pipelined request: keep it for later; no more monitoring for this one
      buf_.commit(n);
      return;
    }
    on_client_gone();
  }

  void on_client_gone() {
    client_gone_ = true;
    if (job_ && !job_->complete) {
      for (const auto& id : job_->engine_ids) srv_.engine.cancel(id);
    } else if (job_ && job_->complete) {
      end_job();
    } else {
      close();
    }
  }

  // ---- generation --------------------------------------------------------------------------------
  void start_job(GenRequest gr) {
    auto job = std::make_shared<Job>();
    job->req = std::move(gr);
    job->id = new_response_id(job->req.endpoint);
    job->created = unix_now();
    job->arrival = arrival_;
    const int n = job->req.n;
    job->choices.resize(n);
    job->first_sent.assign(n, false);
    job->last_token.assign(n, arrival_);
    if (job->req.endpoint == Endpoint::Chat)
      for (int i = 0; i < n; ++i)
        job->parsers.push_back(srv_.ctx.chat->make_parser(job->req.body, job->id + "-" + std::to_string(i)));
    job_ = job;
    ++srv_.active_jobs;
    start_monitor();

    int submitted = 0;
    for (int i = 0; i < n; ++i) {
      engine::Request r;
      r.id = job->id + "-" + std::to_string(i);
      r.prompt = job->req.prompt;
      r.params = job->req.params;
      if (r.params.seed) r.params.seed = *r.params.seed + static_cast<uint64_t>(i);
      r.top_logprobs = job->req.top_logprobs;
      r.cache_salt = job->req.cache_salt;
      job->engine_ids.push_back(r.id);
      ++job->remaining;
      ++srv_.inflight;
      try {
        srv_.engine.submit(std::move(r), [self = shared_from_this(), i](const engine::RequestOutput& o) {
          self->post_output(i, o);
        });
        ++submitted;
      } catch (const std::exception& e) {
        --job->remaining;
        --srv_.inflight;
        job->engine_ids.pop_back();
        job->error = e.what();
        job->error_status = srv_.draining ? 503 : 400;
        for (const auto& id : job->engine_ids) srv_.engine.cancel(id);
        break;
      }
    }
    if (!job->error.empty()) {
      if (job->remaining == 0) complete_job();
      return;  // the rest completes when the cancelled ones report back
    }
    if (job->req.stream) {
      job->stream_started = true;
      srv_.metrics.count_request(endpoint_, 200);
      if (srv_.draining) close_after_ = true;
      queue_write(head(200, "text/event-stream", "", true, 0));
    }
  }

  void send_event(const json& j) { send_event_raw("data: " + dump(j) + "\n\n"); }
  void send_event_raw(const std::string& data) { queue_write(hex(data.size()) + "\r\n" + data + "\r\n"); }

  void on_output(int i, const engine::RequestOutput& o) {
    auto job = job_;
    if (!job || job->complete) return;
    auto& c = job->choices[i];
    const auto now = Clock::now();
    const bool chat = job->req.endpoint == Endpoint::Chat;

    if (!o.new_token_ids.empty()) {
      if (!job->any_token) {
        job->any_token = true;
        srv_.metrics.observe_ttft(secs(job->arrival, now));
      } else if (c.completion_tokens > 0) {
        srv_.metrics.observe_tpot(secs(job->last_token[i], now) / double(o.new_token_ids.size()));
      }
      job->last_token[i] = now;
    }
    c.completion_tokens = o.completion_tokens;

    ChatDelta delta;
    std::string text;
    if (chat) {
      delta = chat_step(*job->parsers[i], o.pieces, o.finished);
    } else {
      for (const auto& p : o.pieces)
        if (p.special_id < 0) text += p.text;
    }
    if (!job->req.stream)  // a stream sends them at once; only a non-streamed response collects them
      for (const auto& lp : o.logprobs) c.logprobs.push_back(lp);

    if (o.finished) {
      c.finish_reason = o.finish_reason.empty() ? "stop" : o.finish_reason;
      if (!o.error.empty()) job->error = o.error;
      job->usage.prompt_tokens = o.prompt_tokens;  // same prompt for every choice
      job->usage.completion_tokens += o.completion_tokens;
      job->usage.cached_tokens = std::max(job->usage.cached_tokens, o.cached_prompt_tokens);
      --job->remaining;
      --srv_.inflight;
    }

    if (job->stream_started && !client_gone_) {
      std::string fr = o.finished ? openai_finish_reason(c.finish_reason, !c.message.tool_calls.empty() ||
                                                                              !delta.tool_calls.empty())
                                  : std::string();
      const bool first = chat && !job->first_sent[i];
      if (first || !delta.empty() || !text.empty() || !o.logprobs.empty() || o.finished) {
        send_event(build_chunk(job->req.endpoint, job->req, job->id, job->created, i, first, delta, text, o.logprobs,
                               fr, *srv_.ctx.tok, c.text_offset));
        job->first_sent[i] = true;
      }
    }
    if (chat)
      c.message.append(std::move(delta));
    else
      c.text += text;

    if (job->remaining == 0) complete_job();
  }

  void complete_job() {
    auto job = job_;
    job->complete = true;
    const auto now = Clock::now();
    srv_.metrics.observe_e2e(secs(job->arrival, now));
    srv_.metrics.add_tokens(job->usage.prompt_tokens, job->usage.completion_tokens);
    if (client_gone_) return end_job();
    if (job->stream_started) {
      if (!job->error.empty())
        send_event(error_json(ApiError(500, "generation failed: " + job->error, "", "server_error")));
      if (job->req.include_usage)
        send_event(build_usage_chunk(job->req.endpoint, job->req, job->id, job->created, job->usage));
      send_event_raw("data: [DONE]\n\n");
      after_flush_ = [this] { end_job(); };
      queue_write("0\r\n\r\n");
      return;
    }
    if (!job->error.empty()) {
      const int st = job->error_status;
      after_flush_ = nullptr;
      job_.reset();
      --srv_.active_jobs;
      return send_error(endpoint_, ApiError(st, st == 400 ? job->error : "generation failed: " + job->error, "",
                                            st == 400 ? "invalid_request_error" : "server_error"));
    }
    std::string body = build_response_body(job->req.endpoint, job->req, job->id, job->created, job->choices,
                                            job->usage, *srv_.ctx.tok);
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
  net::steady_timer write_timer_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> req_;
  std::string endpoint_ = "other", allow_;
  bool close_after_ = false, closed_ = false, writing_ = false, linger_ = false;
  std::vector<char> linger_buf_;
  bool monitor_pending_ = false, resume_after_monitor_ = false, client_gone_ = false;
  Clock::time_point arrival_;
  std::deque<std::string> outq_;
  std::function<void()> after_flush_;
  std::shared_ptr<Job> job_;
};

}  // namespace

void Server::Impl::do_accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted || !acceptor || !acceptor->is_open()) return;
    if (!ec && !draining) {
      beast::error_code ignore;
      s.set_option(tcp::no_delay(true), ignore);
      std::make_shared<Session>(std::move(s), *this)->start();
    }
    do_accept();
  });
}

Server::Server(ServerOptions opt, engine::Engine& engine, ApiContext ctx, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(opt), engine, std::move(ctx), metrics)) {}

Server::~Server() { shutdown(); }

void Server::start() {
  auto& I = *impl_;
  beast::error_code ec;
  auto addr = net::ip::make_address(I.opt.host, ec);
  if (ec) throw Error("--host: invalid address '" + I.opt.host + "': " + ec.message());
  tcp::endpoint ep(addr, I.opt.port);
  I.acceptor.emplace(I.ioc);
  I.acceptor->open(ep.protocol(), ec);
  if (!ec) I.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) I.acceptor->bind(ep, ec);
  if (!ec) I.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + I.opt.host + ":" + std::to_string(I.opt.port) + ": " + ec.message());
  I.bound_port = I.acceptor->local_endpoint().port();
  I.do_accept();
  const int n = std::max(1, I.opt.threads);
  for (int i = 0; i < n; ++i) I.threads.emplace_back([&I] { I.ioc.run(); });
}

uint16_t Server::port() const { return impl_->bound_port; }

void Server::run_until_signal() {
  std::mutex mu;
  std::condition_variable cv;
  bool got = false;
  net::signal_set signals(impl_->ioc, SIGINT, SIGTERM);
  std::function<void(beast::error_code, int)> on_signal = [&](beast::error_code ec, int sig) {
    if (ec) return;
    std::lock_guard lk(mu);
    if (got) {
      std::fprintf(stderr, "k3 serve: second signal, exiting now\n");
      std::_Exit(1);
    }
    std::fprintf(stderr, "k3 serve: %s received, shutting down (grace %.0f s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                 impl_->opt.shutdown_grace_s);
    got = true;
    cv.notify_all();
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return got; });
  }
  shutdown();
  beast::error_code ignore;
  signals.cancel(ignore);
}

void Server::shutdown() {
  auto& I = *impl_;
  {
    std::lock_guard lk(I.shutdown_mu);
    if (I.shut_down) return;
    I.shut_down = true;
  }
  I.draining = true;
  if (I.acceptor) {
    std::promise<void> done;
    net::post(I.ioc, [&] {
      beast::error_code ignore;
      I.acceptor->close(ignore);
      done.set_value();
    });
    if (!I.threads.empty()) done.get_future().wait();
  }
  auto wait_jobs = [&](double s) {
    const auto until = Clock::now() + dur(s);
    while (I.active_jobs.load() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return I.active_jobs.load() == 0;
  };
  if (!I.threads.empty() && !wait_jobs(I.opt.shutdown_grace_s)) {
    std::fprintf(stderr, "k3 serve: grace period over, aborting %lld request(s)\n", (long long)I.active_jobs.load());
    I.engine.shutdown(false);  // every request gets a final "abort" output; streams end cleanly
    wait_jobs(5.0);
  } else {
    I.engine.shutdown(true);
  }
  I.ioc.stop();
  for (auto& t : I.threads) t.join();
  I.threads.clear();
}

}  // namespace k3::serve
