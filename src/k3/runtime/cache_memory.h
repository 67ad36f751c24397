// Where a cache's floats live. The cache manager (hybrid_cache.h) keeps the books and moves state with
// these four operations only, so the same manager serves the CPU backend (host memory) and the CUDA
// backend (device memory, copies ordered on the model's stream).
#pragma once
#include <cstddef>
#include <memory>

namespace k3 {

class CacheMemory {
 public:
  virtual ~CacheMemory() = default;
  // One region of `floats` floats, not necessarily zeroed. Throws k3::Error when it cannot be had.
  virtual float* allocate(size_t floats) = 0;
  virtual void release(float* p) = 0;
  virtual void copy(float* dst, const float* src, size_t floats) = 0;
  virtual void zero(float* dst, size_t floats) = 0;
};

// Plain host memory (the CPU backend).
std::shared_ptr<CacheMemory> host_cache_memory();

}  // namespace k3
