// A communicator over device buffers made from one over host memory (MPI): each collective waits for the
// stream, copies its device operands to pinned host memory, runs the host collective, and copies the
// result back. For GPU ranks that NCCL cannot connect: two ranks on one GPU (NCCL refuses a duplicate
// device) or a group mixing GPU and CPU ranks. Every call synchronises the stream, so a model using it
// runs eagerly (no CUDA graphs: a capture cannot hold a host collective).
#pragma once
#include <memory>

#include "k3/dist/communicator.h"

namespace k3::cuda {

// `host` outlives the result; `stream` is a cudaStream_t (the model's).
std::unique_ptr<dist::Communicator> make_host_staged_comm(dist::Communicator& host, void* stream);

}  // namespace k3::cuda
