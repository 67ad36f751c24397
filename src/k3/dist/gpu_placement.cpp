#include "k3/dist/gpu_placement.h"

#include <algorithm>
#include <vector>

#include "k3/dist/communicator.h"

namespace k3::dist {

GpuPlace place_on_gpus(int first, int local_rank, int local_size, int n_gpus) {
  const int n = std::max(n_gpus, 1);
  GpuPlace p;
  p.gpu = (first + local_rank) % n;
  p.ranks_on_gpu = 0;
  for (int r = 0; r < local_size; ++r) p.ranks_on_gpu += (first + r) % n == p.gpu ? 1 : 0;
  return p;
}

bool group_shares_a_gpu(Communicator& comm, bool this_host_shares) {
  const char mine = this_host_shares ? 1 : 0;
  std::vector<char> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, 1, all.data());
  return std::any_of(all.begin(), all.end(), [](char c) { return c != 0; });
}

}  // namespace k3::dist
