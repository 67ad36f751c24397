// A read-only memory-mapped file. Weights stay mapped: no copy, loads in seconds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace k3 {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws k3::Error
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
};

}  // namespace k3
