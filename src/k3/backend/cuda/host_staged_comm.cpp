// host_staged_comm.h: device operands through pinned host buffers to a host communicator.
#include "k3/backend/cuda/host_staged_comm.h"

#include <cuda_runtime_api.h>

#include <numeric>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/host_staging.h"

namespace k3::cuda {

namespace {

class HostStagedComm final : public dist::Communicator {
 public:
  HostStagedComm(dist::Communicator& host, cudaStream_t stream) : host_(host), stream_(stream) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return host_.name() + " (host-staged)"; }

  void all_reduce_sum(float* x, size_t n) override {
    float* h = static_cast<float*>(down(x, n * sizeof(float), send_));
    host_.all_reduce_sum(h, n);
    up(x, h, n * sizeof(float));
  }
  void all_gather(const void* send, size_t bytes, void* recv) override {
    const void* s = down(send, bytes, send_);
    void* r = recv_.ensure(bytes * static_cast<size_t>(size()));
    host_.all_gather(s, bytes, r);
    up(recv, r, bytes * static_cast<size_t>(size()));
  }
  void gather(const void* send, size_t bytes, void* recv, int root) override {
    const void* s = down(send, bytes, send_);
    const bool here = rank() == root;
    void* r = here ? recv_.ensure(bytes * static_cast<size_t>(size())) : nullptr;
    host_.gather(s, bytes, r, root);
    if (here) up(recv, r, bytes * static_cast<size_t>(size()));
  }
  void broadcast(void* data, size_t bytes, int root) override {
    void* h = down(data, bytes, send_);
    host_.broadcast(h, bytes, root);
    up(data, h, bytes);
  }
  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) override {
    const size_t sb = std::accumulate(send_bytes.begin(), send_bytes.end(), size_t{0});
    const size_t rb = std::accumulate(recv_bytes.begin(), recv_bytes.end(), size_t{0});
    const void* s = down(send, sb, send_);
    void* r = recv_.ensure(std::max<size_t>(rb, 1));
    host_.all_to_all_v(s, send_bytes, r, recv_bytes);
    up(recv, r, rb);
  }
  void barrier() override {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_.barrier();
  }
  [[noreturn]] void abort(int code) override { host_.abort(code); }

 private:
  // The device bytes at `d` in pinned memory, once the stream has produced them.
  void* down(const void* d, size_t bytes, PinnedBuffer& buf) {
    void* h = buf.ensure(std::max<size_t>(bytes, 1));
    if (bytes > 0) K3_CUDA_CHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, stream_));
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }
  // Back to the device, ordered before the stream's next kernels (the host buffer is reused only after the
  // next collective's synchronisation, by which time this copy is done).
  void up(void* d, const void* h, size_t bytes) {
    if (bytes > 0) K3_CUDA_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_));
  }

  dist::Communicator& host_;
  cudaStream_t stream_;
  PinnedBuffer send_, recv_;
};

}  // namespace

std::unique_ptr<dist::Communicator> make_host_staged_comm(dist::Communicator& host, void* stream) {
  return std::make_unique<HostStagedComm>(host, static_cast<cudaStream_t>(stream));
}

}  // namespace k3::cuda
