#include "k3/dist/peer_watch.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>

namespace k3::dist {

namespace {

// (state, start ticks) from /proc/PID/stat; false when the process does not exist. The command name
// (field 2) may hold spaces and parentheses: the fields after it start after the last ')'.
bool read_stat(int64_t pid, char& state, uint64_t& start) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  rest >> state;  // field 3
  for (int i = 4; i < 22 && rest >> field; ++i) {
  }
  return static_cast<bool>(rest >> start);  // field 22
}

uint64_t hash_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return 0;
  return std::hash<std::string>{}(name);
}

}  // namespace

ProcessId this_process() {
  ProcessId p;
  p.host_hash = hash_host();
  p.pid = ::getpid();
  char state = 0;
  if (!read_stat(p.pid, state, p.start_ticks)) p.start_ticks = 0;
  return p;
}

bool process_alive(const ProcessId& p) {
  char state = 0;
  uint64_t start = 0;
  if (!read_stat(p.pid, state, start)) return false;
  if (state == 'Z' || state == 'X') return false;  // exited, not yet reaped by its parent
  return p.start_ticks == 0 || start == p.start_ticks;
}

PeerWatch::PeerWatch(std::vector<ProcessId> ids, int self) : ids_(std::move(ids)) {
  const uint64_t host = ids_.at(static_cast<size_t>(self)).host_hash;
  for (int r = 0; r < static_cast<int>(ids_.size()); ++r)
    if (r != self && ids_[static_cast<size_t>(r)].host_hash == host) watched_.push_back(r);
}

void PeerWatch::check(const char* during) const {
  for (int r : watched_) {
    const ProcessId& p = ids_[static_cast<size_t>(r)];
    if (!process_alive(p))
      throw PeerLost("rank " + std::to_string(r) + " (pid " + std::to_string(p.pid) + ") exited during " + during);
  }
}

}  // namespace k3::dist
