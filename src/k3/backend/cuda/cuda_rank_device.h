// A rank of a sharded model on a GPU (dist/rank_device.h): the rank's shard uploaded to one device and run
// by a CudaModel (load_shard / forward_plan), its caches in device memory. The collectives go over NCCL
// when every rank has a GPU of its own, else over the group's host communicator (MPI) staged through
// pinned memory (host_staged_comm.h): two ranks sharing one GPU (NCCL refuses that), or GPU and CPU ranks
// in one group. Staged collectives synchronise the stream, so that path runs without CUDA graphs.
#pragma once
#include "k3/backend/cuda/cuda_model.h"
#include "k3/dist/rank_device.h"

namespace k3::cuda {

struct CudaRankOptions {
  CudaLoadOptions load;           // device, dtypes, GEMM mode, eager (its communicator is set here)
  int ranks_on_device = 1;        // ranks of the group sharing this GPU (their caches share its memory)
  // Whether ANY GPU of the group holds two of its ranks (dist/gpu_placement.h: the same on every rank). Then the
  // whole group stages its collectives through host memory: NCCL on some ranks only would deadlock.
  bool group_shares_a_gpu = false;
  enum class Collectives { Auto, Nccl, HostStaged } collectives = Collectives::Auto;  // Auto: NCCL iff no GPU is shared
};

dist::RankDeviceFactory cuda_rank_device(const CudaRankOptions& o);

// GPUs this process sees (0 when none or no driver).
int visible_cuda_devices();

// "nccl", "host" or "" (Auto) from $K3_TP_COLLECTIVES; anything else is a k3::Error.
CudaRankOptions::Collectives collectives_from_env();

}  // namespace k3::cuda
