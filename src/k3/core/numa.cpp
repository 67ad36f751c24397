#include "k3/core/numa.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>

#include "k3/core/error.h"

namespace k3 {

namespace {

int parse_cpu_number(std::string_view s, std::string_view whole) {
  int v = -1;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size() || v < 0 || v >= (1 << 20))
    throw Error("bad CPU list '" + std::string(whole) + "'");
  return v;
}

std::string cpus_text(const std::vector<int>& cpus) {
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    s += (s.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
    i = j + 1;
  }
  return s;
}

}  // namespace

std::optional<NumaMode> parse_numa_mode(std::string_view name) {
  for (NumaMode m : {NumaMode::Distribute, NumaMode::Isolate, NumaMode::Numactl})
    if (name == numa_mode_name(m)) return m;
  return std::nullopt;
}

const char* numa_mode_name(NumaMode m) {
  switch (m) {
    case NumaMode::Off: return "off";
    case NumaMode::Distribute: return "distribute";
    case NumaMode::Isolate: return "isolate";
    case NumaMode::Numactl: return "numactl";
  }
  return "?";
}

std::vector<int> parse_cpulist(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
  std::vector<int> cpus;
  const std::string_view whole = s;
  while (!s.empty()) {
    const size_t comma = s.find(',');
    const std::string_view item = s.substr(0, comma);
    const size_t dash = item.find('-');
    const int lo = parse_cpu_number(item.substr(0, dash), whole);
    const int hi = dash == std::string_view::npos ? lo : parse_cpu_number(item.substr(dash + 1), whole);
    if (hi < lo) throw Error("bad CPU list '" + std::string(whole) + "'");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    if (comma == std::string_view::npos) break;
    s.remove_prefix(comma + 1);
    if (s.empty()) throw Error("bad CPU list '" + std::string(whole) + "'");
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::vector<NumaNode> read_numa_nodes(const std::vector<int>& allowed, const std::string& node_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::map<int, NumaNode> by_id;
  if (fs::is_directory(node_dir, ec)) {
    for (const auto& e : fs::directory_iterator(node_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name.size() < 5 || name.compare(0, 4, "node") != 0 ||
          name.find_first_not_of("0123456789", 4) != std::string::npos)
        continue;
      std::ifstream f(e.path() / "cpulist");
      std::string line;
      if (!f || !std::getline(f, line)) continue;
      NumaNode n;
      n.id = parse_cpu_number(std::string_view(name).substr(4), name);
      for (int c : parse_cpulist(line))
        if (std::binary_search(allowed.begin(), allowed.end(), c)) n.cpus.push_back(c);
      if (!n.cpus.empty()) by_id[n.id] = std::move(n);
    }
  }
  std::vector<NumaNode> nodes;
  for (auto& [id, n] : by_id) nodes.push_back(std::move(n));
  if (nodes.empty() && !allowed.empty()) nodes.push_back(NumaNode{0, allowed});
  return nodes;
}

ThreadPlacement plan_placement(NumaMode mode, const std::vector<NumaNode>& nodes, int threads, int current_cpu) {
  ThreadPlacement p;
  const std::string flag = std::string("--numa ") + numa_mode_name(mode);
  if (mode == NumaMode::Off) {
    p.summary = "threads not pinned";
  } else if (mode == NumaMode::Numactl) {
    p.summary = flag + ": threads keep the CPU mask the process was started with, not pinned further";
  } else if (nodes.size() <= 1) {
    p.summary = flag + ": one NUMA node" + (nodes.empty() ? "" : " (CPUs " + cpus_text(nodes[0].cpus) + ")") +
                ", nothing to place: threads not pinned";
  } else if (mode == NumaMode::Distribute) {
    std::vector<int> per_node(nodes.size(), 0);
    for (int t = 0; t < threads; ++t) {
      p.cpus.push_back(nodes[t % nodes.size()].cpus);
      ++per_node[t % nodes.size()];
    }
    p.summary = flag + ": " + std::to_string(threads) + " threads over " + std::to_string(nodes.size()) + " nodes (";
    for (size_t i = 0; i < nodes.size(); ++i)
      p.summary += (i ? ", " : "") + std::string("node ") + std::to_string(nodes[i].id) + ": " + std::to_string(per_node[i]);
    p.summary += ")";
  } else {  // Isolate: the node of the CPU we run on (its first node if that CPU is not in any)
    const NumaNode* home = &nodes[0];
    for (const NumaNode& n : nodes)
      if (std::binary_search(n.cpus.begin(), n.cpus.end(), current_cpu)) home = &n;
    p.cpus.assign(threads, home->cpus);
    p.summary = flag + ": " + std::to_string(threads) + " threads on node " + std::to_string(home->id) + " (CPUs " +
                cpus_text(home->cpus) + ")";
    if (threads > static_cast<int>(home->cpus.size()))
      p.summary += "; more threads than the node's " + std::to_string(home->cpus.size()) + " CPUs";
  }
  return p;
}

}  // namespace k3
