// A read-only view of a whole file: memory-mapped (the default: no copy, loads in seconds, pages the kernel may
// drop and re-read -- what the bigger-than-RAM expert residency builds on), or read into anonymous memory
// (FileLoad::Read, `--no-mmap` as in llama.cpp: the whole file in RAM up front, 2 MB aligned and offered to
// transparent huge pages). Read exists because the CPU decode kernels stream weights faster from it: +3-20% tok/s on
// the dev box's Xeon at 2 threads, where llama.cpp gained 1-11% from its own read mode (docs/perf/cpu.md, session 32).
#pragma once
#include <cstddef>
#include <cstdint>
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

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* base_ = nullptr;  // what munmap releases: the file mapping, or the anonymous region holding the copy
  size_t map_len_ = 0;
};

}  // namespace k3
