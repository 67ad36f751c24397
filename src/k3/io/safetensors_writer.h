// Writes one safetensors file: tensors added as views (their bytes must stay valid until write()) or as
// owned copies, then one pass that writes the header (JSON, padded with spaces to 8 bytes, as the format's
// reference writer does) and the data in the order added. Used by tools that derive a checkpoint from
// another (k3 prune), so the big tensors are copied straight from the source mapping.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "k3/core/dtype.h"

namespace k3 {

class SafetensorsWriter {
 public:
  // Throws k3::Error when bytes != numel(shape) x dtype size or the name is taken.
  void add_view(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes);
  void add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  size_t data_bytes() const { return data_bytes_; }
  bool empty() const { return entries_.empty(); }
  // Writes the file (to path + ".tmp", then renamed: a failed write leaves no half file). Throws k3::Error.
  void write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const uint8_t* data;
    size_t bytes;
    size_t owned = SIZE_MAX;  // index in owned_ when the writer holds the bytes
  };
  void add(Entry e);
  std::vector<Entry> entries_;
  std::vector<std::vector<uint8_t>> owned_;
  std::map<std::string, std::string> metadata_;
  size_t data_bytes_ = 0;
};

}  // namespace k3
