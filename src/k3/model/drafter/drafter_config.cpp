#include "k3/model/drafter/drafter_config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "k3/core/error.h"

namespace k3::drafter {

namespace {

// Field access with messages naming the file and the key.
class Fields {
 public:
  Fields(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}
  std::string where(const std::string& key) const { return "drafter config '" + source_ + "': " + key; }
  const nlohmann::json& at(const std::string& key) const {
    if (!j_.contains(key)) throw Error(where(key) + ": required field is missing");
    return j_.at(key);
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi) const {
    const nlohmann::json& v = at(key);
    if (!v.is_number_integer()) throw Error(where(key) + ": must be an integer, got " + v.dump().substr(0, 40));
    // Compared as the JSON's own type (nlohmann keeps non-negative integers unsigned): no wrap into range.
    const bool out = v.is_number_unsigned()
                         ? v.get<uint64_t>() < static_cast<uint64_t>(lo) || v.get<uint64_t>() > static_cast<uint64_t>(hi)
                         : v.get<int64_t>() < lo || v.get<int64_t>() > hi;
    if (out)
      throw Error(where(key) + ": must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + v.dump().substr(0, 40));
    return v.get<int64_t>();
  }
  float positive(const std::string& key) const {
    const nlohmann::json& v = at(key);
    if (!v.is_number() || !std::isfinite(v.get<double>()) || !(v.get<double>() > 0) || !(v.get<double>() < 1))
      throw Error(where(key) + ": must be a number in (0, 1), got " + v.dump().substr(0, 40));
    return v.get<float>();
  }

 private:
  const nlohmann::json& j_;
  const std::string& source_;
};

void check_identity(const nlohmann::json& j, const Fields& f) {
  if (j.contains("architectures")) {
    const nlohmann::json& a = j["architectures"];
    bool ok = false;
    if (a.is_array())
      for (const auto& x : a) ok |= x == "K3BlockDrafter";
    if (!ok) throw Error(f.where("architectures") + ": expected [\"K3BlockDrafter\"], got " + a.dump().substr(0, 80));
  }
  if (j.contains("model_type") && j["model_type"] != "k3_block_drafter")
    throw Error(f.where("model_type") + ": expected \"k3_block_drafter\", got " + j["model_type"].dump().substr(0, 40));
}

}  // namespace

DrafterConfig parse_drafter_config(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error("drafter config '" + source + "': not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error("drafter config '" + source + "': expected a JSON object");
  const Fields f(j, source);
  check_identity(j, f);
  DrafterConfig c;
  c.source = source;
  // Bounds keep every size computed from them far from overflow and reject nonsense before any allocation.
  c.hidden_size = f.integer("hidden_size", 1, 65536);
  c.num_layers = f.integer("num_hidden_layers", 1, 256);
  c.num_heads = f.integer("num_attention_heads", 1, 1024);
  c.head_dim = f.integer("head_dim", 1, 1024);
  c.intermediate_size = f.integer("intermediate_size", 1, 1 << 20);
  c.block_size = f.integer("block_size", 1, 64);
  c.rms_norm_eps = f.positive("rms_norm_eps");
  c.target_hidden_size = f.integer("target_hidden_size", 1, 65536);
  c.target_vocab_size = f.integer("target_vocab_size", 1, 1 << 24);
  c.target_num_layers = f.integer("target_num_layers", 1, 4096);
  const nlohmann::json& ids = f.at("target_layer_ids");
  if (!ids.is_array() || ids.empty() || ids.size() > 64)
    throw Error(f.where("target_layer_ids") + ": must be a list of 1..64 tap ids, got " + ids.dump().substr(0, 80));
  for (const auto& x : ids) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > c.target_num_layers)
      throw Error(f.where("target_layer_ids") + ": " + x.dump().substr(0, 40) + " is not a tap id in 0..target_num_layers (" +
                  std::to_string(c.target_num_layers) + ")");
    c.target_layer_ids.push_back(x.get<int32_t>());
  }
  if (c.hidden_size != c.target_hidden_size)
    throw Error(f.where("hidden_size") + ": " + std::to_string(c.hidden_size) + " differs from target_hidden_size " +
                std::to_string(c.target_hidden_size) + " (the drafter's hidden size is the target's)");
  return c;
}

DrafterConfig load_drafter_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  std::ifstream in(path);
  if (!in) throw Error("block drafter: cannot open '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_drafter_config(ss.str(), path);
}

void check_drafter_target(const DrafterConfig& d, const ModelConfig& t) {
  auto check = [&](const char* key, int64_t have, const char* target_key, int64_t want) {
    if (have != want)
      throw Error("drafter config '" + d.source + "': " + key + " " + std::to_string(have) + " does not match the target's " +
                  target_key + " " + std::to_string(want) + " (the drafter was made for another model)");
  };
  check("target_hidden_size", d.target_hidden_size, "hidden_size", t.hidden_size);
  check("target_vocab_size", d.target_vocab_size, "vocab_size", t.vocab_size);
  check("target_num_layers", d.target_num_layers, "num_hidden_layers", t.num_layers);
}

}  // namespace k3::drafter
