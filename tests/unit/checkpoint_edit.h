// A copy of a test checkpoint in a temp dir whose config.json and tensor bytes a test can rewrite, then
// load with the real loader (mutation tests, derived checkpoints).
#pragma once
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace k3test {

struct EditableCheckpoint {
  TempDir dir;

  // tests/data/<name>, or the trained default model for "k3-tiny" (models/k3-tiny).
  explicit EditableCheckpoint(const std::string& name) {
    for (auto& e : fs::directory_iterator(source_path(name == "k3-tiny" ? "models/k3-tiny" : "tests/data/" + name)))
      fs::copy_file(e.path(), dir.path / e.path().filename());
  }
  std::string str() const { return dir.str(); }

  // Edits the text config (text_config for kimi_k3, the top level for kimi_linear).
  void edit_config(const std::function<void(nlohmann::json&)>& fn) {
    const auto p = dir.path / "config.json";
    nlohmann::json j;
    {
      std::ifstream f(p);
      j = nlohmann::json::parse(f);
    }
    fn(j.contains("text_config") ? j["text_config"] : j);
    std::ofstream(p) << j.dump(2);
  }

  // Calls fn(name, header entry, bytes, size) for every tensor of every shard, then rewrites the shards.
  using TensorFn = std::function<void(const std::string&, const nlohmann::json&, uint8_t*, size_t)>;
  void edit_tensors(const TensorFn& fn) {
    for (auto& e : fs::directory_iterator(dir.path)) {
      if (e.path().extension() != ".safetensors") continue;
      auto [h, data] = read_safetensors_raw(e.path().string());
      for (auto& [name, t] : h.items()) {
        if (name == "__metadata__") continue;
        const size_t b = t["data_offsets"][0].get<size_t>(), en = t["data_offsets"][1].get<size_t>();
        fn(name, t, data.data() + b, en - b);
      }
      write_safetensors_raw(e.path().string(), h, data);
    }
  }

  // The same over the tensors whose name ends with `suffix`.
  void edit_tensors_ending(const std::string& suffix, const TensorFn& fn) {
    edit_tensors([&](const std::string& n, const nlohmann::json& t, uint8_t* p, size_t size) {
      if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) fn(n, t, p, size);
    });
  }
};

// Multiplies bf16 values by 2^k (k < 0 scales down) exactly, by shifting the exponent field; zeros stay.
inline void scale_bf16_pow2(uint8_t* p, size_t count, int k) {
  for (size_t i = 0; i < count; ++i) {
    uint16_t v;
    std::memcpy(&v, p + 2 * i, 2);
    const int e = (v >> 7) & 0xff;
    if (e == 0) continue;
    const int ne = e + k;
    if (ne <= 0 || ne >= 255) throw std::runtime_error("scale_bf16_pow2: exponent out of range");
    v = static_cast<uint16_t>((v & 0x807f) | (ne << 7));
    std::memcpy(p + 2 * i, &v, 2);
  }
}

}  // namespace k3test
