// Internals shared by server.cpp (listening, accept loop, lifecycle) and session.cpp (one connection).
#pragma once
#include <atomic>
#include <boost/asio.hpp>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "k3/serve/server.h"
#include "k3/serve/work_pool.h"

namespace k3::serve {

namespace net = boost::asio;
using tcp = net::ip::tcp;

// Bytes of request bodies being received or parsed, summed over all connections (issue 11: 100
// connections each sending part of an 8 MB body held 800 MB). Content-Length bodies reserve their
// length up front, chunked ones chunk by chunk.
class BodyBudget {
 public:
  BodyBudget(int64_t cap, Metrics& metrics) : cap_(cap), metrics_(metrics) {}
  bool try_reserve(uint64_t n);
  void release(uint64_t n);

 private:
  const int64_t cap_;
  Metrics& metrics_;
  std::atomic<int64_t> used_{0};
};

// A share of the budget, released when destroyed (move-only).
class BodyReservation {
 public:
  BodyReservation() = default;
  explicit BodyReservation(BodyBudget& b) : budget_(&b) {}
  BodyReservation(BodyReservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.bytes_ = 0; }
  BodyReservation& operator=(BodyReservation&& o) noexcept;
  ~BodyReservation() { reset(); }
  bool grow(uint64_t n);  // false (nothing reserved) when the budget has not n bytes left
  void reset();

 private:
  BodyBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

// What the connection registry needs of a connection.
class Connection {
 public:
  virtual ~Connection() = default;
  // Steady-clock nanoseconds since the connection has been waiting for a request with nothing owed to
  // it (a fresh or keep-alive connection, or one still sending headers); -1 while busy.
  virtual int64_t idle_since() const = 0;
  // Close it if it is still idle (asynchronously, on its strand). False if it was not idle.
  virtual bool shed() = 0;
};

// The open connections: their number (--max-connections) and the oldest idle one to shed.
class ConnRegistry {
 public:
  using Handle = std::list<std::weak_ptr<Connection>>::iterator;
  explicit ConnRegistry(Metrics& m) : metrics_(m) {}
  Handle add(std::weak_ptr<Connection> c);
  void remove(Handle h);
  int64_t size() const;
  bool shed_oldest_idle();  // true when one was asked to close

 private:
  Metrics& metrics_;
  mutable std::mutex mu_;
  std::list<std::weak_ptr<Connection>> conns_;
  int64_t n_ = 0;
};

struct Server::Impl {
  ServerOptions opt;
  engine::Engine& engine;
  ApiContext ctx;
  Metrics& metrics;
  // Destroyed after ioc (whose pending handlers own sessions, which use these when destroyed).
  BodyBudget body_budget;
  ConnRegistry conns;
  net::io_context ioc;
  net::strand<net::io_context::executor_type> accept_strand{net::make_strand(ioc)};
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::signal_set> signals;  // SIGINT / SIGTERM, from catch_signals() on
  net::steady_timer accept_timer{accept_strand};
  int reserve_fd = -1;  // kept open to be closed when descriptors run out (see on_fd_exhausted)
  int64_t max_connections = 0;
  WorkPool parse_pool;  // destroyed first: its queued tasks own sessions
  std::vector<std::thread> threads;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> inflight{0};     // engine requests admitted (reserved) and not finished
  std::atomic<int64_t> active_jobs{0};  // generation requests whose response is not fully written
  std::mutex shutdown_mu;
  bool shut_down = false;
  int64_t created = 0;
  uint16_t bound_port = 0;

  Impl(ServerOptions o, engine::Engine& e, ApiContext c, Metrics& m);
  void do_accept();
  void admit(tcp::socket s);
  void on_fd_exhausted();
  // Atomically reserves n engine requests of the max_num_seqs + max_waiting capacity (issue 11: a
  // check-then-increment admitted 129 requests against a cap of 128).
  bool reserve_inflight(int64_t n);
};

// Starts serving one accepted connection (session.cpp).
void start_session(tcp::socket s, Server::Impl& srv);
// Writes a short 503 (Retry-After: 1, Connection: close) to a socket without blocking, then closes it.
void refuse_connection(int fd, const char* why);

}  // namespace k3::serve
