// NcclComm: the communicator over NCCL for ranks that are GPUs (built only with K3_CUDA; the CPU-only
// build has no NCCL). Buffers are device pointers; every collective is queued on `stream` (a
// cudaStream_t) and ordered with the kernels there, so a caller synchronises the stream before reading
// a result on the host. Bootstrap: rank 0 makes NCCL's unique id and `bootstrap` (MPI, or a TCP store
// later) carries it to the other ranks; one rank per GPU (NCCL's rule).
#pragma once
#include <memory>

#include "k3/dist/communicator.h"

namespace k3::dist {

std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, int cuda_device, void* stream);

}  // namespace k3::dist
