// Which pages of a range this process holds in memory now (what its RSS counts), for the tests of
// MappedFile::release and of the experts' copies replacing their stored pages. Not mincore: it answers for the page
// cache, so a private file mapping's page that MADV_DONTNEED dropped from the process still reads as resident there.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace k3test {

inline size_t page_size() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

// Whether each of the `pages` pages from the page holding p is mapped in this process's page tables
// (/proc/self/pagemap: bit 63, "present"; readable without privileges, which only hides the frame numbers).
inline std::vector<bool> pages_present(const void* p, size_t pages) {
  std::vector<bool> out(pages, false);
  const int fd = ::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  const uint64_t first = reinterpret_cast<uintptr_t>(p) / page_size();
  std::vector<uint64_t> e(pages);
  const auto want = static_cast<ssize_t>(pages * sizeof(uint64_t));
  if (::pread(fd, e.data(), static_cast<size_t>(want), static_cast<off_t>(first * sizeof(uint64_t))) == want)
    for (size_t i = 0; i < pages; ++i) out[i] = (e[i] >> 63) & 1;
  ::close(fd);
  return out;
}

// Pages present among the whole pages inside [p, p + n).
inline size_t whole_pages_present(const void* p, size_t n) {
  const size_t pg = page_size();
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), lo = (a + pg - 1) / pg * pg, hi = (a + n) / pg * pg;
  if (lo >= hi) return 0;
  size_t c = 0;
  for (bool b : pages_present(reinterpret_cast<const void*>(lo), (hi - lo) / pg)) c += b;
  return c;
}

// /proc/self/smaps: the mappings overlapping [a, b), each with its range, its file (empty: anonymous) and its Rss.
struct Vma {
  uintptr_t lo = 0, hi = 0;
  std::string file;
  int64_t rss_kb = -1;
};
inline std::vector<Vma> vmas_overlapping(uintptr_t a, uintptr_t b) {
  std::vector<Vma> out;
  std::ifstream f("/proc/self/smaps");
  std::string line;
  bool in = false;
  while (std::getline(f, line)) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    std::istringstream ls(line);
    if (line.find("Rss:") == 0) {
      if (in) std::istringstream(line.substr(4)) >> out.back().rss_kb;
    } else if ((ls >> std::hex >> lo >> dash >> hi) && dash == '-') {
      in = lo < b && hi > a;
      if (!in) continue;
      std::string perms, off, dev, inode, file;
      ls >> perms >> off >> dev >> inode;
      std::getline(ls >> std::ws, file);
      out.push_back({static_cast<uintptr_t>(lo), static_cast<uintptr_t>(hi), file, -1});
    }
  }
  return out;
}

}  // namespace k3test
