// Page-cache helpers for files read through mappings (models bigger than RAM): evicting a file's clean
// pages without root (posix_fadvise DONTNEED, what `echo 3 > drop_caches` would do for just this file),
// and measuring a file's read bandwidth from storage with O_DIRECT (page cache bypassed).
#pragma once
#include <cstdint>
#include <string>

namespace k3 {

// Asks the kernel to drop `path`'s cached pages; pages some process maps stay. Returns the bytes of the
// file that were resident before (mincore over a temporary mapping). Throws k3::Error if it cannot open it.
int64_t evict_file_pages(const std::string& path);

// Starts reading [p, p + n) of a file mapping into the page cache (MADV_WILLNEED over the pages it
// touches) without waiting. A later touch of those pages then does not fault in the kernel's read-around
// window (read_ahead_kb, often MBs) of neighbouring data: only what was asked for is read.
void prefetch_mapped(const void* p, size_t n);

// Bytes of `path` resident in the page cache now.
int64_t resident_file_bytes(const std::string& path);

struct DiskReadResult {
  int64_t bytes = 0;
  double seconds = 0;
  bool direct = false;  // O_DIRECT worked (else buffered reads of an evicted file)
  double gbps() const { return seconds > 0 ? double(bytes) / seconds / 1e9 : 0.0; }
};

// Reads up to `max_bytes` of `path` in `block`-byte reads: sequentially from the start, or (random) at
// block-aligned offsets from a seeded shuffle, each block once. Throws k3::Error on an I/O error.
DiskReadResult measure_disk_read(const std::string& path, int64_t max_bytes, int64_t block, bool random);

}  // namespace k3
