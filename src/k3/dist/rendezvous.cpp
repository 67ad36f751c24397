#include "k3/dist/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "k3/core/error.h"

namespace k3::dist {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxMessage = 64 * 1024;  // a hello is ~60 bytes, a payload a few hundred
constexpr const char* kMagic = "k3-rendezvous/1";

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int ms_left(Clock::time_point until) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
  return ms <= 0 ? 0 : static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Sends all of `msg` + '\n' (throws on error or timeout).
void send_line(int fd, const std::string& msg, Clock::time_point until) {
  const std::string line = msg + "\n";
  size_t off = 0;
  while (off < line.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, ms_left(until)) <= 0) throw Error("rendezvous: timed out sending");
    const ssize_t n = ::send(fd, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n <= 0) throw Error(std::string("rendezvous: send failed: ") + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
}

// One message: bytes up to a "\n.\n" terminator line (payloads have several lines), at most kMaxMessage.
std::string recv_message(int fd, Clock::time_point until) {
  std::string buf;
  char chunk[4096];
  for (;;) {
    const size_t end = buf.find("\n.\n");
    if (end != std::string::npos) return buf.substr(0, end);
    if (buf.size() > kMaxMessage) throw Error("rendezvous: a message over 64 KiB");
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1, ms_left(until));
    if (r == 0) throw Error("rendezvous: timed out waiting for the other side");
    if (r < 0) throw Error(std::string("rendezvous: poll failed: ") + std::strerror(errno));
    const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n == 0) throw Error("rendezvous: the other side closed the connection");
    if (n < 0) throw Error(std::string("rendezvous: receive failed: ") + std::strerror(errno));
    buf.append(chunk, static_cast<size_t>(n));
  }
}

void send_message(int fd, const std::string& body, Clock::time_point until) { send_line(fd, body + "\n.", until); }

// "key=value" lines -> map (the first line is the kind).
std::map<std::string, std::string> fields(const std::string& msg) {
  std::map<std::string, std::string> out;
  std::istringstream in(msg);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

addrinfo* resolve(const RendezvousOptions& o, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.master_port);
  const int rc = ::getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) throw Error("--master-addr '" + o.master_addr + "': " + ::gai_strerror(rc));
  return res;
}

std::string where(const RendezvousOptions& o) { return o.master_addr + ":" + std::to_string(o.master_port); }

std::string hello(const RendezvousOptions& o) {
  return std::string(kMagic) + "\nnnodes=" + std::to_string(o.nnodes) + "\nnode_rank=" + std::to_string(o.node_rank) +
         "\nranks_per_node=" + std::to_string(o.ranks_per_node);
}

// Why node 0 refuses `h` ("" when it fits). `seen` holds the node ranks that joined already.
std::string refusal(const RendezvousOptions& o, const std::map<std::string, std::string>& h,
                    const std::vector<bool>& seen) {
  auto num = [&](const char* k) -> long {
    const auto it = h.find(k);
    if (it == h.end()) return -1;
    char* end = nullptr;
    const long v = std::strtol(it->second.c_str(), &end, 10);
    return (end != it->second.c_str() && *end == '\0') ? v : -1;
  };
  const long nn = num("nnodes"), nr = num("node_rank"), rpn = num("ranks_per_node");
  if (nn != o.nnodes)
    return "node " + std::to_string(nr) + " has --nnodes " + std::to_string(nn) + " but the master (node 0) has --nnodes " +
           std::to_string(o.nnodes);
  if (rpn != o.ranks_per_node)
    return "node " + std::to_string(nr) + " runs " + std::to_string(rpn) + " rank(s) but node 0 runs " +
           std::to_string(o.ranks_per_node) + " (--tensor-parallel-size must be the same on every node)";
  if (nr < 1 || nr >= o.nnodes) return "--node-rank " + std::to_string(nr) + " is not one of 1.." + std::to_string(o.nnodes - 1);
  if (seen[static_cast<size_t>(nr)]) return "two nodes say --node-rank " + std::to_string(nr);
  return "";
}

}  // namespace

void validate(const RendezvousOptions& o) {
  if (o.nnodes < 1 || o.nnodes > 4096) throw Error("--nnodes: expected 1..4096, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw Error("--node-rank: expected 0.." + std::to_string(o.nnodes - 1) + " (--nnodes " + std::to_string(o.nnodes) +
                "), got " + std::to_string(o.node_rank));
  if (o.master_port < 1 || o.master_port > 65535)
    throw Error("--master-port: expected 1..65535, got " + std::to_string(o.master_port));
  if (o.master_addr.empty()) throw Error("--master-addr must not be empty");
}

double rendezvous_timeout(const RendezvousOptions& o) {
  if (const char* s = std::getenv("K3_RENDEZVOUS_TIMEOUT"); s && *s) {
    char* end = nullptr;
    const double v = std::strtod(s, &end);
    if (end != s && *end == '\0' && v > 0 && v <= 86400) return v;
    throw Error(std::string("$K3_RENDEZVOUS_TIMEOUT: expected seconds in (0, 86400], got '") + s + "'");
  }
  return o.timeout_s;
}

void serve_rendezvous(const RendezvousOptions& o, const std::string& payload) {
  validate(o);
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(rendezvous_timeout(o) * 1000));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> ai(resolve(o, true), ::freeaddrinfo);
  Fd listener(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
  if (listener.fd < 0) throw Error(std::string("rendezvous: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener.fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(listener.fd, 64) != 0)
    throw Error("rendezvous: cannot listen on " + where(o) + ": " + std::strerror(errno));
  std::vector<Fd> nodes(static_cast<size_t>(o.nnodes));
  std::vector<bool> seen(static_cast<size_t>(o.nnodes), false);
  int joined = 1;
  while (joined < o.nnodes) {
    pollfd p{listener.fd, POLLIN, 0};
    const int r = ::poll(&p, 1, ms_left(until));
    if (r == 0) {
      std::string missing;
      for (int i = 1; i < o.nnodes; ++i)
        if (!seen[static_cast<size_t>(i)]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
      const std::string why = "only " + std::to_string(joined) + " of " + std::to_string(o.nnodes) + " nodes joined on " +
                              where(o) + " within " + std::to_string(static_cast<int>(rendezvous_timeout(o))) +
                              " s (missing node rank(s) " + missing + ")";
      for (Fd& n : nodes)
        if (n.fd >= 0) try { send_message(n.fd, "error\nwhy=" + why, Clock::now() + std::chrono::seconds(2)); } catch (const Error&) {}
      throw Error("rendezvous: " + why);
    }
    if (r < 0) throw Error(std::string("rendezvous: poll: ") + std::strerror(errno));
    Fd c(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (c.fd < 0) continue;
    std::map<std::string, std::string> h;
    std::string why;
    try {
      const std::string msg = recv_message(c.fd, std::min(until, Clock::now() + std::chrono::seconds(10)));
      if (msg.rfind(kMagic, 0) != 0) continue;  // not a k3 node: ignore it
      h = fields(msg);
      why = refusal(o, h, seen);
    } catch (const Error&) {
      continue;  // a connection that says nothing (a port scan) does not end the rendezvous
    }
    if (!why.empty()) {
      try { send_message(c.fd, "error\nwhy=" + why, Clock::now() + std::chrono::seconds(2)); } catch (const Error&) {}
      for (Fd& n : nodes)
        if (n.fd >= 0) try { send_message(n.fd, "error\nwhy=" + why, Clock::now() + std::chrono::seconds(2)); } catch (const Error&) {}
      throw Error("rendezvous: " + why);
    }
    const int nr = std::atoi(h["node_rank"].c_str());
    seen[static_cast<size_t>(nr)] = true;
    nodes[static_cast<size_t>(nr)] = std::move(c);
    ++joined;
  }
  for (int i = 1; i < o.nnodes; ++i) send_message(nodes[static_cast<size_t>(i)].fd, "ok\n" + payload, until);
}

std::string join_rendezvous(const RendezvousOptions& o) {
  validate(o);
  const double timeout = rendezvous_timeout(o);
  const auto until = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
  std::string last = "nobody answered";
  for (;;) {
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> ai(resolve(o, false), ::freeaddrinfo);
    Fd c(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (c.fd < 0) throw Error(std::string("rendezvous: socket: ") + std::strerror(errno));
    if (::connect(c.fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      std::string msg;
      try {
        send_message(c.fd, hello(o), until);
        msg = recv_message(c.fd, until);
      } catch (const Error& e) {
        throw Error("rendezvous with the master at " + where(o) + " failed: " + e.what());
      }
      if (msg.rfind("ok\n", 0) == 0) return msg.substr(3);
      const auto f = fields(msg);
      const auto why = f.find("why");
      throw Error("the master at " + where(o) + " refused this node: " + (why != f.end() ? why->second : msg));
    }
    last = std::strerror(errno);
    if (Clock::now() >= until)
      throw Error("cannot reach the master (node 0) at " + where(o) + " within " + std::to_string(static_cast<int>(timeout)) +
                  " s: " + last + " (is node 0 started, with this --master-addr and --master-port?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

}  // namespace k3::dist
