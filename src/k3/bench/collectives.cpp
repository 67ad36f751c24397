#include "k3/bench/collectives.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "k3/core/error.h"

namespace k3::bench {

namespace {

void fill(std::vector<float>& x, int rank) {
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 251));
}

// Every value i must be (1 + 2 + .. + n) x (i % 251): exact in fp32 for these small integers.
void check_sum(const std::vector<float>& x, int n) {
  const int tri = n * (n + 1) / 2;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i] != static_cast<float>(tri * static_cast<int>(i % 251)))
      throw Error("bench allreduce: value " + std::to_string(i) + " of " + std::to_string(x.size()) + " is " +
                  std::to_string(x[i]) + " after the all-reduce over " + std::to_string(n) + " ranks, expected " +
                  std::to_string(tri * static_cast<int>(i % 251)) + " (the transport corrupted data)");
}

}  // namespace

std::vector<AllReduceResult> measure_all_reduce(dist::Communicator& comm, const std::vector<int64_t>& sizes, int reps,
                                                int warmup) {
  if (reps < 1 || warmup < 0) throw Error("bench allreduce: repetitions must be >= 1 and warm-ups >= 0");
  for (int64_t b : sizes)
    // 1 GiB per rank is past where any link's bandwidth is reached (nccl-tests stops at 8 GiB on 80 GB GPUs)
    // and is held by every rank at once on the host: larger asks would exhaust RAM, not measure anything.
    if (b <= 0 || b % 4 != 0 || b > (int64_t{1} << 30))
      throw Error("bench allreduce: size " + std::to_string(b) + " bytes: expected a positive multiple of 4 up to 1 GiB");
  const int n = comm.size();
  std::vector<AllReduceResult> out;
  for (int64_t bytes : sizes) {
    std::vector<float> x(static_cast<size_t>(bytes / 4));
    fill(x, comm.rank());
    comm.all_reduce_sum(x.data(), x.size());
    check_sum(x, n);
    for (int w = 0; w < warmup; ++w) comm.all_reduce_sum(x.data(), x.size());
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < reps; ++r) comm.all_reduce_sum(x.data(), x.size());
    const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
    std::vector<double> all(static_cast<size_t>(n));
    comm.all_gather(&mine, sizeof(double), all.data());
    AllReduceResult r;
    r.bytes = bytes;
    r.seconds = *std::max_element(all.begin(), all.end());
    r.algbw_gb_s = static_cast<double>(bytes) / r.seconds / 1e9;
    r.busbw_gb_s = r.algbw_gb_s * 2.0 * (n - 1) / n;
    out.push_back(r);
  }
  return out;
}

}  // namespace k3::bench
