// The TCP rendezvous of a group over several hosts (`--nnodes --node-rank --master-addr --master-port`,
// torchrun's and vLLM's names): node 0 listens, the other nodes connect, say who they are, and receive
// what the collective library needs to connect them (for MPI ranks: the ompi-server URI and an MPI port
// name, mpi_comm.cpp; for NCCL ranks it would be the unique id). Node 0 checks that every node agrees on
// the group (--nnodes, ranks per node) and that each node rank comes once; a node that does not fit is
// told why and refused, and every wait has a timeout, so a bad rendezvous ends in a clear error, never a
// hang. No authentication: whoever reaches the port during the rendezvous may join (as with MPI and
// NCCL's own bootstraps); bind it to an address only the group's hosts reach.
#pragma once
#include <string>

namespace k3::dist {

struct RendezvousOptions {
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int ranks_per_node = 1;
  double timeout_s = 60;  // $K3_RENDEZVOUS_TIMEOUT overrides (rendezvous_timeout())
};

// Throws k3::Error naming the flag for a value out of range (--node-rank outside 0..nnodes-1, ...).
void validate(const RendezvousOptions& o);
// o.timeout_s, or $K3_RENDEZVOUS_TIMEOUT seconds when set (tests use a short one).
double rendezvous_timeout(const RendezvousOptions& o);

// Node 0: listens on master_addr:master_port until the other nnodes - 1 nodes have said hello and agree,
// then sends each of them `payload` and returns. Throws k3::Error (telling the connected nodes) on a
// node that disagrees, or when not every node came within the timeout.
void serve_rendezvous(const RendezvousOptions& o, const std::string& payload);
// Another node: connects to the master (retrying until the timeout: node 0 may start later), says who it
// is, and returns node 0's payload. Throws k3::Error with node 0's reason when refused, or on timeout.
std::string join_rendezvous(const RendezvousOptions& o);

}  // namespace k3::dist
