// One-paragraph reports of the routed-expert cache and the process's disk reads (k3 run -v, k3 bench
// offline; docs/bigger-than-ram.md), and `k3 bench disk`.
#pragma once
#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "k3/runtime/expert_residency.h"

namespace k3cli {

// "expert cache: hit ratio ..., prefetch ..., pinned ...; disk: read ... GB, ... major faults; peak RSS ...".
// `since` (optional): counters at the start of the reported interval; `seconds`: its length (0: no GB/s).
std::string expert_cache_report(const std::optional<k3::ExpertCacheStats>& now, const k3::DiskCounters& since,
                                double seconds);
// Peak resident set of this process in bytes (getrusage).
int64_t peak_rss_bytes();
// Evicts every *.safetensors of `dir` from the page cache (k3 bench offline --drop-page-cache); prints what.
void drop_checkpoint_pages(const std::string& dir);

// `k3 bench disk FILE...`: O_DIRECT read bandwidth, sequential and random blocks.
void add_bench_disk(CLI::App* bench, Registry& reg);

}  // namespace k3cli
