#include "k3/runtime/cache_memory.h"

#include <cstring>
#include <new>

#include "k3/core/error.h"

namespace k3 {

namespace {
class HostCacheMemory final : public CacheMemory {
 public:
  float* allocate(size_t floats) override {
    // Not touched here: the OS commits the memory page by page as the cache fills.
    float* p = new (std::nothrow) float[floats];
    if (!p) throw Error("cannot allocate " + std::to_string(floats * 4 >> 20) + " MiB of host memory for the cache");
    return p;
  }
  void release(float* p) override { delete[] p; }
  void copy(float* dst, const float* src, size_t floats) override { std::memcpy(dst, src, floats * 4); }
  void zero(float* dst, size_t floats) override { std::memset(dst, 0, floats * 4); }
};
}  // namespace

std::shared_ptr<CacheMemory> host_cache_memory() {
  static std::shared_ptr<CacheMemory> m = std::make_shared<HostCacheMemory>();
  return m;
}

}  // namespace k3
