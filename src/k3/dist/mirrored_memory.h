// The cache memory of a sharded model, kept identical on every rank. Rank 0's cache manager (HybridCache,
// or a MemorySequence) is the only one that decides anything; it allocates, frees, copies and zeroes
// through a JournaledMemory, which does so on rank 0 and records each operation by (region, offset).
// The journal goes to the other ranks with the next step (step_wire.h), where a MemoryMirror replays it
// on memory of the same layout (every rank's CacheSpec is the same: equal shards), so prefix caching,
// checkpoints, clones and preemption need no other protocol. Pointers into the cache travel as
// CacheRefs and are resolved on each rank.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "k3/runtime/cache_memory.h"

namespace k3::dist {

struct CacheRef {
  uint64_t region = 0, offset = 0;
};

struct MemOp {
  enum Kind : uint8_t { Alloc, Release, Copy, Zero };
  uint8_t kind = Alloc;
  uint64_t region = 0, offset = 0;          // Alloc / Release: the region; Copy / Zero: the destination
  uint64_t src_region = 0, src_offset = 0;  // Copy
  uint64_t bytes = 0;
};

class JournaledMemory final : public CacheMemory {
 public:
  explicit JournaledMemory(std::shared_ptr<CacheMemory> inner) : inner_(std::move(inner)) {}
  uint8_t* allocate(size_t bytes) override;
  void release(uint8_t* p) override;
  void copy(uint8_t* dst, const uint8_t* src, size_t bytes) override;
  void zero(uint8_t* dst, size_t bytes) override;
  // Where `p` is (p .. p + bytes inside one live region), or k3::Error for memory not from here.
  CacheRef locate(const void* p, size_t bytes = 0) const;
  // The operations since the last call, in order.
  std::vector<MemOp> take_journal();

 private:
  struct Region {
    uint64_t id, bytes;
  };
  CacheRef locate_locked(const void* p, size_t bytes) const;
  std::shared_ptr<CacheMemory> inner_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Region> regions_;  // by base address
  uint64_t next_id_ = 1;
  std::vector<MemOp> journal_;
};

class MemoryMirror {
 public:
  explicit MemoryMirror(std::shared_ptr<CacheMemory> mem) : mem_(std::move(mem)) {}
  ~MemoryMirror();
  MemoryMirror(const MemoryMirror&) = delete;
  MemoryMirror& operator=(const MemoryMirror&) = delete;
  // Replays rank 0's operations. Throws k3::Error on a reference to a region it does not hold.
  void apply(const std::vector<MemOp>& ops);
  uint8_t* resolve(CacheRef r, uint64_t bytes = 0) const;
  size_t regions() const { return regions_.size(); }

 private:
  struct Region {
    uint8_t* p;
    uint64_t bytes;
  };
  std::shared_ptr<CacheMemory> mem_;
  std::unordered_map<uint64_t, Region> regions_;
};

}  // namespace k3::dist
