#include "cli/compute_options.h"

#include <sched.h>

#include <cstdio>

#include "k3/core/error.h"
#include "k3/core/numa.h"
#include "k3/core/thread_pool.h"

namespace k3cli {

namespace {
std::string g_summary;  // what apply_compute_options chose
}

void add_compute_options(CLI::App* cmd, ComputeOptions& o) {
  cmd->add_option("-t,--threads", o.threads,
                  "compute threads of the CPU kernels (default: $K3_NUM_THREADS, else $OMP_NUM_THREADS, else the CPUs "
                  "this process may use)");
  cmd->add_option("--numa", o.numa,
                  "pin the compute threads over NUMA nodes: distribute (thread t on node t % nodes), isolate (all on "
                  "the node k3 started on) or numactl (keep the CPU mask numactl/taskset gave); one node: no-op");
}

void apply_compute_options(const ComputeOptions& o) {
  std::string source = o.threads_source.empty() ? "-t" : o.threads_source;
  if (o.threads && (*o.threads < 1 || *o.threads > 1024))
    throw k3::Error("--threads/-t: expected 1..1024, got " + std::to_string(*o.threads));
  const int threads = o.threads ? static_cast<int>(*o.threads) : k3::ThreadPool::default_threads(&source);
  k3::NumaMode mode = k3::NumaMode::Off;
  if (!o.numa.empty()) {
    const auto m = k3::parse_numa_mode(o.numa);
    if (!m) throw k3::Error("--numa: expected distribute, isolate or numactl, got '" + o.numa + "'");
    mode = *m;
  }
  const std::vector<int> allowed = k3::allowed_cpus();
  const k3::ThreadPlacement p = k3::plan_placement(mode, k3::read_numa_nodes(allowed), threads, sched_getcpu());
  k3::ThreadPool::configure_global(threads, p.cpus);
  if (!p.cpus.empty() && !p.cpus[0].empty()) {  // thread 0 is the caller: this thread and those it starts
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : p.cpus[0]) CPU_SET(c, &set);
    (void)sched_setaffinity(0, sizeof set, &set);
  }
  g_summary = std::to_string(threads) + " compute threads (" + source + "), " + p.summary;
  if (mode != k3::NumaMode::Off) std::fprintf(stderr, "k3: %s\n", p.summary.c_str());
}

std::string compute_threads_summary() { return g_summary; }

}  // namespace k3cli
