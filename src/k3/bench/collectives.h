// `k3 bench allreduce`: what one all-reduce costs between the ranks of a tensor-parallel group, the way
// nccl-tests' all_reduce_perf reports it (time per operation, algorithm bandwidth = bytes / time, bus
// bandwidth = algbw x 2 (n - 1) / n, the ring's traffic per link), so that `k3 plan --measured` can use the
// figures of the user's own interconnect instead of assumed ones (plan/collectives.h).
#pragma once
#include <cstdint>
#include <vector>

#include "k3/dist/communicator.h"

namespace k3::bench {

struct AllReduceResult {
  int64_t bytes = 0;        // per rank, fp32 values
  double seconds = 0;       // per all-reduce: the slowest rank's mean over the timed repetitions
  double algbw_gb_s = 0;    // bytes / seconds
  double busbw_gb_s = 0;    // algbw x 2 (n - 1) / n (0 with one rank)
};

// Collective over every rank of `comm` (same arguments on each): for each size, `warmup` untimed
// all-reduces, then `reps` timed ones between barriers. The first all-reduce of each size is checked (rank
// r contributes (r + 1) x (i % 251) at value i: the sum is known), so a transport that corrupts data fails
// with k3::Error instead of printing a fast number. Sizes must be positive multiples of 4 bytes, at most 1 GiB.
std::vector<AllReduceResult> measure_all_reduce(dist::Communicator& comm, const std::vector<int64_t>& sizes, int reps,
                                                int warmup);

}  // namespace k3::bench
