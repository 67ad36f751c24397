#include "k3/runtime/cache_memory.h"

#include <cstring>
#include <new>

#include "k3/core/error.h"

namespace k3 {

namespace {
class HostCacheMemory final : public CacheMemory {
 public:
  uint8_t* allocate(size_t bytes) override {
    // Not touched here: the OS commits the memory page by page as the cache fills.
    void* p = ::operator new(bytes ? bytes : 1, std::align_val_t{256}, std::nothrow);
    if (!p) throw Error("cannot allocate " + std::to_string(bytes >> 20) + " MiB of host memory for the cache");
    return static_cast<uint8_t*>(p);
  }
  void release(uint8_t* p) override { ::operator delete(p, std::align_val_t{256}); }
  void copy(uint8_t* dst, const uint8_t* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void zero(uint8_t* dst, size_t bytes) override { std::memset(dst, 0, bytes); }
};
}  // namespace

std::shared_ptr<CacheMemory> host_cache_memory() {
  static std::shared_ptr<CacheMemory> m = std::make_shared<HostCacheMemory>();
  return m;
}

}  // namespace k3
