// NcclComm (nccl_comm.h). all_reduce_sum is ncclAllReduce: NCCL gives every rank the same values, but
// its ring / tree choice (and so the order of the additions) may depend on the size; the MPI path sums
// in rank order instead (mpi_comm.cpp).
#include "k3/dist/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "k3/core/error.h"

namespace k3::dist {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string(what) + " failed: " + ncclGetErrorString(r));
}
void check_cuda(cudaError_t r, const char* what) {
  if (r != cudaSuccess) throw Error(std::string(what) + " failed: " + cudaGetErrorString(r));
}

class NcclComm final : public Communicator {
 public:
  NcclComm(Communicator& bootstrap, int device, cudaStream_t stream)
      : rank_(bootstrap.rank()), size_(bootstrap.size()), stream_(stream) {
    ncclUniqueId id{};
    if (bootstrap.is_root()) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    bootstrap.broadcast(&id, sizeof id, 0);
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    check_nccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
  }
  ~NcclComm() override { ncclCommDestroy(comm_); }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }
  void all_reduce_sum(float* x, size_t n) override {
    check_nccl(ncclAllReduce(x, x, n, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce");
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    check_nccl(ncclAllGather(send, recv, bytes, ncclChar, comm_, stream_), "ncclAllGather");
  }
  // NCCL has no gather: every rank sends to root, root receives from each (one group).
  void gather(const void* send, size_t bytes, void* recv, int root) override {
    if (root < 0 || root >= size_) throw Error("gather: root " + std::to_string(root) + " is not a rank");
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    check_nccl(ncclSend(send, bytes, ncclChar, root, comm_, stream_), "ncclSend");
    if (rank_ == root)
      for (int r = 0; r < size_; ++r)
        check_nccl(ncclRecv(static_cast<char*>(recv) + r * bytes, bytes, ncclChar, r, comm_, stream_), "ncclRecv");
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  void broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= size_) throw Error("broadcast: root " + std::to_string(root) + " is not a rank");
    check_nccl(ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_), "ncclBroadcast");
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) override {
    if (send_bytes.size() != static_cast<size_t>(size_) || recv_bytes.size() != static_cast<size_t>(size_))
      throw Error("all_to_all_v: one count per rank");
    const char* s = static_cast<const char*>(send);
    char* d = static_cast<char*>(recv);
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      check_nccl(ncclSend(s, send_bytes[r], ncclChar, r, comm_, stream_), "ncclSend");
      check_nccl(ncclRecv(d, recv_bytes[r], ncclChar, r, comm_, stream_), "ncclRecv");
      s += send_bytes[r];
      d += recv_bytes[r];
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
  }
  void barrier() override {
    float* one = nullptr;
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&one), sizeof(float), stream_), "cudaMallocAsync");
    check_nccl(ncclAllReduce(one, one, 1, ncclFloat, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    check_cuda(cudaFreeAsync(one, stream_), "cudaFreeAsync");
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    std::_Exit(code);
  }

 private:
  int rank_, size_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_comm(Communicator& bootstrap, int cuda_device, void* stream) {
  return std::make_unique<NcclComm>(bootstrap, cuda_device, static_cast<cudaStream_t>(stream));
}

}  // namespace k3::dist
