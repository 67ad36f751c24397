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

size_t page_size() {
  static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// len bytes of fd from off into p; false on an error or a short file.
bool pread_all(int fd, uint8_t* p, size_t len, off_t off) {
  size_t got = 0;
  while (got < len) {
    const ssize_t r = ::pread(fd, p + got, len - got, off + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

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
  struct stat st {};
  if (::fstat(fd, &st) == 0) {
    dev_ = st.st_dev;
    ino_ = st.st_ino;
    mtime_ = st.st_mtim;
  }
  if (file_load() == FileLoad::Read) {
    read_ = true;
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

bool MappedFile::contains(const uint8_t* p, size_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p), d = reinterpret_cast<uintptr_t>(data_);
  return data_ != nullptr && a >= d && a - d <= size_ && n <= size_ - (a - d);
}

size_t MappedFile::release(const uint8_t* p, size_t n) const {
  if (n == 0) return 0;
  if (!contains(p, n)) throw Error("release: bytes outside the view of '" + path_ + "'");
  const size_t page = page_size();
  const auto a = reinterpret_cast<uintptr_t>(p), end = a + n;
  const uintptr_t lo = (a + page - 1) / page * page;
  // The file's last page holds only the file's bytes (and zeros past its end): both views have it to themselves.
  const uintptr_t hi = (end == reinterpret_cast<uintptr_t>(data_) + size_ ? end + page - 1 : end) / page * page;
  if (lo >= hi) return 0;
  if (!read_) return ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED) == 0 ? hi - lo : 0;
  return release_read_copy(reinterpret_cast<uint8_t*>(lo), hi - lo);
}

// [lo, lo + len) (whole pages of the anonymous copy; file offset lo - data_, page-aligned as data_ is 2 MB aligned)
// becomes a read-only private mapping of the same bytes of the file, where the file is still the one read.
size_t MappedFile::release_read_copy(uint8_t* lo, size_t len) const {
  int fd = -1;
  try {
    fd = open_regular_file(path_, "file");
  } catch (const Error&) {
    return 0;  // gone or replaced by something else: keep the copy
  }
  struct stat st {};
  const bool same = ::fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_ &&
                    static_cast<size_t>(st.st_size) == size_ && st.st_mtim.tv_sec == mtime_.tv_sec &&
                    st.st_mtim.tv_nsec == mtime_.tv_nsec;
  const auto off = static_cast<off_t>(lo - data_);
  size_t released = 0;
  if (same && ::mmap(lo, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, off) != MAP_FAILED) {
    released = len;
  } else if (same) {
    // A failed MAP_FIXED may have unmapped the range already (older kernels did): put the bytes back.
    void* q = ::mmap(lo, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (q == MAP_FAILED || !pread_all(fd, lo, std::min(len, size_ - static_cast<size_t>(off)), off)) {
      const int e = errno;
      ::close(fd);
      throw Error("release: cannot restore bytes of '" + path_ + "' after a failed remap: " + std::strerror(e));
    }
    ::mprotect(lo, len, PROT_READ);
  }
  ::close(fd);
  return released;
}

MappedFile::~MappedFile() {
  if (base_) ::munmap(base_, map_len_);
}

}  // namespace k3
