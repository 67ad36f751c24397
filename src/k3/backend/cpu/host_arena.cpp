#include "k3/backend/cpu/host_arena.h"

#include <algorithm>

#include "k3/core/error.h"

namespace k3::cpu {

namespace {
constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void* HostArena::take(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1));
  if (chunks_.empty() || chunks_.back().off + bytes > chunks_.back().size) {
    Chunk c;
    c.size = std::max(bytes, chunks_.empty() ? size_t{1} << 20 : chunks_.back().size * 2);
    c.mem.reset(new std::byte[c.size + kAlign]);
    c.base = used_;
    chunks_.push_back(std::move(c));
  }
  Chunk& c = chunks_.back();
  std::byte* base = c.mem.get();
  base += (kAlign - reinterpret_cast<uintptr_t>(base) % kAlign) % kAlign;
  void* p = base + c.off;
  c.off += bytes;
  used_ = c.base + c.off;
  high_ = std::max(high_, used_);
  return p;
}

void HostArena::release(size_t mark) {
  if (mark > used_) throw Error("HostArena: release past the top of the stack");
  // Chunks started after the mark go (reset() merges at the next step, so this is warm-up only).
  while (chunks_.size() > 1 && chunks_.back().base >= mark) chunks_.pop_back();
  if (!chunks_.empty()) chunks_.back().off = mark - chunks_.back().base;
  used_ = mark;
}

void HostArena::reset() {
  release(0);
  if (chunks_.size() > 1 || (chunks_.size() == 1 && chunks_[0].size < high_)) {
    chunks_.clear();
    Chunk c;
    c.size = round_up(high_);
    c.mem.reset(new std::byte[c.size + kAlign]);
    chunks_.push_back(std::move(c));
  }
}

}  // namespace k3::cpu
