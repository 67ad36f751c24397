// Host-side staging of a CUDA step: pinned memory that grows, and the builder of the one block of step
// data (token maps, page tables, state descriptors) uploaded with one cudaMemcpyAsync per step.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"

namespace k3::cuda {

// Pinned host memory that grows.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  void* ensure(size_t bytes) {
    if (bytes > cap_) {
      if (p_) cudaFreeHost(p_);
      p_ = nullptr;
      cap_ = std::max(bytes, cap_ * 2);
      K3_CUDA_CHECK(cudaMallocHost(&p_, cap_));
      ++generation_;
    }
    return p_;
  }
  // Bumped on every move: a captured graph that copies to or from the buffer is stale after one.
  uint64_t generation() const { return generation_; }

 private:
  void* p_ = nullptr;
  size_t cap_ = 0;
  uint64_t generation_ = 0;
};

// A timing-free CUDA event, created on first use.
class CudaEvent {
 public:
  CudaEvent() = default;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  cudaEvent_t get() {
    if (!e_) K3_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming));
    return e_;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

// Host-side builder of the staging block: items appended at 16-byte-aligned offsets.
class Staging {
 public:
  template <typename T>
  size_t put(const T* data, size_t count) {
    const size_t off = (bytes_.size() + 15) / 16 * 16;
    bytes_.resize(off + count * sizeof(T));
    if (count) std::memcpy(bytes_.data() + off, data, count * sizeof(T));
    return off;
  }
  template <typename T>
  size_t put(const std::vector<T>& v) { return put(v.data(), v.size()); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  void clear() { bytes_.clear(); }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace k3::cuda
