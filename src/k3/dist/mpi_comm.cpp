// MpiComm: the communicator over MPI (Debian's OpenMPI 4.1), for CPU ranks on one host or several.
// Built only with K3_MPI (CMake finds MPI); mpi_stub.cpp stands in otherwise.
//
// Error handling: MPI_COMM_WORLD keeps MPI's default handler (MPI_ERRORS_ARE_FATAL): a failed
// collective ends the job, and when any rank dies mpirun kills the others, so rank 0 never waits
// forever for a dead worker; it cannot fail requests cleanly either (a later step: ULFM or a heartbeat).
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings warn and are deprecated)
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "k3/core/error.h"
#include "k3/dist/communicator.h"

namespace k3::dist {

namespace {

// MPI is initialised once per process and finalised when the last communicator goes away.
std::mutex g_init_mu;
int g_users = 0;

void acquire_mpi() {
  std::lock_guard lk(g_init_mu);
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    // SERIALIZED: the engine thread of `k3 serve` runs the steps, the main thread sets up; never both at once.
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      throw Error("MPI_Init_thread failed");
    if (provided < MPI_THREAD_SERIALIZED) throw Error("this MPI library does not support MPI_THREAD_SERIALIZED");
  }
  ++g_users;
}

void release_mpi() {
  std::lock_guard lk(g_init_mu);
  if (--g_users > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI counts are ints: a message over 2 GiB would wrap.
int count_of(size_t n, const char* what) {
  if (n > static_cast<size_t>(INT_MAX))
    throw Error(std::string(what) + ": " + std::to_string(n) + " elements is more than one MPI message holds (2^31 - 1)");
  return static_cast<int>(n);
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(std::string(what) + " failed (MPI error " + std::to_string(rc) + ")");
}

class MpiComm final : public Communicator {
 public:
  MpiComm() {
    acquire_mpi();
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");  // our own context: no clash with other MPI users
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    MPI_Comm_free(&comm_);
    release_mpi();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  // Gathers every rank's x and sums in rank order, rather than MPI_Allreduce: the result is then the
  // same on every rank and does not depend on the message size (MPI switches algorithms, and with them
  // the order of the additions, by size), which keeps a sharded model's output independent of the batch
  // it ran in. Costs size x the bytes of a reduce-scatter + all-gather; fine for CPU ranks.
  void all_reduce_sum(float* x, size_t n) override {
    if (size_ == 1 || n == 0) return;
    gathered_.resize(n * static_cast<size_t>(size_));
    check(MPI_Allgather(x, count_of(n, "all_reduce_sum"), MPI_FLOAT, gathered_.data(), static_cast<int>(n), MPI_FLOAT,
                        comm_),
          "MPI_Allgather (all_reduce_sum)");
    for (size_t i = 0; i < n; ++i) {
      float s = gathered_[i];
      for (int r = 1; r < size_; ++r) s += gathered_[static_cast<size_t>(r) * n + i];
      x[i] = s;
    }
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    const int c = count_of(bytes, "all_gather");
    check(MPI_Allgather(send, c, MPI_BYTE, recv, c, MPI_BYTE, comm_), "MPI_Allgather");
  }
  void gather(const void* send, size_t bytes, void* recv, int root) override {
    if (root < 0 || root >= size_) throw Error("gather: root " + std::to_string(root) + " is not a rank");
    const int c = count_of(bytes, "gather");
    check(MPI_Gather(send, c, MPI_BYTE, recv, c, MPI_BYTE, root, comm_), "MPI_Gather");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) throw Error("broadcast: root " + std::to_string(root) + " is not a rank");
    check(MPI_Bcast(data, count_of(bytes, "broadcast"), MPI_BYTE, root, comm_), "MPI_Bcast");
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) override {
    if (send_bytes.size() != static_cast<size_t>(size_) || recv_bytes.size() != static_cast<size_t>(size_))
      throw Error("all_to_all_v: one count per rank");
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    size_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      sc[r] = count_of(send_bytes[r], "all_to_all_v");
      rc[r] = count_of(recv_bytes[r], "all_to_all_v");
      sd[r] = count_of(so, "all_to_all_v");
      rd[r] = count_of(ro, "all_to_all_v");
      so += send_bytes[r];
      ro += recv_bytes[r];
    }
    check(MPI_Alltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_),
          "MPI_Alltoallv");
  }
  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<float> gathered_;
};

}  // namespace

bool mpi_built() { return true; }
std::unique_ptr<Communicator> make_mpi_comm() { return std::make_unique<MpiComm>(); }

}  // namespace k3::dist
