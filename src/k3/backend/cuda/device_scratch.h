// DeviceScratch: the CUDA backend's step scratch (graph::Backend::scratch): a stack of 256-byte-aligned
// allocations in device memory. Addresses must be the same from one step to the next of the same shape
// (captured CUDA graphs replay them), so the arena moves only in reserve(), between steps, and every
// move bumps generation(). Within a step an overflow takes an extra chunk (also a new generation);
// the next reserve() merges the chunks into one of the high-water size.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"

namespace k3::cuda {

class DeviceScratch {
 public:
  void* take(size_t bytes);
  size_t mark() const { return used_; }
  void release(size_t mark);
  // Between steps (no queued work may use the arena): make one chunk of at least `bytes` (and of the
  // last step's high-water mark).
  void reserve(size_t bytes);
  size_t high_water() const { return high_; }
  // The most taken at once since the last reserve().
  size_t step_peak() const { return peak_; }
  uint64_t generation() const { return generation_; }

 private:
  struct Chunk {
    DeviceBuffer mem;
    size_t off = 0, base = 0;
  };
  std::vector<Chunk> chunks_;
  std::vector<Chunk> retired_;  // popped within a step; freed at the next reserve()
  size_t used_ = 0, high_ = 0, peak_ = 0;
  uint64_t generation_ = 1;
};

}  // namespace k3::cuda
