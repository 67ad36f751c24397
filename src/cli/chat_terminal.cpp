#include "cli/chat_terminal.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "k3/core/error.h"

namespace k3cli {

namespace {
std::atomic<bool> g_interrupted{false};
struct sigaction g_old_sigint;

void on_sigint(int) { g_interrupted.store(true); }
}  // namespace

ChatTerminal::ChatTerminal() {
  interactive_ = ::isatty(STDIN_FILENO) && ::isatty(STDOUT_FILENO);
  const char* no_color = std::getenv("NO_COLOR");  // no-color.org: any non-empty value
  const char* term = std::getenv("TERM");
  color_ = ::isatty(STDOUT_FILENO) && !(no_color && *no_color) && !(term && std::strcmp(term, "dumb") == 0);
  struct sigaction sa {};
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: a read at the prompt returns EINTR, so Ctrl-C is seen at once
  ::sigaction(SIGINT, &sa, &g_old_sigint);
}

ChatTerminal::~ChatTerminal() { ::sigaction(SIGINT, &g_old_sigint, nullptr); }

bool ChatTerminal::take_interrupt() { return g_interrupted.exchange(false); }

ChatTerminal::Read ChatTerminal::read_line(std::string& line) {
  line.clear();
  for (;;) {
    if (const size_t nl = pending_.find('\n'); nl != std::string::npos) {
      line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      return Read::Line;
    }
    if (eof_) {  // a last line without a newline still counts
      if (pending_.empty()) return Read::Eof;
      line.swap(pending_);
      return Read::Line;
    }
    if (take_interrupt()) {
      pending_.clear();  // the terminal discards the typed line on Ctrl-C too
      return Read::Interrupted;
    }
    if (pending_.size() > kMaxLineBytes)
      throw k3::Error("k3 chat: an input line is longer than " + std::to_string(kMaxLineBytes >> 20) + " MiB");
    // Wait in short polls, not in read(): a Ctrl-C landing between the check above and a blocking read
    // would otherwise go unseen until the next key.
    pollfd p{STDIN_FILENO, POLLIN, 0};
    if (const int r = ::poll(&p, 1, 100); r == 0 || (r < 0 && errno == EINTR)) continue;
    char buf[4096];
    const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
    if (n > 0) {
      pending_.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      eof_ = true;
    } else if (errno != EINTR) {
      throw k3::Error(std::string("k3 chat: cannot read stdin: ") + std::strerror(errno));
    }
  }
}

std::string ChatTerminal::styled(const char* sgr, const std::string& text) const {
  if (!color_ || text.empty()) return text;
  return std::string("\033[") + sgr + "m" + text + "\033[0m";
}

}  // namespace k3cli
