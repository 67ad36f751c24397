// Helpers shared by the unit tests: temp dirs, safetensors writing, data paths.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace k3test {

namespace fs = std::filesystem;

inline std::string source_path(const std::string& rel) { return std::string(K3_SOURCE_DIR) + "/" + rel; }

// The project's read-only shared data (real tokenizers, corpora, prompts): $K3_SHARED_DIR, else ../shared
// beside the checkout, where CI has it.
inline std::string shared_path(const std::string& rel) {
  const char* env = std::getenv("K3_SHARED_DIR");
  return (env && *env ? std::string(env) : source_path("../shared")) + "/" + rel;
}
inline bool have_shared() { return fs::exists(shared_path("data/tokenizers/kimi/tiktoken.model")); }

// CI sets K3_REQUIRE_SHARED=1 (.ci/run): a test that needs the shared data then FAILS when it is missing
// instead of skipping (CTest counts a gtest skip as a pass, so a CI machine without ../shared would
// silently run 30 fewer tests).
inline bool require_shared() {
  const char* env = std::getenv("K3_REQUIRE_SHARED");
  return env && *env && std::string(env) != "0";
}

// First line of a test that reads the shared data: a checkout without it (a clone elsewhere) skips the
// test and says why, instead of failing on a missing file; under K3_REQUIRE_SHARED=1 it fails.
#define K3_SKIP_WITHOUT_SHARED()                                                                           \
  do {                                                                                                     \
    if (!::k3test::have_shared()) {                                                                        \
      if (::k3test::require_shared())                                                                      \
        FAIL() << "K3_REQUIRE_SHARED is set but the shared data is missing at " << ::k3test::shared_path(""); \
      GTEST_SKIP() << "needs the shared data at " << ::k3test::shared_path("") << " (set K3_SHARED_DIR)";  \
    }                                                                                                      \
  } while (0)

// A fresh directory under the system temp dir, removed when the object dies.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("k3test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

inline void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (auto& [name, t] : tensors) {
    h[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string hs = h.dump();
  std::ofstream f(path, std::ios::binary);
  uint64_t n = hs.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  for (auto& [name, t] : tensors) f.write(reinterpret_cast<const char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
}

// Reads a safetensors file into (header json, data bytes).
inline std::pair<nlohmann::json, std::vector<uint8_t>> read_safetensors_raw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  uint64_t n = 0;
  f.read(reinterpret_cast<char*>(&n), 8);
  std::string hs(n, '\0');
  f.read(hs.data(), static_cast<std::streamsize>(n));
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return {nlohmann::json::parse(hs), data};
}

inline void write_safetensors_raw(const std::string& path, const nlohmann::json& h, const std::vector<uint8_t>& data) {
  std::string hs = h.dump();
  std::ofstream f(path, std::ios::binary);
  uint64_t n = hs.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(hs.data(), static_cast<std::streamsize>(hs.size()));
  f.write(reinterpret_cast<const char*>(data.data()), static_cast<std::streamsize>(data.size()));
}

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

}  // namespace k3test
