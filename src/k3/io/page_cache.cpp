#include "k3/io/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "k3/core/error.h"
#include "k3/io/regular_file.h"

namespace k3 {

namespace {

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

void prefetch_mapped(const void* p, size_t n) {
  if (n == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n + page - 1) / page * page;
  ::madvise(reinterpret_cast<void*>(b), e - b, MADV_WILLNEED);  // a hint: failure only costs speed
}

int64_t resident_file_bytes(const std::string& path) {
  uint64_t size = 0;
  Fd f{open_regular_file(path, "file", &size)};
  if (size == 0) return 0;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) throw Error("cannot mmap '" + path + "': " + std::strerror(errno));
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  int64_t resident = 0;
  if (::mincore(p, size, vec.data()) == 0)
    for (unsigned char v : vec) resident += (v & 1) ? static_cast<int64_t>(page) : 0;
  ::munmap(p, size);
  return std::min<int64_t>(resident, static_cast<int64_t>(size));
}

int64_t evict_file_pages(const std::string& path) {
  const int64_t before = resident_file_bytes(path);
  uint64_t size = 0;
  Fd f{open_regular_file(path, "file", &size)};
  ::fdatasync(f.fd);  // dirty pages cannot be dropped (a file just written)
  if (const int e = ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED); e != 0)
    throw Error("cannot evict '" + path + "' from the page cache: " + std::strerror(e));
  return before;
}

DiskReadResult measure_disk_read(const std::string& path, int64_t max_bytes, int64_t block, bool random) {
  if (block < 4096 || block % 4096 != 0) throw Error("block size must be a positive multiple of 4096 bytes");
  uint64_t size = 0;
  Fd probe{open_regular_file(path, "file", &size)};
  DiskReadResult r;
  Fd f{::open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC)};
  r.direct = f.fd >= 0;
  if (!r.direct) {  // file systems without O_DIRECT (tmpfs): buffered reads of the evicted file
    f.fd = ::dup(probe.fd);
    ::posix_fadvise(f.fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  const int64_t n_blocks = std::min<int64_t>(static_cast<int64_t>(size), max_bytes) / block;
  if (n_blocks <= 0) throw Error("'" + path + "' is smaller than one block (" + std::to_string(block) + " bytes)");
  std::vector<int64_t> order(static_cast<size_t>(n_blocks));
  std::iota(order.begin(), order.end(), 0);
  if (random) {
    std::mt19937_64 rng(1);
    const int64_t span = static_cast<int64_t>(size) / block;  // random over the whole file
    for (auto& b : order) b = static_cast<int64_t>(rng() % static_cast<uint64_t>(span));
  }
  void* raw = nullptr;
  if (::posix_memalign(&raw, 4096, static_cast<size_t>(block)) != 0) throw Error("out of memory for the read buffer");
  std::unique_ptr<void, decltype(&std::free)> buf(raw, &std::free);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b : order) {
    const ssize_t got = ::pread(f.fd, buf.get(), static_cast<size_t>(block), static_cast<off_t>(b * block));
    if (got < 0) throw Error("read error on '" + path + "': " + std::strerror(errno));
    r.bytes += got;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace k3
