#include "k3/bench/client.h"

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "k3/core/error.h"

namespace k3::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

Url parse_url(const std::string& s) {
  std::string rest = s;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  else if (rest.find("://") != std::string::npos) throw Error("--base-url: only http:// is supported, got '" + s + "'");
  Url u;
  const auto slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  if (slash != std::string::npos) u.path = rest.substr(slash);
  while (!u.path.empty() && u.path.back() == '/') u.path.pop_back();
  if (!hostport.empty() && hostport[0] == '[') {  // [v6]:port
    const auto rb = hostport.find(']');
    if (rb == std::string::npos) throw Error("--base-url: bad IPv6 host in '" + s + "'");
    u.host = hostport.substr(1, rb - 1);
    if (rb + 1 < hostport.size() && hostport[rb + 1] == ':') u.port = hostport.substr(rb + 2);
  } else {
    const auto c = hostport.rfind(':');
    u.host = hostport.substr(0, c);
    if (c != std::string::npos) u.port = hostport.substr(c + 1);
  }
  if (u.host.empty()) throw Error("--base-url: no host in '" + s + "'");
  return u;
}

bool is_chat_endpoint(const std::string& e) { return e.find("chat/completions") != std::string::npos; }

std::string request_body(const ClientOptions& o, const BenchRequest& r) {
  nlohmann::json j;
  j["model"] = o.model;
  if (is_chat_endpoint(o.endpoint)) {
    j["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt_text}}});
    j["max_completion_tokens"] = r.output_len;
  } else {
    if (o.token_id_prompts && !r.prompt_ids.empty()) j["prompt"] = r.prompt_ids;
    else j["prompt"] = r.prompt_text;
    j["max_tokens"] = r.output_len;
  }
  j["temperature"] = o.temperature;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (o.ignore_eos) j["ignore_eos"] = true;
  return j.dump();
}

// ---------------------------------------------------------------------------------------------
// Load generator

namespace {

struct Runner;

struct Session : std::enable_shared_from_this<Session> {
  Runner& R;
  size_t idx;
  std::unique_ptr<beast::tcp_stream> stream;
  bool reused = false, got_bytes = false, saw_done = false;
  beast::flat_buffer buf;
  std::optional<http::response_parser<http::string_body>> parser;
  size_t scanned = 0;
  Clock::time_point st, last;
  bool first = true, have_usage = false;
  RequestOutcome out;

  Session(Runner& r, size_t i) : R(r), idx(i) {}
  void start();
  void connect();
  void send();
  void read();
  void on_read(beast::error_code ec, Clock::time_point now);
  void scan(Clock::time_point now);
  void finish(bool ok, const std::string& err);
};

struct Runner {
  const ClientOptions& o;
  const std::vector<BenchRequest>& reqs;
  const std::vector<double>& arrivals;
  int64_t max_conc;
  std::function<void(size_t)> on_done;
  asio::io_context ioc{1};
  tcp::resolver::results_type endpoints;
  std::vector<std::string> bodies;
  std::string target, host_header;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle;
  asio::steady_timer timer{ioc};
  size_t next_arrival = 0, done = 0;
  int64_t inflight = 0;
  std::deque<size_t> pending;
  Clock::time_point t0, t_end;
  LoadResult res;

  Runner(const ClientOptions& opt, const std::vector<BenchRequest>& r, const std::vector<double>& a, int64_t mc,
         std::function<void(size_t)> cb)
      : o(opt), reqs(r), arrivals(a), max_conc(mc), on_done(std::move(cb)) {}

  void schedule_arrivals() {
    const double now = std::chrono::duration<double>(Clock::now() - t0).count();
    while (next_arrival < reqs.size() && arrivals[next_arrival] <= now) pending.push_back(next_arrival++);
    launch();
    if (next_arrival < reqs.size()) {
      timer.expires_at(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(arrivals[next_arrival])));
      timer.async_wait([this](beast::error_code ec) {
        if (!ec) schedule_arrivals();
      });
    }
  }
  void launch() {
    while (!pending.empty() && (max_conc <= 0 || inflight < max_conc)) {
      const size_t i = pending.front();
      pending.pop_front();
      ++inflight;
      std::make_shared<Session>(*this, i)->start();
    }
  }
  void complete(size_t i, RequestOutcome out) {
    res.outcomes[i] = std::move(out);
    --inflight;
    ++done;
    if (on_done) on_done(done);
    if (done == reqs.size()) {
      t_end = Clock::now();
      timer.cancel();
      idle.clear();
      return;
    }
    launch();
  }
};

void Session::start() {
  if (!R.idle.empty()) {
    stream = std::move(R.idle.back());
    R.idle.pop_back();
    reused = true;
    send();
  } else {
    connect();
  }
}

void Session::connect() {
  reused = false;
  stream = std::make_unique<beast::tcp_stream>(R.ioc);
  ++R.res.connections_opened;
  stream->expires_after(std::chrono::seconds(30));
  stream->async_connect(R.endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
    if (ec) return self->finish(false, "connect: " + ec.message());
    beast::error_code ig;
    self->stream->socket().set_option(tcp::no_delay(true), ig);
    self->send();
  });
}

void Session::send() {
  // The request is serialised into a string we own (keep-alive, HTTP/1.1).
  auto msg = std::make_shared<std::string>();
  const std::string& body = R.bodies[idx];
  msg->reserve(body.size() + 256);
  *msg += "POST " + R.target + " HTTP/1.1\r\nHost: " + R.host_header +
          "\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\nUser-Agent: k3-bench\r\n";
  if (!R.o.api_key.empty()) *msg += "Authorization: Bearer " + R.o.api_key + "\r\n";
  *msg += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  *msg += body;
  parser.emplace();
  parser->body_limit(boost::none);
  parser->header_limit(64 * 1024);
  buf.clear();
  scanned = 0;
  got_bytes = false;
  st = Clock::now();
  stream->expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(R.o.timeout_s)));
  asio::async_write(*stream, asio::buffer(*msg), [self = shared_from_this(), msg](beast::error_code ec, size_t) {
    if (ec) {
      if (self->reused) return self->connect();  // a stale keep-alive connection: retry on a fresh one
      return self->finish(false, "write: " + ec.message());
    }
    self->read();
  });
}

void Session::read() {
  stream->expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(R.o.timeout_s)));
  http::async_read_some(*stream, buf, *parser, [self = shared_from_this()](beast::error_code ec, size_t n) {
    if (n > 0) self->got_bytes = true;
    self->on_read(ec, Clock::now());
  });
}

void Session::on_read(beast::error_code ec, Clock::time_point now) {
  if (ec == http::error::need_buffer) ec = {};
  if (ec) {
    if (reused && !got_bytes && !parser->is_header_done()) return connect();
    return finish(false, "read: " + ec.message());
  }
  if (parser->is_header_done() && parser->get().result() == http::status::ok) scan(now);
  if (!out.error.empty()) return finish(false, out.error);
  if (parser->is_done()) {
    const auto status = parser->get().result_int();
    if (status != 200) {
      std::string b = parser->get().body().substr(0, 300);
      return finish(false, "HTTP " + std::to_string(status) + ": " + b);
    }
    return finish(true, "");
  }
  read();
}

// Consumes the complete SSE events in the body received so far.
void Session::scan(Clock::time_point now) {
  std::string& body = parser->get().body();
  size_t pos = 0;
  for (;;) {
    size_t end = body.find("\n\n", pos);
    size_t sep = 2;
    const size_t crlf = body.find("\r\n\r\n", pos);
    if (crlf != std::string::npos && (end == std::string::npos || crlf < end)) end = crlf, sep = 4;
    if (end == std::string::npos) break;
    std::string_view ev(body.data() + pos, end - pos);
    pos = end + sep;
    // An event: lines; we use the data: lines (one per event in practice).
    size_t ls = 0;
    while (ls <= ev.size()) {
      size_t le = ev.find('\n', ls);
      if (le == std::string_view::npos) le = ev.size();
      std::string_view line = ev.substr(ls, le - ls);
      ls = le + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.rfind("data:", 0) != 0) continue;
      line.remove_prefix(5);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      if (line == "[DONE]") {
        saw_done = true;
        continue;
      }
      auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
      if (j.is_discarded() || !j.is_object()) {
        out.error = "invalid JSON in the stream";
        return;
      }
      if (j.contains("error")) {
        out.error = "stream error: " + j["error"].dump().substr(0, 300);
        return;
      }
      auto c = j.find("choices");
      if (c != j.end() && c->is_array() && !c->empty()) {
        if (first) {
          first = false;
          out.ttft = std::chrono::duration<double>(now - st).count();
        } else {
          out.itl.push_back(std::chrono::duration<double>(now - last).count());
        }
        last = now;
        ++out.chunks;
      }
      auto u = j.find("usage");
      if (u != j.end() && u->is_object()) {
        have_usage = true;
        out.prompt_tokens = u->value("prompt_tokens", int64_t{0});
        out.output_tokens = u->value("completion_tokens", int64_t{0});
      }
    }
  }
  body.erase(0, pos);
}

void Session::finish(bool ok, const std::string& err) {
  out.success = ok;
  out.error = err;
  if (ok) {
    if (first) {
      out.success = false;
      out.error = "no chunk with choices in the stream";
    } else {
      out.e2e = std::chrono::duration<double>(last - st).count();
      if (!have_usage) {
        R.res.usage_missing = true;
        out.output_tokens = out.chunks;
      }
    }
  }
  if (ok && parser->keep_alive() && stream) {
    stream->expires_never();
    R.idle.push_back(std::move(stream));
  } else if (stream) {
    beast::error_code ig;
    stream->socket().shutdown(tcp::socket::shutdown_both, ig);
    stream->close();
  }
  R.complete(idx, std::move(out));
}

}  // namespace

LoadResult run_load(const ClientOptions& o, const std::vector<BenchRequest>& reqs, const std::vector<double>& arrivals,
                    int64_t max_concurrency, const std::function<void(size_t)>& on_done) {
  if (arrivals.size() != reqs.size()) throw Error("run_load: arrivals and requests differ in size");
  Runner R(o, reqs, arrivals, max_concurrency, on_done);
  R.res.outcomes.resize(reqs.size());
  if (reqs.empty()) return R.res;
  tcp::resolver res(R.ioc);
  beast::error_code ec;
  R.endpoints = res.resolve(o.url.host, o.url.port, ec);
  if (ec) throw Error("cannot resolve '" + o.url.host + ":" + o.url.port + "': " + ec.message());
  R.target = o.url.path + o.endpoint;
  R.host_header = o.url.host + ":" + o.url.port;
  R.bodies.reserve(reqs.size());
  for (const auto& r : reqs) R.bodies.push_back(request_body(o, r));
  R.t0 = Clock::now();
  asio::post(R.ioc, [&R] { R.schedule_arrivals(); });
  R.ioc.run();
  R.res.duration_s = std::chrono::duration<double>(R.t_end - R.t0).count();
  return std::move(R.res);
}

std::string http_get(const Url& base, const std::string& path, int* status, double timeout_s, const std::string& api_key) {
  asio::io_context ioc;
  tcp::resolver res(ioc);
  beast::tcp_stream s(ioc);
  beast::error_code ec;
  auto eps = res.resolve(base.host, base.port, ec);
  if (ec) throw Error("cannot resolve '" + base.host + "': " + ec.message());
  s.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
  s.connect(eps, ec);
  if (ec) throw Error("GET " + path + ": connect: " + ec.message());
  http::request<http::empty_body> req{http::verb::get, base.path + path, 11};
  req.set(http::field::host, base.host + ":" + base.port);
  req.set(http::field::user_agent, "k3-bench");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  http::write(s, req, ec);
  if (ec) throw Error("GET " + path + ": write: " + ec.message());
  beast::flat_buffer b;
  http::response_parser<http::string_body> p;
  p.body_limit(64u << 20);
  http::read(s, b, p, ec);
  if (ec) throw Error("GET " + path + ": read: " + ec.message());
  if (status) *status = p.get().result_int();
  s.socket().shutdown(tcp::socket::shutdown_both, ec);
  return p.get().body();
}

std::optional<double> prometheus_value(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  std::optional<double> sum;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    if (line.rfind(name, 0) != 0) continue;
    const char next = line.size() > name.size() ? line[name.size()] : '\0';
    if (next != ' ' && next != '{') continue;
    size_t vpos = line.rfind(' ');  // the value is last; a label value may hold spaces or braces
    if (vpos == std::string::npos) continue;
    try {
      sum = sum.value_or(0) + std::stod(line.substr(vpos + 1));
    } catch (...) {
    }
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------
// Mock server

struct MockServer::Impl {
  asio::io_context ioc;
  tcp::acceptor acc{ioc};
  std::vector<std::thread> threads;
  std::atomic<int64_t> requests{0};
  bool stopped = false;
  uint16_t port = 0;

  struct Conn : std::enable_shared_from_this<Conn> {
    Impl& I;
    beast::tcp_stream s;
    beast::flat_buffer buf;
    http::request<http::string_body> req;
    std::vector<std::string> events;  // chunk-framed SSE events to write, in order
    size_t next = 0;
    bool keep = true;
    Conn(Impl& i, tcp::socket sock) : I(i), s(std::move(sock)) {}

    void read() {
      req = {};
      http::async_read(s, buf, req, [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->respond();
      });
    }
    static std::string framed(const std::string& payload) {
      char hex[32];
      std::snprintf(hex, sizeof hex, "%zx\r\n", payload.size());
      return hex + payload + "\r\n";
    }
    void respond() {
      ++I.requests;
      keep = req.keep_alive();
      const bool chat = req.target().find("chat") != beast::string_view::npos;
      int64_t n = 16;
      auto j = nlohmann::json::parse(req.body(), nullptr, false);
      if (j.is_object()) {
        if (j.contains("max_completion_tokens") && j["max_completion_tokens"].is_number_integer())
          n = j["max_completion_tokens"].get<int64_t>();
        else if (j.contains("max_tokens") && j["max_tokens"].is_number_integer())
          n = j["max_tokens"].get<int64_t>();
      }
      int64_t prompt = 0;
      if (j.is_object() && j.contains("prompt") && j["prompt"].is_array()) prompt = static_cast<int64_t>(j["prompt"].size());
      events.clear();
      next = 0;
      events.push_back(
          "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n" +
          std::string(keep ? "" : "Connection: close\r\n") + "\r\n");
      for (int64_t i = 0; i < n; ++i) {
        const char* fr = i + 1 == n ? "\"length\"" : "null";
        std::string p = chat ? std::string("data: {\"id\":\"chatcmpl-mock\",\"object\":\"chat.completion.chunk\",\"created\":0,"
                                           "\"model\":\"mock\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},"
                                           "\"logprobs\":null,\"finish_reason\":") +
                                   fr + "}],\"usage\":null}\n\n"
                             : std::string("data: {\"id\":\"cmpl-mock\",\"object\":\"text_completion\",\"created\":0,"
                                           "\"model\":\"mock\",\"choices\":[{\"index\":0,\"text\":\" tok\",\"logprobs\":null,"
                                           "\"finish_reason\":") +
                                   fr + "}],\"usage\":null}\n\n";
        events.push_back(framed(p));
      }
      events.push_back(framed("data: {\"id\":\"cmpl-mock\",\"object\":\"text_completion\",\"created\":0,\"model\":\"mock\","
                              "\"choices\":[],\"usage\":{\"prompt_tokens\":" +
                              std::to_string(prompt) + ",\"completion_tokens\":" + std::to_string(n) +
                              ",\"total_tokens\":" + std::to_string(prompt + n) + "}}\n\n"));
      events.push_back(framed("data: [DONE]\n\n") + "0\r\n\r\n");
      write();
    }
    void write() {
      if (next == events.size()) {
        if (!keep) return close();
        return read();
      }
      asio::async_write(s, asio::buffer(events[next]), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        ++self->next;
        self->write();
      });
    }
    void close() {
      beast::error_code ig;
      s.socket().shutdown(tcp::socket::shutdown_both, ig);
    }
  };

  void accept() {
    acc.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket sock) {
      if (ec) return;
      beast::error_code ig;
      sock.set_option(tcp::no_delay(true), ig);
      std::make_shared<Conn>(*this, std::move(sock))->read();
      accept();
    });
  }
};

MockServer::MockServer(int threads) : impl_(std::make_unique<Impl>()) {
  auto& I = *impl_;
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
  I.acc.open(ep.protocol());
  I.acc.set_option(asio::socket_base::reuse_address(true));
  I.acc.bind(ep);
  I.acc.listen(asio::socket_base::max_listen_connections);
  I.port = I.acc.local_endpoint().port();
  I.accept();
  for (int i = 0; i < std::max(1, threads); ++i) I.threads.emplace_back([&I] { I.ioc.run(); });
}

MockServer::~MockServer() { stop(); }

uint16_t MockServer::port() const { return impl_->port; }
int64_t MockServer::requests() const { return impl_->requests.load(); }

void MockServer::stop() {
  auto& I = *impl_;
  if (I.stopped) return;
  I.stopped = true;
  I.ioc.stop();
  for (auto& t : I.threads) t.join();
}

}  // namespace k3::bench
