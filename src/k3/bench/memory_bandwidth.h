// `k3 bench memory`: the DRAM read bandwidth the compute threads reach, the denominator of the decode
// roofline (`k3 bench offline` prints % of it). Reads a buffer much larger than the caches with the
// kernels' thread pool, the way a memory-bound GEMV does (one sequential stream per chunk, 32-byte loads).
#pragma once
#include <cstddef>

namespace k3::bench {

struct BandwidthResult {
  double best_gb_s = 0;    // 1 GB = 1e9 bytes; the fastest pass
  double median_gb_s = 0;
  size_t bytes = 0;        // buffer size
  int passes = 0, threads = 0;
};

// `bytes` rounded up to whole 4 KiB pages (>= 64 MiB), first touched in parallel (so its pages sit with
// the threads' NUMA nodes), then `passes` timed full reads. Throws k3::Error for a size out of range
// (64 MiB .. 64 GiB) or passes < 1.
BandwidthResult measure_read_bandwidth(size_t bytes, int passes);

}  // namespace k3::bench
