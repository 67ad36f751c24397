#include "cli/bench_allreduce.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "k3/bench/collectives.h"
#include "k3/core/error.h"
#include "k3/dist/communicator.h"

namespace k3cli {

namespace {

struct AllReduceOpts {
  int tp = 0;  // 0: as many ranks as mpirun started (1 without mpirun)
  std::vector<int64_t> sizes{8, 1024, 65536, 1 << 20, 16 << 20, 64 << 20};
  int reps = 20, warmup = 5;
  std::string json_out;
};

// Under mpirun: MPI_COMM_WORLD; else --tp N > 1 ranks spawned by this process (as `k3 serve --tp`); else one.
std::unique_ptr<k3::dist::Communicator> group(int tp) {
  if (k3::dist::launched_by_mpi()) {
    auto c = k3::dist::make_mpi_comm();
    if (tp > 0 && c->size() != tp)
      throw k3::Error("--tensor-parallel-size " + std::to_string(tp) + " but mpirun started " + std::to_string(c->size()) +
                      " processes (they must be equal)");
    return c;
  }
  if (tp > 1) return k3::dist::spawn_mpi_workers(tp);
  return k3::dist::make_local_comm();
}

std::string human(int64_t b) {
  char s[32];
  if (b >= (1 << 20)) std::snprintf(s, sizeof s, "%.0f MiB", b / 1048576.0);
  else if (b >= 1024) std::snprintf(s, sizeof s, "%.0f KiB", b / 1024.0);
  else std::snprintf(s, sizeof s, "%lld B", static_cast<long long>(b));
  return s;
}

int run(const AllReduceOpts& o) {
  if (o.tp < 0 || o.tp > 4096) throw k3::Error("--tensor-parallel-size: expected 1..4096, got " + std::to_string(o.tp));
  auto comm = group(o.tp);
  const auto rs = k3::bench::measure_all_reduce(*comm, o.sizes, o.reps, o.warmup);
  if (!comm->is_root()) return 0;
  const int n = comm->size();
  std::printf("all-reduce (fp32 sum) over %d rank%s through %s, %d timed repetitions per size after %d warm-ups\n", n,
              n == 1 ? "" : "s", comm->name().c_str(), o.reps, o.warmup);
  std::printf("| size | time (us) | algbw (GB/s) | busbw (GB/s) |\n|---:|---:|---:|---:|\n");
  double busbw = 0;
  for (const auto& r : rs) {
    std::printf("| %s | %.1f | %.2f | %.2f |\n", human(r.bytes).c_str(), r.seconds * 1e6, r.algbw_gb_s, r.busbw_gb_s);
    busbw = std::max(busbw, r.busbw_gb_s);
  }
  const double latency_us = rs.front().seconds * 1e6;  // sizes are sorted: the smallest
  if (n > 1)
    std::printf("for k3 plan --measured FILE (-o): allreduce_latency_us %.1f, allreduce_busbw_gb_s %.2f\n", latency_us, busbw);
  else
    std::printf("one rank: nothing crosses a link (run with --tensor-parallel-size N or under mpirun)\n");
  if (!o.json_out.empty()) {
    nlohmann::json j = {{"ranks", n}, {"transport", comm->name()}, {"reps", o.reps}};
    if (n > 1) {  // one rank's all-reduce is a no-op: nothing for the plan
      j["allreduce_latency_us"] = latency_us;
      j["allreduce_busbw_gb_s"] = busbw;
    }
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : rs)
      arr.push_back({{"bytes", r.bytes}, {"us", r.seconds * 1e6}, {"algbw_gb_s", r.algbw_gb_s}, {"busbw_gb_s", r.busbw_gb_s}});
    j["results"] = arr;
    std::ofstream f(o.json_out);
    if (!f) throw k3::Error("cannot write '" + o.json_out + "'");
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

void add_bench_allreduce(CLI::App* bench, Registry& reg) {
  auto o = std::make_shared<AllReduceOpts>();
  auto* a = bench->add_subcommand("allreduce", "All-reduce time and bus bandwidth between tensor-parallel ranks (for k3 plan --measured)");
  a->add_option("--tensor-parallel-size,--tp", o->tp, "ranks (spawned on this host without mpirun; default: mpirun's, else 1)");
  a->add_option("--sizes", o->sizes, "bytes per rank, multiples of 4 (the smallest gives the latency)")->delimiter(',');
  a->add_option("-r,--repetitions", o->reps, "timed all-reduces per size")->capture_default_str();
  a->add_option("--warmup", o->warmup, "untimed all-reduces per size first")->capture_default_str();
  a->add_option("-o,--json", o->json_out, "write the results as JSON (k3 plan --measured reads it)");
  a->callback([&reg, o] {
    reg.action = [o] {
      std::sort(o->sizes.begin(), o->sizes.end());
      if (o->sizes.empty()) throw k3::Error("--sizes: at least one size");
      return run(*o);
    };
  });
}

}  // namespace k3cli
