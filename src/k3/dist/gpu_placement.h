// Where a tensor-parallel group's GPU ranks go and whether their collectives can use NCCL. Ranks take their
// host's GPUs round-robin from a first ordinal; NCCL needs a GPU per rank, and the choice must be the same on
// every rank of the group: one rank on NCCL while its peers stage through host memory deadlocks the first
// collective (3 ranks on a 2-GPU host did, call s28-7). So the group uses NCCL only when no GPU of ANY host
// of the group holds two of its ranks.
#pragma once

namespace k3::dist {

class Communicator;

struct GpuPlace {
  int gpu = 0;           // this rank's GPU ordinal on its host
  int ranks_on_gpu = 1;  // the group's ranks on that GPU (this one included): they share its memory
};

// Rank `local_rank` of the `local_size` ranks of one host, over its `n_gpus` GPUs from `first` on.
GpuPlace place_on_gpus(int first, int local_rank, int local_size, int n_gpus);

// Whether some GPU of this host holds two of its local_size ranks.
inline bool host_shares_a_gpu(int local_size, int n_gpus) { return local_size > (n_gpus < 1 ? 1 : n_gpus); }

// The group-wide answer from each rank's host_shares_a_gpu (a collective: every rank of `comm` calls it).
bool group_shares_a_gpu(Communicator& comm, bool this_host_shares);

}  // namespace k3::dist
