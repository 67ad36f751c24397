// Malformed checkpoints must give a clear error naming the file, tensor and expectation, never a crash.
// Each test copies a tiny checkpoint to a temp dir and breaks one thing.
#include <gtest/gtest.h>

#include <fstream>

#include "k3/core/error.h"
#include "k3/model/model.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct BrokenCheckpoint {
  k3test::TempDir dir;
  explicit BrokenCheckpoint(const std::string& name) {
    for (auto& e : fs::directory_iterator(k3test::source_path("tests/data/" + name)))
      fs::copy_file(e.path(), dir.path / e.path().filename());
  }
  std::string path(const std::string& f) const { return (dir.path / f).string(); }
  // The shard holding `tensor` (or the single file).
  std::string shard_of(const std::string& tensor) const {
    if (fs::exists(path("model.safetensors.index.json"))) {
      std::ifstream f(path("model.safetensors.index.json"));
      return path(json::parse(f)["weight_map"][tensor].get<std::string>());
    }
    return path("model.safetensors");
  }
  void edit_header(const std::string& tensor, const std::function<void(json&)>& fn) {
    const std::string shard = shard_of(tensor);
    auto [h, data] = k3test::read_safetensors_raw(shard);
    fn(h);
    k3test::write_safetensors_raw(shard, h, data);
  }
  void edit_config(const std::function<void(json&)>& fn) {
    json j;
    {
      std::ifstream f(path("config.json"));
      j = json::parse(f);
    }
    fn(j);
    std::ofstream(path("config.json")) << j.dump(1);
  }
  std::string load_error() const {
    try {
      k3::Model::load(dir.str());
    } catch (const k3::Error& e) {
      return e.what();
    }
    return "(loaded without error)";
  }
};

const std::string kK3 = "language_model.model.";

}  // namespace

TEST(CheckpointValidation, IntactCheckpointsLoad) {
  BrokenCheckpoint a("tiny-k3"), b("tiny-kimi-linear");
  EXPECT_EQ(a.load_error(), "(loaded without error)");
  EXPECT_EQ(b.load_error(), "(loaded without error)");
}

TEST(CheckpointValidation, MissingTensor) {
  BrokenCheckpoint c("tiny-kimi-linear");
  const std::string t = "model.layers.1.self_attn.q_proj.weight";
  c.edit_header(t, [&](json& h) { h.erase(t); });
  auto msg = c.load_error();
  EXPECT_NE(msg.find("missing tensor '" + t + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected F32/BF16/F16 ["), std::string::npos) << msg;
}

TEST(CheckpointValidation, WrongShape) {
  BrokenCheckpoint c("tiny-k3");
  const std::string t = kK3 + "layers.0.self_attn.o_proj.weight";
  c.edit_header(t, [&](json& h) {
    auto s = h[t]["shape"];
    h[t]["shape"] = {s[1], s[0]};  // same bytes, transposed
  });
  auto msg = c.load_error();
  EXPECT_NE(msg.find(t), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected [128, 64]"), std::string::npos) << msg;
  EXPECT_NE(msg.find(".safetensors"), std::string::npos) << msg;  // names the shard
}

TEST(CheckpointValidation, WrongDtype) {
  BrokenCheckpoint c("tiny-k3");
  const std::string t = kK3 + "layers.0.self_attn.dt_bias";
  c.edit_header(t, [&](json& h) { h[t]["dtype"] = "I32"; });
  auto msg = c.load_error();
  EXPECT_NE(msg.find(t), std::string::npos) << msg;
  EXPECT_NE(msg.find("dtype I32"), std::string::npos) << msg;
}

TEST(CheckpointValidation, Mxfp4ScaleShape) {
  BrokenCheckpoint c("tiny-k3");
  const std::string t = kK3 + "layers.1.block_sparse_moe.experts.3.w2.weight_scale";
  c.edit_header(t, [&](json& h) { h[t]["dtype"] = "I8"; });
  auto msg = c.load_error();
  EXPECT_NE(msg.find(t), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected U8"), std::string::npos) << msg;
}

TEST(CheckpointValidation, TruncatedShard) {
  BrokenCheckpoint c("tiny-k3");
  const std::string shard = c.shard_of(kK3 + "embed_tokens.weight");
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto msg = c.load_error();
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find(fs::path(shard).filename().string()), std::string::npos) << msg;
}

TEST(CheckpointValidation, CorruptHeader) {
  BrokenCheckpoint c("tiny-kimi-linear");
  {
    std::fstream f(c.path("model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("\x01\x02garbage", 9);
  }
  auto msg = c.load_error();
  EXPECT_NE(msg.find("corrupt header"), std::string::npos) << msg;
}

TEST(CheckpointValidation, BadConfig) {
  {
    BrokenCheckpoint c("tiny-k3");
    std::ofstream(c.path("config.json")) << "{ not json";
    auto msg = c.load_error();
    EXPECT_NE(msg.find("config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("invalid JSON"), std::string::npos) << msg;
  }
  {
    BrokenCheckpoint c("tiny-k3");
    c.edit_config([](json& j) { j["model_type"] = "deepseek_v3"; });
    EXPECT_NE(c.load_error().find("unknown architecture"), std::string::npos);
  }
  {
    BrokenCheckpoint c("tiny-kimi-linear");
    fs::remove(c.path("config.json"));
    EXPECT_NE(c.load_error().find("config.json"), std::string::npos);
  }
}

TEST(CheckpointValidation, ConfigImpliesTensorsTheCheckpointLacks) {
  // The config asks for K3's full-rank KDA output gate; this Kimi-Linear checkpoint has the low-rank one.
  BrokenCheckpoint c("tiny-kimi-linear");
  c.edit_config([](json& j) { j["linear_attn_config"]["use_full_rank_gate"] = true; });
  auto msg = c.load_error();
  EXPECT_NE(msg.find("self_attn.g_proj.weight"), std::string::npos) << msg;
  // More layers than the checkpoint holds: every missing tensor is reported, the list is capped.
  BrokenCheckpoint d("tiny-kimi-linear");
  d.edit_config([](json& j) {
    j["num_hidden_layers"] = 12;
    j["linear_attn_config"]["kda_layers"] = {1, 2, 4, 5, 7, 8, 10, 11};
    j["linear_attn_config"]["full_attn_layers"] = {3, 6, 9, 12};
  });
  msg = d.load_error();
  EXPECT_NE(msg.find("missing tensor 'model.layers.6."), std::string::npos) << msg;
  EXPECT_NE(msg.find("more"), std::string::npos) << msg;
}
