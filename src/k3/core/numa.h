// Thread placement over NUMA nodes (llama.cpp's --numa): read the node topology from sysfs (no libnuma)
// and plan which CPUs each compute thread is bound to. The plan is a pure function of the topology, so
// the 2-socket cases are tested here on a synthetic topology; ThreadPool applies it (configure_global).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace k3 {

enum class NumaMode {
  Off,         // threads float (the default)
  Distribute,  // thread t on the CPUs of node t % nodes: every node's memory bandwidth in use
  Isolate,     // every thread on the node the process started on: no remote memory traffic
  Numactl,     // keep the CPU mask numactl / taskset gave the process (no pinning of ours)
};

std::optional<NumaMode> parse_numa_mode(std::string_view name);  // "distribute", "isolate", "numactl"
const char* numa_mode_name(NumaMode m);

struct NumaNode {
  int id = 0;
  std::vector<int> cpus;  // the node's CPUs this process may run on, ascending
};

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; "" -> {}. Throws k3::Error for anything else.
std::vector<int> parse_cpulist(std::string_view s);

// The CPUs this process may run on (sched_getaffinity).
std::vector<int> allowed_cpus();

// Nodes under `node_dir` (node<N>/cpulist), each restricted to `allowed`; nodes left with no CPU are dropped.
// No such directory (a kernel without NUMA): one node 0 holding `allowed`.
std::vector<NumaNode> read_numa_nodes(const std::vector<int>& allowed,
                                      const std::string& node_dir = "/sys/devices/system/node");

struct ThreadPlacement {
  std::vector<std::vector<int>> cpus;  // cpus[t]: thread t's CPUs (thread 0 = the caller); empty: not pinned
  std::string summary;                 // one line for stderr / `k3 info`
};

// Where `threads` compute threads go. `current_cpu`: the CPU the process runs on now (isolate's node).
// One node (or none): nothing to place, no pinning, and the summary says so.
ThreadPlacement plan_placement(NumaMode mode, const std::vector<NumaNode>& nodes, int threads, int current_cpu);

}  // namespace k3
