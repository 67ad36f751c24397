#include <gtest/gtest.h>

#include <cstring>

#include "k3/core/error.h"
#include "k3/io/safetensors.h"
#include "test_util.h"

using k3test::RawTensor;
using k3test::TempDir;

namespace {

std::map<std::string, RawTensor> sample_tensors() {
  return {{"a.weight", {"BF16", {3, 4}, k3test::random_bytes(24, 1)}},
          {"b.bias", {"F32", {5}, k3test::random_bytes(20, 2)}},
          {"c.weight_packed", {"U8", {2, 16}, k3test::random_bytes(32, 3)}}};
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const k3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, ReadsTensorsZeroCopy) {
  TempDir d;
  auto ts = sample_tensors();
  k3test::write_safetensors(d.str() + "/model.safetensors", ts);
  k3::Checkpoint ck(d.str());
  ASSERT_EQ(ck.all().size(), 3u);
  const auto* a = ck.find("a.weight");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, k3::DType::BF16);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(std::memcmp(a->data, ts["a.weight"].bytes.data(), 24), 0);
  const auto* b = ck.find("b.bias");
  EXPECT_EQ(std::memcmp(b->data, ts["b.bias"].bytes.data(), 20), 0);
  EXPECT_EQ(ck.find("nope"), nullptr);
  EXPECT_EQ(ck.total_bytes(), 24u + 20u + 32u);
}

TEST(Safetensors, ShardedIndex) {
  TempDir d;
  auto ts = sample_tensors();
  std::map<std::string, RawTensor> s1{{"a.weight", ts["a.weight"]}}, s2{{"b.bias", ts["b.bias"]}, {"c.weight_packed", ts["c.weight_packed"]}};
  k3test::write_safetensors(d.str() + "/model-00001-of-00002.safetensors", s1);
  k3test::write_safetensors(d.str() + "/model-00002-of-00002.safetensors", s2);
  nlohmann::json idx = {{"metadata", {{"total_size", 76}}},
                        {"weight_map", {{"a.weight", "model-00001-of-00002.safetensors"},
                                        {"b.bias", "model-00002-of-00002.safetensors"},
                                        {"c.weight_packed", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(d.str() + "/model.safetensors.index.json") << idx.dump();
  k3::Checkpoint ck(d.str());
  EXPECT_EQ(ck.all().size(), 3u);
  EXPECT_NE(ck.find("b.bias")->file.find("00002"), std::string::npos);

  // The index claims a tensor that its shard does not hold.
  idx["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(d.str() + "/model.safetensors.index.json") << idx.dump();
  auto msg = error_of([&] { k3::Checkpoint c2(d.str()); });
  EXPECT_NE(msg.find("ghost.weight"), std::string::npos) << msg;

  // A shard listed in the index is missing.
  idx["weight_map"].erase("ghost.weight");
  idx["weight_map"]["x"] = "model-00003-of-00002.safetensors";
  std::ofstream(d.str() + "/model.safetensors.index.json") << idx.dump();
  msg = error_of([&] { k3::Checkpoint c3(d.str()); });
  EXPECT_NE(msg.find("00003"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing"), std::string::npos) << msg;
}

TEST(Safetensors, TruncatedFileIsAClearError) {
  TempDir d;
  const std::string p = d.str() + "/model.safetensors";
  k3test::write_safetensors(p, sample_tensors());
  k3test::fs::resize_file(p, k3test::fs::file_size(p) - 10);
  auto msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  k3test::fs::resize_file(p, 5);
  msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(Safetensors, CorruptHeaderIsAClearError) {
  TempDir d;
  const std::string p = d.str() + "/model.safetensors";
  // Header length larger than the file.
  {
    std::ofstream f(p, std::ios::binary);
    uint64_t n = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  auto msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("corrupt header"), std::string::npos) << msg;
  // Not JSON.
  {
    std::ofstream f(p, std::ios::binary);
    std::string h = "{\"a\": [1, 2";
    uint64_t n = h.size();
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << h;
  }
  msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("corrupt header"), std::string::npos) << msg;
  // Size inconsistent with dtype x shape.
  auto [h, data] = (k3test::write_safetensors(p, sample_tensors()), k3test::read_safetensors_raw(p));
  h["a.weight"]["shape"] = {4, 4};
  k3test::write_safetensors_raw(p, h, data);
  msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("a.weight"), std::string::npos) << msg;
  // Unknown dtype.
  h["a.weight"]["shape"] = {3, 4};
  h["a.weight"]["dtype"] = "Q4_K";
  k3test::write_safetensors_raw(p, h, data);
  msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("unknown dtype"), std::string::npos) << msg;
  // Overlapping data.
  h["a.weight"]["dtype"] = "BF16";
  h["b.bias"]["data_offsets"] = {0, 20};
  k3test::write_safetensors_raw(p, h, data);
  msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

TEST(Safetensors, MissingDirectoryOrFiles) {
  auto msg = error_of([] { k3::Checkpoint c("/nonexistent/k3/dir"); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
  TempDir d;
  msg = error_of([&] { k3::Checkpoint c(d.str()); });
  EXPECT_NE(msg.find("safetensors"), std::string::npos) << msg;
}
