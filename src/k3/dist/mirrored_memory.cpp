#include "k3/dist/mirrored_memory.h"

#include <string>
#include <utility>

#include "k3/core/error.h"

namespace k3::dist {

uint8_t* JournaledMemory::allocate(size_t bytes) {
  uint8_t* p = inner_->allocate(bytes);
  std::lock_guard lk(mu_);
  const uint64_t id = next_id_++;
  regions_[reinterpret_cast<uintptr_t>(p)] = {id, bytes};
  journal_.push_back({MemOp::Alloc, id, 0, 0, 0, bytes});
  return p;
}

void JournaledMemory::release(uint8_t* p) {
  {
    std::lock_guard lk(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(p));
    if (it == regions_.end()) throw Error("cache memory: release of memory that is not a region");
    journal_.push_back({MemOp::Release, it->second.id, 0, 0, 0, 0});
    regions_.erase(it);
  }
  inner_->release(p);
}

void JournaledMemory::copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  {
    std::lock_guard lk(mu_);
    const CacheRef d = locate_locked(dst, bytes), s = locate_locked(src, bytes);
    journal_.push_back({MemOp::Copy, d.region, d.offset, s.region, s.offset, bytes});
  }
  inner_->copy(dst, src, bytes);
}

void JournaledMemory::zero(uint8_t* dst, size_t bytes) {
  {
    std::lock_guard lk(mu_);
    const CacheRef d = locate_locked(dst, bytes);
    journal_.push_back({MemOp::Zero, d.region, d.offset, 0, 0, bytes});
  }
  inner_->zero(dst, bytes);
}

CacheRef JournaledMemory::locate(const void* p, size_t bytes) const {
  std::lock_guard lk(mu_);
  return locate_locked(p, bytes);
}

CacheRef JournaledMemory::locate_locked(const void* p, size_t bytes) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(a);
  if (it != regions_.begin()) {
    --it;
    const uint64_t off = a - it->first;
    if (off + bytes <= it->second.bytes && (bytes > 0 || off < it->second.bytes)) return {it->second.id, off};
  }
  throw Error("sharded model: a cache pointer outside the runner's cache memory (a cache not made by this runner?)");
}

std::vector<MemOp> JournaledMemory::take_journal() {
  std::lock_guard lk(mu_);
  return std::exchange(journal_, {});
}

MemoryMirror::~MemoryMirror() {
  for (auto& [id, r] : regions_) mem_->release(r.p);
}

uint8_t* MemoryMirror::resolve(CacheRef r, uint64_t bytes) const {
  auto it = regions_.find(r.region);
  if (it == regions_.end() || r.offset > it->second.bytes || bytes > it->second.bytes - r.offset)
    throw Error("sharded model: rank 0 referred to cache region " + std::to_string(r.region) + " + " +
                std::to_string(r.offset) + " that this rank does not hold");
  return it->second.p + r.offset;
}

void MemoryMirror::apply(const std::vector<MemOp>& ops) {
  for (const MemOp& op : ops) {
    switch (op.kind) {
      case MemOp::Alloc:
        if (regions_.count(op.region)) throw Error("sharded model: cache region " + std::to_string(op.region) + " allocated twice");
        regions_[op.region] = {mem_->allocate(static_cast<size_t>(op.bytes)), op.bytes};
        break;
      case MemOp::Release: {
        auto it = regions_.find(op.region);
        if (it == regions_.end()) throw Error("sharded model: release of unknown cache region " + std::to_string(op.region));
        mem_->release(it->second.p);
        regions_.erase(it);
        break;
      }
      case MemOp::Copy:
        mem_->copy(resolve({op.region, op.offset}, op.bytes), resolve({op.src_region, op.src_offset}, op.bytes),
                   static_cast<size_t>(op.bytes));
        break;
      case MemOp::Zero:
        mem_->zero(resolve({op.region, op.offset}, op.bytes), static_cast<size_t>(op.bytes));
        break;
      default:
        throw Error("sharded model: unknown cache operation " + std::to_string(op.kind));
    }
  }
}

}  // namespace k3::dist
