// The build without MPI (K3_MPI off): tensor parallel over processes is unavailable, said clearly.
#include "k3/core/error.h"
#include "k3/dist/communicator.h"

namespace k3::dist {

bool mpi_built() { return false; }
std::unique_ptr<Communicator> make_mpi_comm() {
  throw Error("this k3 was built without MPI (K3_MPI): install libopenmpi-dev (scripts/setup-deps) and rebuild");
}
std::unique_ptr<Communicator> spawn_mpi_workers(int) { return make_mpi_comm(); }
std::unique_ptr<Communicator> join_mpi_nodes(const RendezvousOptions&) { return make_mpi_comm(); }

}  // namespace k3::dist
