// LocalComm: the communicator of a single process, and the factory functions that do not need MPI.
#include <cstdlib>
#include <cstring>

#include "k3/core/error.h"
#include "k3/dist/communicator.h"
#include "k3/dist/launcher.h"

namespace k3::dist {

namespace {

class LocalComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "local"; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void* send, size_t bytes, void* recv) override {
    if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  }
  void gather(const void* send, size_t bytes, void* recv, int root) override {
    if (root != 0) throw Error("gather: root " + std::to_string(root) + " is not a rank of a one-process communicator");
    if (bytes > 0 && send != recv) std::memmove(recv, send, bytes);
  }
  void broadcast(void*, size_t, int root) override {
    if (root != 0) throw Error("broadcast: root " + std::to_string(root) + " is not a rank of a one-process communicator");
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) override {
    if (send_bytes.size() != 1 || recv_bytes.size() != 1 || send_bytes[0] != recv_bytes[0])
      throw Error("all_to_all_v: one rank sends to itself exactly what it receives");
    if (send_bytes[0] > 0 && send != recv) std::memmove(recv, send, send_bytes[0]);
  }
  void barrier() override {}
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

}  // namespace

std::unique_ptr<Communicator> make_local_comm() { return std::make_unique<LocalComm>(); }

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(v) != nullptr) return true;
  return false;
}

int launcher_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* s = std::getenv(v);
    if (s == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(s, &end, 10);
    return (end != s && *end == '\0' && n > 0 && n < (1 << 20)) ? static_cast<int>(n) : 0;
  }
  return 0;
}

}  // namespace k3::dist
