// PeerWatch: whether the other ranks of a group on this host are still alive, without asking them.
// A rank waiting in a collective for a rank that died would wait forever (MPI's collectives do not time
// out); the waiting rank polls this instead (mpi_comm.cpp) and gives up with PeerLost. Ranks are told
// apart by (host, pid, start time): a pid reused by a new process is not mistaken for the old one.
// Ranks on other hosts cannot be watched this way (their loss shows as a failed MPI call instead).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "k3/core/error.h"

namespace k3::dist {

// Another rank of the group is gone: the group cannot run another collective. Thrown by a
// Communicator's collectives; the message names the rank and its pid.
class PeerLost : public Error {
 public:
  using Error::Error;
};

// What identifies one process: fixed size, so that ranks can all-gather it as bytes.
struct ProcessId {
  uint64_t host_hash = 0;   // hash of the host name
  int64_t pid = 0;
  uint64_t start_ticks = 0;  // /proc/PID/stat field 22: when the process started (clock ticks after boot)
};

ProcessId this_process();
// Whether `p` (a process of this host) still runs: exists, has the same start time, is not a zombie.
bool process_alive(const ProcessId& p);

class PeerWatch {
 public:
  PeerWatch() = default;
  // ids[r] is rank r's; `self` is this rank.
  PeerWatch(std::vector<ProcessId> ids, int self);
  // Throws PeerLost for the first watched rank (same host) that is gone; `during` says what was waiting.
  void check(const char* during) const;
  size_t watched() const { return watched_.size(); }

 private:
  std::vector<ProcessId> ids_;
  std::vector<int> watched_;  // ranks on this host other than self
};

}  // namespace k3::dist
