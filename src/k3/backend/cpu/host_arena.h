// HostArena: the CPU backend's step scratch. A stack of 64-byte-aligned allocations over chunks that
// never move while in use (a step that outgrows the chunks gets a new one); when a step needed more than
// one chunk, the next step starts from one chunk of the high-water size, so a warm arena is one block.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace k3::cpu {

class HostArena {
 public:
  void* take(size_t bytes);
  size_t mark() const { return used_; }
  void release(size_t mark);
  // At the start of a step (nothing taken): merge the chunks of the last step into one.
  void reset();

 private:
  struct Chunk {
    std::unique_ptr<std::byte[]> mem;
    size_t size = 0, off = 0;
    size_t base = 0;  // `used_` at the chunk's first byte
  };
  std::vector<Chunk> chunks_;
  size_t used_ = 0, high_ = 0;
};

}  // namespace k3::cpu
