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
  size_t job_bytes = 0;    // 0: each pass one parallel job over the buffer
};

// `bytes` rounded up to whole 4 KiB pages (>= 64 MiB), first touched in parallel (so its pages sit with
// the threads' NUMA nodes), then `passes` timed full reads. Throws k3::Error for a size out of range
// (64 MiB .. 64 GiB) or passes < 1.
// `job_bytes` > 0: each pass reads the buffer as back-to-back parallel jobs of that many bytes (4 KiB .. the buffer,
// whole 4 KiB pages), each split into about 4 chunks a thread, as a decode step's products are (a 2304 x 4096 Q4_K
// matrix is 5.3 MB): the rate a product of that size can reach through the pool's fork and join, its ceiling beside
// the whole-buffer rate. Throws k3::Error for a job size out of range.
BandwidthResult measure_read_bandwidth(size_t bytes, int passes, size_t job_bytes = 0);

}  // namespace k3::bench
