// MpiComm: the communicator over MPI (Debian's OpenMPI 4.1), for CPU ranks on one host or several.
// Built only with K3_MPI (CMake finds MPI); mpi_stub.cpp stands in otherwise.
//
// The group is MPI_COMM_WORLD under mpirun, or rank 0 + the workers it started itself with
// MPI_Comm_spawn (spawn_mpi_workers: `k3 serve --tp N` without a launcher), merged into one
// intracommunicator.
//
// Error handling: a dead rank must not leave the others waiting forever in a collective (MPI's
// collectives have no timeout). Every collective is non-blocking, and the wait polls it while checking,
// every 50 ms, that the ranks of this host are still alive (peer_watch.h): a lost rank throws PeerLost,
// which rank 0 turns into failed requests (tp_model.cpp) and the workers into an exit. The group's
// communicator returns MPI errors (MPI_ERRORS_RETURN) as k3::Error rather than ending the process.
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings warn and are deprecated)
#include <mpi.h>

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "k3/core/error.h"
#include "k3/dist/communicator.h"
#include "k3/dist/peer_watch.h"
#include "k3/dist/rendezvous.h"

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

pid_t g_ompi_server = 0;  // node 0 of a --nnodes group: the ompi-server it started (join_mpi_nodes)

void release_mpi() {
  std::lock_guard lk(g_init_mu);
  if (--g_users > 0) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  if (g_ompi_server > 0) {
    ::kill(g_ompi_server, SIGTERM);
    ::waitpid(g_ompi_server, nullptr, 0);
    g_ompi_server = 0;
  }
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

// Waits for one non-blocking MPI operation. Spins on MPI_Test for the first 2 ms (a collective inside a
// step completes in microseconds), then sleeps 50 us between tests, 1 ms after 100 ms (a worker waiting
// for the next request leaves its core to others instead of spinning as blocking MPI does); checks the
// peers every 50 ms.
void wait_for(MPI_Request& rq, const PeerWatch& watch, const char* what) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto next_check = start + std::chrono::milliseconds(50);
  for (uint32_t polls = 0;; ++polls) {
    int done = 0;
    check(MPI_Test(&rq, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if ((polls & 63) != 0) continue;
    const auto now = Clock::now();
    if (now >= next_check) {
      watch.check(what);
      next_check = now + std::chrono::milliseconds(50);
    }
    const auto waited = now - start;
    if (waited > std::chrono::milliseconds(2)) {
      const timespec nap{0, waited > std::chrono::milliseconds(100) ? 1000000L : 50000L};
      ::nanosleep(&nap, nullptr);
    }
  }
}

class MpiComm final : public Communicator {
 public:
  // Takes `comm` (owned: freed with the communicator).
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    std::vector<ProcessId> ids(static_cast<size_t>(size_));
    const ProcessId me = this_process();
    check(MPI_Allgather(&me, sizeof me, MPI_BYTE, ids.data(), sizeof me, MPI_BYTE, comm_), "MPI_Allgather (process ids)");
    watch_ = PeerWatch(std::move(ids), rank_);
  }
  ~MpiComm() override {
    // With a rank gone, freeing the communicator or finalising may wait for it forever: the process is
    // about to exit anyway.
    if (lost_) return;
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
    run("MPI_Iallgather (all_reduce_sum)", [&](MPI_Request* rq) {
      return MPI_Iallgather(x, count_of(n, "all_reduce_sum"), MPI_FLOAT, gathered_.data(), static_cast<int>(n),
                            MPI_FLOAT, comm_, rq);
    });
    for (size_t i = 0; i < n; ++i) {
      float s = gathered_[i];
      for (int r = 1; r < size_; ++r) s += gathered_[static_cast<size_t>(r) * n + i];
      x[i] = s;
    }
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    const int c = count_of(bytes, "all_gather");
    run("MPI_Iallgather", [&](MPI_Request* rq) { return MPI_Iallgather(send, c, MPI_BYTE, recv, c, MPI_BYTE, comm_, rq); });
  }
  void gather(const void* send, size_t bytes, void* recv, int root) override {
    if (root < 0 || root >= size_) throw Error("gather: root " + std::to_string(root) + " is not a rank");
    const int c = count_of(bytes, "gather");
    run("MPI_Igather", [&](MPI_Request* rq) { return MPI_Igather(send, c, MPI_BYTE, recv, c, MPI_BYTE, root, comm_, rq); });
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) throw Error("broadcast: root " + std::to_string(root) + " is not a rank");
    const int c = count_of(bytes, "broadcast");
    run("MPI_Ibcast", [&](MPI_Request* rq) { return MPI_Ibcast(data, c, MPI_BYTE, root, comm_, rq); });
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
    run("MPI_Ialltoallv", [&](MPI_Request* rq) {
      return MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, comm_, rq);
    });
  }
  void barrier() override {
    run("MPI_Ibarrier", [&](MPI_Request* rq) { return MPI_Ibarrier(comm_, rq); });
  }
  [[noreturn]] void abort(int code) override {
    if (!lost_) MPI_Abort(comm_, code);  // with a rank gone, MPI_Abort may wait on it: exit alone
    std::_Exit(code);
  }

 private:
  // Starts one non-blocking collective and waits for it (wait_for). After a failure the group is
  // unusable: every later call throws at once (the outstanding request cannot be completed).
  template <class Start>
  void run(const char* what, Start start) {
    if (lost_) throw PeerLost(lost_what_);
    MPI_Request rq = MPI_REQUEST_NULL;
    try {
      check(start(&rq), what);
      wait_for(rq, watch_, what);
    } catch (const Error& e) {
      lost_ = true;
      lost_what_ = e.what();
      throw PeerLost(e.what());
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  PeerWatch watch_;
  bool lost_ = false;
  std::string lost_what_;
  std::vector<float> gathered_;
};

// This process's command line (argv[0] included) from /proc/self/cmdline.
std::vector<std::string> own_command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string a;
  while (std::getline(f, a, '\0')) args.push_back(a);
  return args;
}

// Starts OpenMPI's ompi-server (the rendezvous point MPI_Comm_connect / MPI_Comm_accept need between
// processes that no one mpirun started) and returns its URI. It dies with this process (PDEATHSIG).
std::string start_ompi_server(double timeout_s) {
  char path[] = "/tmp/k3-ompi-server-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) throw Error("cannot create a temporary file for ompi-server's URI");
  ::close(fd);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("fork failed (ompi-server)");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", path, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  g_ompi_server = pid;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  for (;;) {
    std::ifstream f(path);
    std::string uri;
    std::getline(f, uri);
    if (!uri.empty()) {
      ::unlink(path);
      return uri;
    }
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      g_ompi_server = 0;
      ::unlink(path);
      throw Error("ompi-server (OpenMPI's, package openmpi-bin) did not start (exit status " +
                  std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)) +
                  "): --nnodes over MPI needs it on node 0's PATH");
    }
    if (std::chrono::steady_clock::now() > until) {
      ::unlink(path);
      throw Error("ompi-server did not report its address within the rendezvous timeout");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

bool mpi_built() { return true; }

std::unique_ptr<Communicator> make_mpi_comm() {
  acquire_mpi();
  MPI_Comm parent = MPI_COMM_NULL, group = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent != MPI_COMM_NULL) {  // started by rank 0's spawn_mpi_workers: join its group, after it
    check(MPI_Intercomm_merge(parent, /*high=*/1, &group), "MPI_Intercomm_merge");
  } else {
    // our own context: no clash with other MPI users of the world
    check(MPI_Comm_dup(MPI_COMM_WORLD, &group), "MPI_Comm_dup");
  }
  return std::make_unique<MpiComm>(group);
}

std::unique_ptr<Communicator> spawn_mpi_workers(int size) {
  if (size < 2) throw Error("spawn_mpi_workers: a group of " + std::to_string(size) + " needs no workers");
  const std::vector<std::string> cmd = own_command_line();
  if (cmd.empty()) throw Error("cannot read this process's command line (/proc/self/cmdline)");
  char exe[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw Error("cannot find this process's executable (/proc/self/exe)");
  acquire_mpi();
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (world != 1) throw Error("spawn_mpi_workers: this process is one of " + std::to_string(world) + " already");
  std::vector<char*> argv;
  for (size_t i = 1; i < cmd.size(); ++i) argv.push_back(const_cast<char*>(cmd[i].c_str()));
  argv.push_back(nullptr);
  MPI_Comm inter = MPI_COMM_NULL, group = MPI_COMM_NULL;
  std::vector<int> codes(static_cast<size_t>(size - 1), MPI_SUCCESS);
  // MPI_Comm_spawn's default error handler on COMM_SELF ends the process with OpenMPI's own report; ask
  // for the error codes instead.
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  const int rc = MPI_Comm_spawn(exe, argv.data(), size - 1, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter, codes.data());
  for (int c : codes)
    if (c != MPI_SUCCESS || rc != MPI_SUCCESS)
      throw Error("could not start " + std::to_string(size - 1) + " worker process(es) with MPI_Comm_spawn (MPI error " +
                  std::to_string(rc != MPI_SUCCESS ? rc : c) + "); or start k3 under mpirun -np " + std::to_string(size));
  check(MPI_Intercomm_merge(inter, /*high=*/0, &group), "MPI_Intercomm_merge");
  MPI_Comm_free(&inter);
  return std::make_unique<MpiComm>(group);
}

}  // namespace k3::dist

namespace k3::dist {

// Every node: the group of nnodes processes (one rank per node), in node-rank order. Node 0 starts
// ompi-server, opens an MPI port and hands both to the other nodes through the TCP rendezvous; each
// node then connects to the port; the group grows by one node per MPI_Comm_accept (every member takes
// part in each accept) and is finally ordered by node rank (the order of the connects is not).
std::unique_ptr<Communicator> join_mpi_nodes(const RendezvousOptions& o) {
  validate(o);
  if (o.ranks_per_node != 1)
    throw Error("--nnodes over MPI runs one rank per node so far (--tensor-parallel-size equal to --nnodes); got " +
                std::to_string(o.ranks_per_node) + " per node");
  std::string uri, port;
  if (o.node_rank == 0) {
    uri = start_ompi_server(rendezvous_timeout(o));
  } else {
    const std::string payload = join_rendezvous(o);
    const size_t nl = payload.find('\n');
    uri = payload.substr(0, nl);
    port = nl == std::string::npos ? "" : payload.substr(nl + 1);
    if (uri.empty() || port.empty() || port.size() >= MPI_MAX_PORT_NAME) throw Error("rendezvous: a malformed answer from node 0");
  }
  // Read by MPI_Init: where ompi-server is (the same for every node).
  ::setenv("OMPI_MCA_pmix_server_uri", uri.c_str(), 1);
  acquire_mpi();
  MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
  MPI_Comm group = MPI_COMM_NULL, inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
  if (o.node_rank == 0) {
    char name[MPI_MAX_PORT_NAME] = {};
    check(MPI_Open_port(MPI_INFO_NULL, name), "MPI_Open_port");
    port = name;
    serve_rendezvous(o, uri + "\n" + port);
    check(MPI_Comm_dup(MPI_COMM_SELF, &group), "MPI_Comm_dup");
  } else {
    check(MPI_Comm_connect(port.c_str(), MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter), "MPI_Comm_connect");
    check(MPI_Intercomm_merge(inter, /*high=*/1, &group), "MPI_Intercomm_merge");
    MPI_Comm_free(&inter);
  }
  for (;;) {
    int n = 0;
    MPI_Comm_size(group, &n);
    if (n == o.nnodes) break;
    MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN);
    check(MPI_Comm_accept(port.c_str(), MPI_INFO_NULL, 0, group, &inter), "MPI_Comm_accept");
    check(MPI_Intercomm_merge(inter, /*high=*/0, &merged), "MPI_Intercomm_merge");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&group);
    group = merged;
  }
  if (o.node_rank == 0) MPI_Close_port(port.c_str());
  MPI_Comm ordered = MPI_COMM_NULL;
  check(MPI_Comm_split(group, 0, o.node_rank, &ordered), "MPI_Comm_split");
  MPI_Comm_free(&group);
  return std::make_unique<MpiComm>(ordered);
}

}  // namespace k3::dist
