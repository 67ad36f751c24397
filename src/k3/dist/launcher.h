// What the MPI launcher told this process, read from its environment before MPI is initialised.
#pragma once

namespace k3::dist {

// The number of processes mpirun / mpiexec / srun started (OMPI_COMM_WORLD_SIZE, PMI_SIZE); 0 when not
// started by one or the value is not a positive number.
int launcher_world_size();

}  // namespace k3::dist
