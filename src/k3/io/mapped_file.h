// A read-only view of a whole file: memory-mapped (the default: no copy, loads in seconds, pages the kernel may
// drop and re-read -- what the bigger-than-RAM expert residency builds on), or read into anonymous memory
// (FileLoad::Read, `--no-mmap` as in llama.cpp: the whole file in RAM up front, 2 MB aligned and offered to
// transparent huge pages). Read exists because the CPU decode kernels stream weights faster from it: +3-20% tok/s on
// the dev box's Xeon at 2 threads, where llama.cpp gained 1-11% from its own read mode (docs/perf/cpu.md, session 32).
//
// Either view can give back the memory of a range the caller is done with (release): the CPU's copies of the routed
// experts (backend/cpu/decode_layout.h) replace the stored experts' pages that way instead of doubling them.
#pragma once
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

namespace k3 {

enum class FileLoad { Mmap, Read };

// The mode MappedFiles constructed after this call use (process-wide, like the compute options: set once by the CLI
// before a model is loaded). Default Mmap.
void set_file_load(FileLoad mode);
FileLoad file_load();

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws k3::Error (unreadable, short read, out of memory)
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Read into memory (FileLoad::Read), not mapped.
  bool in_memory() const { return read_; }
  // Whether [p, p + n) lies inside [data(), data() + size()) (n == 0: p inside or at the end).
  bool contains(const uint8_t* p, size_t n) const;

  // The caller will not read [p, p + n) again soon: the whole pages inside it give their memory back, and the bytes
  // STAY READABLE AND UNCHANGED (a later read costs a page fault and, for pages the page cache dropped, a disk read):
  //  - mapped: the pages leave this process (MADV_DONTNEED; a private mapping never written re-reads the file at the
  //    next touch; the page cache keeps them until the kernel needs the memory);
  //  - read into memory: the range's anonymous copy is replaced by a read-only private mapping of the same bytes of
  //    the file (reopened by path) -- unless that file is gone or is no longer the one read (device, inode, size or
  //    mtime differ): then nothing is released, the copy being the only right bytes left.
  // The partial pages at the ends stay, except the file's last page, which holds nothing but the file's last bytes: a
  // range holding all of them releases it. Returns the bytes released (0: none; also where the kernel refused, e.g.
  // mlocked pages). n == 0 does nothing, whatever p; otherwise a range not inside [data(), data() + size()) throws
  // k3::Error. const: what the view shows does not change. Load time only, one thread, nothing else reading the range
  // meanwhile: not thread-safe.
  // Read into memory, a 2 MB page the range shares with bytes outside it is split, those bytes then on 4 KB pages (the
  // kl-1b GGUF's experts released: 231 of its ~260 MB of other bytes stayed on 2 MB pages; releasing by 2 MB instead
  // kept 268 MB there, and measured the same decode rate within this box's noise, but would release nothing of a
  // layer whose experts take less than 4 MB, as the test model's).
  size_t release(const uint8_t* p, size_t n) const;

 private:
  size_t release_read_copy(uint8_t* lo, size_t len) const;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool read_ = false;
  dev_t dev_ = 0;  // what was read (release checks that the file at path_ is still it)
  ino_t ino_ = 0;
  timespec mtime_{};
  void* base_ = nullptr;  // what munmap releases: the file mapping, or the anonymous region holding the copy
  size_t map_len_ = 0;
};

}  // namespace k3
