#include "k3/backend/cuda/device_scratch.h"

#include <algorithm>

namespace k3::cuda {

namespace {
constexpr size_t kAlign = 256;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

void* DeviceScratch::take(size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1));
  if (chunks_.empty() || chunks_.back().off + bytes > chunks_.back().mem.bytes()) {
    Chunk c;
    c.mem = DeviceBuffer(std::max(bytes, chunks_.empty() ? size_t{16} << 20 : chunks_.back().mem.bytes()));
    c.base = used_;
    chunks_.push_back(std::move(c));
    ++generation_;
  }
  Chunk& c = chunks_.back();
  void* p = c.mem.get<uint8_t>() + c.off;
  c.off += bytes;
  used_ = c.base + c.off;
  high_ = std::max(high_, used_);
  peak_ = std::max(peak_, used_);
  return p;
}

void DeviceScratch::release(size_t mark) {
  if (mark > used_) throw Error("DeviceScratch: release past the top of the stack");
  // Chunks taken after the mark stay allocated (queued kernels may still use them) but are no longer
  // taken from: the stack continues in the last chunk only, so keep it if it holds the mark.
  while (chunks_.size() > 1 && chunks_.back().base >= mark) {
    retired_.push_back(std::move(chunks_.back()));
    chunks_.pop_back();
  }
  if (!chunks_.empty()) chunks_.back().off = mark - chunks_.back().base;
  used_ = mark;
}

void DeviceScratch::reserve(size_t bytes) {
  retired_.clear();
  peak_ = 0;
  const size_t want = round_up(std::max(bytes, high_));
  if (chunks_.size() == 1 && chunks_[0].mem.bytes() >= want) {
    chunks_[0].off = 0;
    used_ = 0;
    return;
  }
  chunks_.clear();
  Chunk c;
  c.mem = DeviceBuffer(want);
  chunks_.push_back(std::move(c));
  used_ = 0;
  ++generation_;
}

}  // namespace k3::cuda
