#include "k3/io/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "k3/core/error.h"

namespace k3 {

namespace fs = std::filesystem;
using nlohmann::json;

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const size_t size = file_.size();
  if (size < 8) throw Error("'" + path + "': truncated safetensors file (" + std::to_string(size) + " bytes)");
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(file_.data()[i]) << (8 * i);
  if (hlen > size - 8 || hlen > (100ull << 20))
    throw Error("'" + path + "': corrupt header: header length " + std::to_string(hlen) + " but file has " +
                std::to_string(size) + " bytes");
  json h;
  try {
    h = json::parse(file_.data() + 8, file_.data() + 8 + hlen);
  } catch (const json::exception& e) {
    throw Error("'" + path + "': corrupt header: " + e.what());
  }
  if (!h.is_object()) throw Error("'" + path + "': corrupt header: not a JSON object");
  const uint8_t* base = file_.data() + 8 + hlen;
  const size_t data_size = size - 8 - hlen;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string where = "'" + path + "': tensor '" + it.key() + "'";
    const json& e = it.value();
    try {
      TensorInfo t;
      t.name = it.key();
      t.file = path;
      std::string dt = e.at("dtype").get<std::string>();
      if (!parse_dtype(dt, &t.dtype)) throw Error(where + ": unknown dtype '" + dt + "'");
      for (const auto& d : e.at("shape")) {
        int64_t v = d.get<int64_t>();
        if (v < 0) throw Error(where + ": negative dimension");
        t.shape.push_back(v);
      }
      const auto& off = e.at("data_offsets");
      if (!off.is_array() || off.size() != 2) throw Error(where + ": data_offsets must be [begin, end]");
      uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
      if (b > en) throw Error(where + ": data_offsets begin > end");
      if (en > data_size)
        throw Error(where + ": data ends at byte " + std::to_string(en) + " but the file holds only " +
                    std::to_string(data_size) + " data bytes (truncated file?)");
      size_t expect = static_cast<size_t>(t.numel()) * dtype_size(t.dtype);
      if (en - b != expect)
        throw Error(where + ": " + std::to_string(en - b) + " bytes for " + dt + " " + t.shape_str() +
                    " (expected " + std::to_string(expect) + ")");
      t.data = base + b;
      t.nbytes = expect;
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
  if (!fs::is_directory(dir)) throw Error("checkpoint directory '" + dir + "' does not exist");
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;
  if (fs::exists(index_path)) {
    std::ifstream f(index_path);
    json j;
    try {
      j = json::parse(f);
      for (auto it = j.at("weight_map").begin(); it != j.at("weight_map").end(); ++it)
        weight_map[it.key()] = it.value().get<std::string>();
    } catch (const json::exception& e) {
      throw Error("'" + index_path.string() + "': malformed index: " + e.what());
    }
    std::set<std::string> uniq;
    for (auto& [t, s] : weight_map) {
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        throw Error("'" + index_path.string() + "': shard name '" + s + "' must be a plain file name");
      uniq.insert(s);
    }
    shard_names.assign(uniq.begin(), uniq.end());
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") shard_names.push_back(e.path().filename().string());
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty())
      throw Error("'" + dir + "' holds neither model.safetensors.index.json nor any *.safetensors file");
  }
  for (const auto& s : shard_names) {
    const std::string p = (fs::path(dir) / s).string();
    if (!fs::exists(p)) throw Error("shard '" + p + "' listed in the index is missing");
    files_.push_back(std::make_unique<SafetensorsFile>(p));
    for (const auto& [name, info] : files_.back()->tensors()) {
      auto [it, fresh] = index_.emplace(name, &info);
      if (!fresh) throw Error("tensor '" + name + "' appears in both '" + it->second->file + "' and '" + p + "'");
    }
  }
  for (const auto& [t, s] : weight_map) {
    auto it = index_.find(t);
    if (it == index_.end())
      throw Error("tensor '" + t + "' is listed in the index under '" + s + "' but that shard does not hold it");
  }
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& [k, v] : index_) n += v->nbytes;
  return n;
}

}  // namespace k3
