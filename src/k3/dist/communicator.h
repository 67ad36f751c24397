// Communicator: the one interface the sharded model talks to other ranks through (collectives over
// the ranks of one model: tensor / expert parallel). Implementations: LocalComm (one process), MpiComm
// (Debian's OpenMPI: CPU processes on one or several hosts; built with K3_MPI), NcclComm (GPUs; built
// with K3_CUDA, buffers in device memory, ordered on the stream it was given). The graph never knows
// which one it holds. Errors are k3::Error; a rank that cannot go on calls abort() so that no other rank
// waits forever in a collective.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "k3/core/error.h"

namespace k3::dist {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool is_root() const { return rank() == 0; }
  // "local", "mpi", "nccl": for messages and logs.
  virtual std::string name() const = 0;

  // In place: x[i] = the sum over ranks of x[i]. Every rank receives bitwise the same values.
  virtual void all_reduce_sum(float* x, size_t n) = 0;
  // recv = [size][bytes]: every rank's `send` in rank order.
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // On `root` only: recv = [size][bytes], every rank's `send` in rank order (recv may be null elsewhere).
  virtual void gather(const void* send, size_t bytes, void* recv, int root) = 0;
  // root's `bytes` bytes at `data` to every rank's `data`.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // send holds size() runs one after another, send_bytes[r] of them for rank r; recv gets recv_bytes[r]
  // bytes from each rank r, in rank order. (The MoE dispatch / combine of expert parallel.)
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                            std::span<const size_t> recv_bytes) = 0;
  virtual void barrier() = 0;
  // Ends the whole job (every rank) with exit status `code`: for a rank that cannot take part in the
  // next collective, so that the others do not wait for it forever.
  [[noreturn]] virtual void abort(int code) = 0;
};

// One process (size 1): collectives are copies or nothing.
std::unique_ptr<Communicator> make_local_comm();
// Whether this build has MPI (K3_MPI).
bool mpi_built();
// Whether this process was started by an MPI launcher (mpirun / mpiexec / srun set their variables).
bool launched_by_mpi();
// The MPI group of this process (initialises MPI on the first call; finalises when the last one is
// destroyed): MPI_COMM_WORLD under mpirun, or, in a worker started by spawn_mpi_workers, rank 0 and its
// workers. Throws k3::Error when the build has no MPI.
std::unique_ptr<Communicator> make_mpi_comm();
// Rank 0 of `size` ranks on this host without a launcher (`k3 serve --tp N`): starts size - 1 copies of
// this process (same executable and arguments) with MPI_Comm_spawn (OpenMPI starts its own runtime for a
// process not started by mpirun) and returns the group, this process rank 0. The workers find their
// place through make_mpi_comm. They die with this process: OpenMPI's runtime ends them when rank 0 exits,
// even by SIGKILL. Throws k3::Error.
std::unique_ptr<Communicator> spawn_mpi_workers(int size);
struct RendezvousOptions;
// One rank per host over several hosts (--nnodes, rendezvous.h): every node calls it; node 0 runs the
// TCP rendezvous and OpenMPI's ompi-server, the group is ordered by node rank. Throws k3::Error (a bad
// rendezvous: within its timeout).
std::unique_ptr<Communicator> join_mpi_nodes(const RendezvousOptions& o);

// The communicator a sharded step runs through; `who` names the backend in the error when there is none.
inline Communicator& need_communicator(Communicator* c, const char* who) {
  if (c == nullptr) throw Error(std::string("a sharded step on ") + who + " without a communicator");
  return *c;
}

// gather_cols' contract (graph::Backend): every rank's [n][local_cols] (local_cols <= chunk) gathered into
// rank 0's [n][out_cols] at rank * chunk. Throws k3::Error naming the shapes when they do not fit.
inline void check_gather_cols(int64_t local_rows, int64_t local_cols, int64_t chunk, int64_t ranks, int64_t out_rows,
                              int64_t out_cols) {
  if (local_rows != out_rows || local_cols > chunk || chunk * ranks < out_cols)
    throw Error("gather_cols: a local [" + std::to_string(local_rows) + "][" + std::to_string(local_cols) +
                "] in chunks of " + std::to_string(chunk) + " does not make [" + std::to_string(out_rows) + "][" +
                std::to_string(out_cols) + "]");
}

}  // namespace k3::dist
