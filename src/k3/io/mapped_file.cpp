#include "k3/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "k3/core/error.h"
#include "k3/io/regular_file.h"

namespace k3 {

namespace {

std::atomic<FileLoad> g_file_load{FileLoad::Mmap};

constexpr size_t kHuge = size_t{2} << 20;

// The file's bytes into a fresh anonymous region (2 MB aligned inside it, MADV_HUGEPAGE asked), made read-only
// afterwards. Returns the region (base, len) and the data pointer; throws with the file's name on any failure.
const uint8_t* read_whole(int fd, const std::string& path, size_t size, void** base, size_t* len) {
  *len = (size + kHuge - 1) / kHuge * kHuge + kHuge;  // + one huge page of slack for the alignment
  // Not MAP_NORESERVE: the kernel's overcommit check refuses a file far bigger than memory here, with an error that
  // names the file, instead of the OOM killer ending the process halfway through the read.
  void* p = ::mmap(nullptr, *len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("cannot reserve " + std::to_string(size >> 20) + " MiB to read '" + path + "' into memory (--no-mmap): " +
                std::strerror(errno));
  *base = p;
  auto* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1));
  ::madvise(a, size, MADV_HUGEPAGE);  // a hint: without THP the copy still works
  const auto t0 = std::chrono::steady_clock::now();
  const bool progress = size >= (size_t{8} << 30);
  if (progress) std::fprintf(stderr, "k3: reading '%s' (%.1f GB) into memory (--no-mmap)\n", path.c_str(), size / 1e9);
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::pread(fd, a + got, std::min<size_t>(size - got, size_t{1} << 30), static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int e = r < 0 ? errno : 0;
      ::munmap(p, *len);
      throw Error("cannot read '" + path + "' into memory (--no-mmap): " +
                  (e ? std::string(std::strerror(e)) : "the file ended after " + std::to_string(got) + " of " + std::to_string(size) + " bytes"));
    }
    got += static_cast<size_t>(r);
  }
  ::mprotect(p, *len, PROT_READ);  // read-only like the mapping: a stray write faults
  if (progress)
    std::fprintf(stderr, "k3: read '%s' in %.1f s\n", path.c_str(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return a;
}

}  // namespace

void set_file_load(FileLoad mode) { g_file_load.store(mode); }
FileLoad file_load() { return g_file_load.load(); }

MappedFile::MappedFile(const std::string& path) : path_(path) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, "file", &size);  // never blocks on a FIFO or device
  size_ = static_cast<size_t>(size);
  if (size_ == 0) {
    ::close(fd);
    return;
  }
  if (file_load() == FileLoad::Read) {
    try {
      data_ = read_whole(fd, path, size_, &base_, &map_len_);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    return;
  }
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    ::close(fd);
    throw Error("cannot mmap '" + path + "': " + std::strerror(e));
  }
  base_ = p;
  map_len_ = size_;
  data_ = static_cast<const uint8_t*>(p);
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (base_) ::munmap(base_, map_len_);
}

}  // namespace k3
