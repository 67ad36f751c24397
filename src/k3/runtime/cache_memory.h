// Where a cache's bytes live. The cache manager (hybrid_cache.h) keeps the books and moves state with
// these four operations only, so the same manager serves the CPU backend (host memory) and the CUDA
// backend (device memory, copies ordered on the model's stream).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

namespace k3 {

class CacheMemory {
 public:
  virtual ~CacheMemory() = default;
  // One region of `bytes` bytes (256-byte aligned), not necessarily zeroed. Throws k3::Error when it
  // cannot be had.
  virtual uint8_t* allocate(size_t bytes) = 0;
  virtual void release(uint8_t* p) = 0;
  virtual void copy(uint8_t* dst, const uint8_t* src, size_t bytes) = 0;
  virtual void zero(uint8_t* dst, size_t bytes) = 0;
};

// Plain host memory (the CPU backend).
std::shared_ptr<CacheMemory> host_cache_memory();

}  // namespace k3
