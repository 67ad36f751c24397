#include "k3/io/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "k3/core/error.h"
#include "k3/io/json_depth.h"
#include "k3/io/regular_file.h"

namespace k3 {

namespace fs = std::filesystem;
using nlohmann::json;

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// The header's top-level keys in order of appearance. nlohmann keeps only the last of duplicated
// keys, so a second entry for a tensor would silently replace the first: collect them to reject it.
json parse_header(const uint8_t* begin, const uint8_t* end, std::vector<std::string>& keys) {
  json::parser_callback_t cb = [&keys](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1) keys.push_back(parsed.get<std::string>());
    return true;
  };
  return json::parse(begin, end, cb);
}

// data_offsets entries and dimensions: JSON integers only (1.5 or -1 must not be converted).
uint64_t header_uint(const json& v, const std::string& where, const char* what) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    throw Error(where + ": " + what + " must be a non-negative integer, got " + v.dump());
  return v.get<uint64_t>();
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const size_t size = file_.size();
  if (size < 8) throw Error("'" + path + "': truncated safetensors file (" + std::to_string(size) + " bytes)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(file_.data()[i]) << (8 * i);
  if (hlen > size - 8 || hlen > (100ull << 20))
    throw Error("'" + path + "': corrupt header: header length " + std::to_string(hlen) + " but file has " +
                std::to_string(size) + " bytes");
  json h;
  std::vector<std::string> keys;
  check_json_depth(std::string_view(reinterpret_cast<const char*>(file_.data()) + 8, hlen), "'" + path + "': header");
  try {
    h = parse_header(file_.data() + 8, file_.data() + 8 + hlen, keys);
  } catch (const json::exception& e) {
    throw Error("'" + path + "': corrupt header: " + e.what());
  }
  if (!h.is_object()) throw Error("'" + path + "': corrupt header: not a JSON object");
  std::sort(keys.begin(), keys.end());
  if (auto d = std::adjacent_find(keys.begin(), keys.end()); d != keys.end())
    throw Error("'" + path + "': corrupt header: tensor '" + *d + "' is listed twice");
  const uint8_t* base = file_.data() + 8 + hlen;
  const uint64_t data_size = size - 8 - hlen;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = "'" + path + "': tensor '" + it.key() + "'";
    const json& e = it.value();
    try {
      if (!e.is_object()) throw Error(where + ": header entry must be an object");
      TensorInfo t;
      t.name = it.key();
      t.file = path;
      std::string dt = e.at("dtype").get<std::string>();
      if (!parse_dtype(dt, &t.dtype)) throw Error(where + ": unknown dtype '" + dt + "'");
      const json& shape = e.at("shape");
      if (!shape.is_array() || shape.size() > 8) throw Error(where + ": shape must be an array of at most 8 dimensions");
      // Bytes = dtype size x every dimension, checked for overflow at each step: a shape like
      // [2^32, 2^32] must fail here, not wrap around to a small size that passes the range check.
      // The element count is checked too (a zero dimension makes the bytes 0 whatever follows), so
      // that TensorInfo::numel() cannot overflow later.
      uint64_t expect = dtype_size(t.dtype), elems = 1;
      for (const auto& d : shape) {
        const uint64_t v = header_uint(d, where, "a dimension");
        if (__builtin_mul_overflow(expect, v, &expect) || __builtin_mul_overflow(elems, v, &elems) ||
            elems > static_cast<uint64_t>(INT64_MAX))
          throw Error(where + ": shape " + shape.dump() + " is too large (byte count overflows)");
        t.shape.push_back(static_cast<int64_t>(v));
      }
      const auto& off = e.at("data_offsets");
      if (!off.is_array() || off.size() != 2) throw Error(where + ": data_offsets must be [begin, end]");
      const uint64_t b = header_uint(off[0], where, "data_offsets"), en = header_uint(off[1], where, "data_offsets");
      if (b > en) throw Error(where + ": data_offsets begin > end");
      if (en > data_size)
        throw Error(where + ": data ends at byte " + std::to_string(en) + " but the file holds only " +
                    std::to_string(data_size) + " data bytes (truncated file?)");
      if (en - b != expect)
        throw Error(where + ": " + std::to_string(en - b) + " bytes for " + dt + " " + t.shape_str() +
                    " (expected " + std::to_string(expect) + ")");
      t.data = base + b;
      t.nbytes = static_cast<size_t>(expect);
      ranges.emplace_back(b, en);
      tensors_.emplace(t.name, std::move(t));
    } catch (const json::exception& ex) {
      throw Error(where + ": malformed header entry: " + ex.what());
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) throw Error("'" + path + "': corrupt header: tensor data overlaps");
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  std::error_code ec;  // symlink loops and unreadable entries must end in k3::Error, not filesystem_error
  if (!fs::is_directory(dir, ec)) throw Error("checkpoint directory '" + dir + "' does not exist or is not a directory");
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(fs::symlink_status(index_path, ec))) {
    json j;
    try {
      const std::string text = read_regular_file(index_path.string(), 64u << 20, "checkpoint index");
      check_json_depth(text, "'" + index_path.string() + "'");
      j = json::parse(text);
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it)
        weight_map[it.key()] = it.value().get<std::string>();
    } catch (const json::exception& e) {
      throw Error("'" + index_path.string() + "': malformed index: " + e.what());
    }
    std::set<std::string> uniq;
    for (auto& [t, s] : weight_map) {
      if (s.empty() || s.find('/') != std::string::npos || s.find('\\') != std::string::npos || s == "." ||
          s.find("..") != std::string::npos || s.find('\0') != std::string::npos)
        throw Error("'" + index_path.string() + "': shard name '" + s + "' must be a plain file name");
      uniq.insert(s);
    }
    shard_names.assign(uniq.begin(), uniq.end());
  } else {
    for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      if (it->path().extension() == ".safetensors") shard_names.push_back(it->path().filename().string());
    if (ec) throw Error("cannot list checkpoint directory '" + dir + "': " + ec.message());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty())
      throw Error("'" + dir + "' holds neither model.safetensors.index.json nor any *.safetensors file");
  }
  for (const auto& s : shard_names) {
    const std::string p = (fs::path(dir) / s).string();
    if (!fs::exists(fs::symlink_status(p, ec))) throw Error("shard '" + p + "' listed in the index is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    for (const auto& [name, info] : files_.back()->tensors()) {
      auto [it, fresh] = index_.emplace(name, &info);
      if (!fresh) throw Error("tensor '" + name + "' appears in both '" + it->second->file + "' and '" + p + "'");
    }
  }
  for (const auto& [t, s] : weight_map) {
    auto it = index_.find(t);
    if (it != index_.end() && fs::path(it->second->file).filename() != s)
      throw Error("tensor '" + t + "' is listed in the index under '" + s + "' but is in '" + it->second->file + "'");
    if (it == index_.end())
      throw Error("tensor '" + t + "' is listed in the index under '" + s + "' but that shard does not hold it");
  }
}

Checkpoint::Checkpoint(std::string label, std::vector<TensorInfo> tensors, std::vector<const MappedFile*> maps,
                       std::shared_ptr<const void> owner, std::function<std::string(const std::string&)> note)
    : dir_(std::move(label)), adapted_(std::move(tensors)), adapted_maps_(std::move(maps)), owner_(std::move(owner)),
      note_(std::move(note)) {
  for (const TensorInfo& t : adapted_)
    if (!index_.emplace(t.name, &t).second) throw Error("'" + dir_ + "': tensor '" + t.name + "' appears twice");
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

std::vector<const MappedFile*> Checkpoint::mappings() const {
  std::vector<const MappedFile*> m;
  for (const auto& f : files_) m.push_back(&f->mapping());
  m.insert(m.end(), adapted_maps_.begin(), adapted_maps_.end());
  return m;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& [k, v] : index_) n += v->nbytes;
  return n;
}

}  // namespace k3
