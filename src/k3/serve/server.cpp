#include "k3/serve/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/beast/core.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <future>

#include "k3/core/error.h"
#include "k3/serve/server_impl.h"

namespace k3::serve {

namespace beast = boost::beast;
using Clock = std::chrono::steady_clock;

// ---- limits ---------------------------------------------------------------------------------------
bool BodyBudget::try_reserve(uint64_t n) {
  if (n > static_cast<uint64_t>(cap_)) return false;
  int64_t cur = used_.load();
  do {
    if (cur + static_cast<int64_t>(n) > cap_) return false;
  } while (!used_.compare_exchange_weak(cur, cur + static_cast<int64_t>(n)));
  metrics_.set_inflight_body_bytes(cur + static_cast<int64_t>(n));
  return true;
}

void BodyBudget::release(uint64_t n) { metrics_.set_inflight_body_bytes(used_ -= static_cast<int64_t>(n)); }

BodyReservation& BodyReservation::operator=(BodyReservation&& o) noexcept {
  if (this != &o) {
    reset();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

bool BodyReservation::grow(uint64_t n) {
  if (!budget_ || !budget_->try_reserve(n)) return false;
  bytes_ += n;
  return true;
}

void BodyReservation::reset() {
  if (budget_ && bytes_) budget_->release(bytes_);
  bytes_ = 0;
}

ConnRegistry::Handle ConnRegistry::add(std::weak_ptr<Connection> c) {
  std::lock_guard lk(mu_);
  metrics_.set_open_connections(++n_);
  return conns_.insert(conns_.end(), std::move(c));
}

void ConnRegistry::remove(Handle h) {
  std::lock_guard lk(mu_);
  conns_.erase(h);
  metrics_.set_open_connections(--n_);
}

int64_t ConnRegistry::size() const {
  std::lock_guard lk(mu_);
  return n_;
}

bool ConnRegistry::shed_oldest_idle() {
  // Linear: at most --max-connections entries, and only when the cap or the descriptor limit is hit.
  // (idle-since snapshot, connection): the live values change under our feet, which std::sort must not see.
  std::vector<std::pair<int64_t, std::shared_ptr<Connection>>> idle;
  {
    std::lock_guard lk(mu_);
    for (auto& w : conns_)
      if (auto c = w.lock())
        if (const int64_t t = c->idle_since(); t >= 0) idle.emplace_back(t, std::move(c));
  }
  std::sort(idle.begin(), idle.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [t, c] : idle)
    if (c->shed()) return true;  // false: it turned busy since
  return false;
}

void refuse_connection(int fd, const char* why) {
  std::string body = std::string("{\"error\":{\"message\":\"") + why + "; retry later\",\"type\":\"server_error\"}}";
  std::string msg = "HTTP/1.1 503 Service Unavailable\r\nServer: k3.cpp\r\nContent-Type: application/json\r\n"
                    "Retry-After: 1\r\nConnection: close\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body;
  (void)!::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  ::shutdown(fd, SHUT_WR);
}

std::string cors_headers(const std::vector<std::string>& allowed, std::string_view origin, bool preflight) {
  if (origin.empty() || allowed.empty()) return "";
  const bool any = std::find(allowed.begin(), allowed.end(), "*") != allowed.end();
  if (!any && std::find(allowed.begin(), allowed.end(), origin) == allowed.end()) return "";
  // Only an allowed origin is echoed (it is one of the configured strings, checked for CR / LF at start-up).
  std::string h = "Access-Control-Allow-Origin: " + (any ? std::string("*") : std::string(origin)) + "\r\nVary: Origin\r\n";
  if (preflight)
    h += "Access-Control-Allow-Methods: GET, POST, OPTIONS\r\nAccess-Control-Allow-Headers: Authorization, Content-Type\r\n"
         "Access-Control-Max-Age: 600\r\n";
  return h;
}

void validate(const ServerOptions& o) {
  for (const std::string& origin : o.allowed_origins)
    if (origin.empty() || origin.size() > 1024 || origin.find_first_of("\r\n\0", 0, 3) != std::string::npos)
      throw Error("--allowed-origins: an origin must be 1..1024 bytes without CR / LF / NUL (e.g. https://example.com or *)");
  auto positive = [](double v, const char* flag) {
    if (!std::isfinite(v) || v <= 0 || v > 86400.0 * 365)
      throw Error(std::string(flag) + ": expected a number of seconds > 0, got " + std::to_string(v));
  };
  positive(o.read_timeout_s, "--timeout");
  positive(o.write_timeout_s, "--write-timeout");
  if (!std::isfinite(o.shutdown_grace_s) || o.shutdown_grace_s < 0 || o.shutdown_grace_s > 86400.0 * 365)
    throw Error("--shutdown-grace: expected a number of seconds >= 0, got " + std::to_string(o.shutdown_grace_s));
  if (o.threads < 1 || o.threads > 64) throw Error("--threads-http: expected 1..64, got " + std::to_string(o.threads));
  if (o.max_body_bytes < 1 || o.max_body_bytes > (size_t{1} << 32))
    throw Error("--max-body-bytes: expected 1..4GiB, got " + std::to_string(o.max_body_bytes));
  if (o.max_waiting < 0 || o.max_waiting > (int64_t{1} << 20))
    throw Error("--max-waiting: expected 0..1048576, got " + std::to_string(o.max_waiting));
  if (o.max_connections < 0 || o.max_connections > (int64_t{1} << 20))
    throw Error("--max-connections: expected 1..1048576 (0: from the descriptor limit), got " +
                std::to_string(o.max_connections));
  if (o.max_inflight_body_bytes != 0 && o.max_inflight_body_bytes < static_cast<int64_t>(o.max_body_bytes))
    throw Error("--max-inflight-body-bytes: must be at least --max-body-bytes (" + std::to_string(o.max_body_bytes) +
                "), got " + std::to_string(o.max_inflight_body_bytes));
}

// ---- accept loop ----------------------------------------------------------------------------------
Server::Impl::Impl(ServerOptions o, engine::Engine& e, ApiContext c, Metrics& m)
    : opt(std::move(o)),
      engine(e),
      ctx(std::move(c)),
      metrics(m),
      body_budget(opt.max_inflight_body_bytes != 0
                      ? opt.max_inflight_body_bytes
                      : std::max<int64_t>(int64_t{128} << 20, 2 * static_cast<int64_t>(opt.max_body_bytes)),
                  m),
      conns(m),
      parse_pool(opt.parse_threads, opt.parse_queue),
      created(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count()) {}

bool Server::Impl::reserve_inflight(int64_t n) {
  const int64_t cap = engine.limits().max_num_seqs + opt.max_waiting;
  int64_t cur = inflight.load();
  do {
    if (cur + n > cap) return false;
  } while (!inflight.compare_exchange_weak(cur, cur + n));
  return true;
}

void Server::Impl::do_accept() {
  acceptor->async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
    if (ec == net::error::operation_aborted || !acceptor || !acceptor->is_open()) return;
    if (ec == net::error::no_descriptors || ec.value() == ENFILE || ec == net::error::no_buffer_space ||
        ec == net::error::no_memory)
      return on_fd_exhausted();
    if (!ec && !draining) admit(std::move(s));
    do_accept();
  });
}

void Server::Impl::admit(tcp::socket s) {
  if (conns.size() >= max_connections && !conns.shed_oldest_idle()) {
    metrics.count_rejection("connection_limit");
    refuse_connection(s.native_handle(), "too many open connections");
    return;  // s closes here
  }
  beast::error_code ignore;
  s.set_option(tcp::no_delay(true), ignore);
  start_session(std::move(s), *this);
}

// accept() failed for want of a descriptor. Retrying at once spins (issue 11: 83% CPU, /health starved):
// the pending connection keeps the listening socket readable. Free a descriptor instead -- an idle
// connection if there is one, else the reserve one, to accept the next connection and refuse it with
// 503 -- and wait a little before accepting again.
void Server::Impl::on_fd_exhausted() {
  metrics.count_rejection("fd_exhausted");
  // Shed a few at once: connections keep arriving while the shed ones close (asynchronously, on their
  // strands), and a full listen backlog drops SYNs -- a client then waits a 1 s retransmission.
  constexpr int kShedBatch = 16;
  int shed = 0;
  while (shed < kShedBatch && conns.shed_oldest_idle()) ++shed;
  auto wait = std::chrono::milliseconds(2);
  if (shed == 0) {
    wait = std::chrono::milliseconds(50);
    if (reserve_fd >= 0) ::close(reserve_fd);
    pollfd p{acceptor->native_handle(), POLLIN, 0};
    if (::poll(&p, 1, 0) > 0) {
      const int fd = ::accept4(acceptor->native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        refuse_connection(fd, "the server is out of file descriptors");
        ::close(fd);
      }
    }
    reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  accept_timer.expires_after(wait);
  accept_timer.async_wait([this](beast::error_code ec) {
    if (!ec && acceptor && acceptor->is_open()) do_accept();
  });
}

// ---- lifecycle ------------------------------------------------------------------------------------
namespace {
// --host as an address literal, else a name resolved once at start-up (`--host localhost`, as vLLM and
// llama-server take); of several addresses the first IPv4 one (what most clients try first for "localhost").
net::ip::address bind_address(const std::string& host) {
  beast::error_code ec;
  const auto literal = net::ip::make_address(host, ec);
  if (!ec) return literal;
  net::io_context ioc;
  tcp::resolver resolver(ioc);
  const auto results = resolver.resolve(host, "", ec);
  if (ec || results.empty()) throw Error("--host: '" + host + "' is neither an address nor a name that resolves" + (ec ? ": " + ec.message() : std::string()));
  for (const auto& r : results)
    if (r.endpoint().address().is_v4()) return r.endpoint().address();
  return results.begin()->endpoint().address();
}
}  // namespace

Server::Server(ServerOptions opt, engine::Engine& engine, ApiContext ctx, Metrics& metrics)
    : impl_((validate(opt), std::make_unique<Impl>(std::move(opt), engine, std::move(ctx), metrics))) {}

Server::~Server() {
  shutdown();
  if (impl_->reserve_fd >= 0) ::close(impl_->reserve_fd);
}

void Server::start() {
  auto& I = *impl_;
  beast::error_code ec;
  const net::ip::address addr = bind_address(I.opt.host);
  I.max_connections = I.opt.max_connections;
  if (I.max_connections == 0) {
    rlimit rl{};
    const int64_t nofile = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                               ? static_cast<int64_t>(rl.rlim_cur) : int64_t{1} << 16;
    I.max_connections = std::clamp<int64_t>(nofile - 64, 8, int64_t{1} << 16);
  }
  I.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  tcp::endpoint ep(addr, I.opt.port);
  I.acceptor.emplace(I.accept_strand);
  I.acceptor->open(ep.protocol(), ec);
  if (!ec) I.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) I.acceptor->bind(ep, ec);
  if (!ec) I.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw Error("cannot listen on " + I.opt.host + ":" + std::to_string(I.opt.port) + ": " + ec.message());
  I.bound_port = I.acceptor->local_endpoint().port();
  net::dispatch(I.accept_strand, [&I] { I.do_accept(); });
  const int n = std::max(1, I.opt.threads);
  for (int i = 0; i < n; ++i) I.threads.emplace_back([&I] { I.ioc.run(); });
}

uint16_t Server::port() const { return impl_->bound_port; }
int64_t Server::max_connections() const { return impl_->max_connections; }

void Server::catch_signals() {
  if (!impl_->signals) impl_->signals.emplace(impl_->ioc, SIGINT, SIGTERM);
}

void Server::run_until_signal() {
  std::mutex mu;
  std::condition_variable cv;
  bool got = false;
  catch_signals();
  net::signal_set& signals = *impl_->signals;
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
    net::post(I.accept_strand, [&] {
      beast::error_code ignore;
      I.acceptor->close(ignore);
      I.accept_timer.cancel();
      done.set_value();
    });
    if (!I.threads.empty()) done.get_future().wait();
  }
  auto wait_jobs = [&](double s) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
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
  I.parse_pool.stop();
  I.ioc.stop();
  for (auto& t : I.threads) t.join();
  I.threads.clear();
}

}  // namespace k3::serve
