#include "k3/io/safetensors_writer.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "k3/core/error.h"

namespace k3 {

void SafetensorsWriter::add(Entry e) {
  int64_t numel = 1;
  for (int64_t d : e.shape) {
    if (d < 0) throw Error("safetensors writer: tensor '" + e.name + "' has a negative dimension");
    numel *= d;
  }
  if (static_cast<size_t>(numel) * dtype_size(e.dtype) != e.bytes)
    throw Error("safetensors writer: tensor '" + e.name + "' has " + std::to_string(e.bytes) + " bytes for " +
                std::to_string(numel) + " x " + std::string(dtype_name(e.dtype)));
  for (const Entry& x : entries_)
    if (x.name == e.name) throw Error("safetensors writer: tensor '" + e.name + "' added twice");
  data_bytes_ += e.bytes;
  entries_.push_back(std::move(e));
}

void SafetensorsWriter::add_view(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data,
                                 size_t bytes) {
  add(Entry{name, dtype, std::move(shape), static_cast<const uint8_t*>(data), bytes});
}

void SafetensorsWriter::add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape,
                                  std::vector<uint8_t> bytes) {
  const size_t n = bytes.size();
  owned_.push_back(std::move(bytes));
  // The pointer is taken at write() time (owned_ may still grow and move its elements' headers, not data).
  add(Entry{name, dtype, std::move(shape), owned_.back().data(), n, owned_.size() - 1});
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  size_t off = 0;
  for (const Entry& e : entries_) {
    h[e.name] = {{"dtype", std::string(dtype_name(e.dtype))}, {"shape", e.shape}, {"data_offsets", {off, off + e.bytes}}};
    off += e.bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw Error("cannot write '" + tmp + "'");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f) == 8 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  for (const Entry& e : entries_) {
    if (!ok) break;
    const uint8_t* d = e.owned != SIZE_MAX ? owned_[e.owned].data() : e.data;
    ok = e.bytes == 0 || std::fwrite(d, 1, e.bytes, f) == e.bytes;
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error("cannot write '" + path + "' (disk full?)");
  }
}

}  // namespace k3
