// Host-side CUDA helpers: status checks that throw k3::Error with the failing call, and an owning
// device allocation. Used by the CUDA backend's host code only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <utility>

#include "k3/core/error.h"

namespace k3::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what) {
  throw Error(std::string("CUDA: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}
inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda(e, what);
}
#define K3_CUDA_CHECK(call) ::k3::cuda::check((call), #call)

// The current device's SM count, read once (132 if it cannot be read: an H100 / H200): for launch-shape rules.
inline int device_sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    return cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0
               ? v
               : 132;
  }();
  return n;
}

// One cudaMalloc'd region; moves, never copies.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      const cudaError_t e = cudaMalloc(&p_, bytes);
      if (e != cudaSuccess) {
        p_ = nullptr;
        throw Error("CUDA: cannot allocate " + std::to_string(bytes >> 20) + " MiB of device memory: " +
                    cudaGetErrorString(e));
      }
    }
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (p_) cudaFree(p_);
      p_ = std::exchange(o.p_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T = void>
  T* get() const { return static_cast<T*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace k3::cuda
