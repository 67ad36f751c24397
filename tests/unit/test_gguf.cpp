// The GGUF container reader (io/gguf.h): a file written here field by field (an independent writer)
// parses back to the same metadata and tensor views; every truncation and each malformed field is a
// k3::Error naming the problem, never a crash; a real llama.cpp-written file parses (by hand: K3_GGUF_FILE).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/io/gguf.h"

namespace {

struct Writer {
  std::vector<uint8_t> b;
  template <typename T>
  Writer& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Writer& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  void pad(size_t a) { b.resize((b.size() + a - 1) / a * a, 0); }
};

struct Tensor {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset, bytes;
};

// A v3 file: header, the metadata (one of each value type), `tensors` infos, padding, data filled with
// a byte pattern (tensor i: bytes (i * 31 + k) & 0xff).
std::vector<uint8_t> make_file(const std::vector<Tensor>& tensors, uint32_t alignment = 32, uint32_t version = 3) {
  Writer w;
  w.put<uint32_t>(0x46554747u).put<uint32_t>(version).put<uint64_t>(tensors.size()).put<uint64_t>(9);
  w.str("general.architecture").put<uint32_t>(8).str("kimi-k3");
  w.str("general.alignment").put<uint32_t>(4).put<uint32_t>(alignment);
  w.str("kimi-k3.block_count").put<uint32_t>(5).put<int32_t>(-93);
  w.str("kimi-k3.expert_count").put<uint32_t>(10).put<uint64_t>(896);
  w.str("kimi-k3.rope.freq_base").put<uint32_t>(6).put<float>(50000.5f);
  w.str("x.f64").put<uint32_t>(12).put<double>(-1e300);
  w.str("x.bool").put<uint32_t>(7).put<uint8_t>(1);
  w.str("tokenizer.ggml.tokens").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(3).str("a").str("").str("\xe4\xb8\xad");
  w.str("x.nested").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(2);
  w.put<uint32_t>(4).put<uint64_t>(2).put<uint32_t>(1).put<uint32_t>(2);
  w.put<uint32_t>(0).put<uint64_t>(1).put<uint8_t>(7);
  for (const Tensor& t : tensors) {
    w.str(t.name).put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) w.put<uint64_t>(d);
    w.put<uint32_t>(t.type).put<uint64_t>(t.offset);
  }
  w.pad(alignment);
  const size_t data = w.b.size();
  size_t end = data;
  for (const Tensor& t : tensors) end = std::max<size_t>(end, data + t.offset + t.bytes);
  w.b.resize(end, 0);
  for (size_t i = 0; i < tensors.size(); ++i)
    for (uint64_t k = 0; k < tensors[i].bytes; ++k) w.b[data + tensors[i].offset + k] = static_cast<uint8_t>((i * 31 + k) & 0xff);
  return w.b;
}

// f32 [3][5], bf16 [2][64], mxfp4 [4][64] (4 x 2 blocks x 17 B), q8_0 [1][32]; offsets aligned to 32.
std::vector<Tensor> some_tensors() {
  return {{"token_embd.weight", {5, 3}, 0, 0, 60},
          {"blk.0.attn_q.weight", {64, 2}, 30, 64, 256},
          {"blk.1.ffn_gate_exps.weight", {64, 4}, 39, 320, 136},
          {"output.weight", {32, 1}, 8, 480, 34}};
}

k3::Gguf parse(const std::vector<uint8_t>& f) { return k3::parse_gguf(std::span<const uint8_t>(f.data(), f.size()), "t.gguf"); }

void expect_error(const std::vector<uint8_t>& f, const std::string& needle) {
  try {
    parse(f);
    ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Gguf, ParsesWhatAnIndependentWriterWrote) {
  const auto ts = some_tensors();
  const auto f = make_file(ts);
  const k3::Gguf g = parse(f);
  EXPECT_EQ(g.version, 3u);
  EXPECT_EQ(g.alignment, 32u);
  EXPECT_EQ(g.metadata["general.architecture"], "kimi-k3");
  EXPECT_EQ(g.metadata["kimi-k3.block_count"].get<int64_t>(), -93);
  EXPECT_EQ(g.metadata["kimi-k3.expert_count"].get<uint64_t>(), 896u);
  EXPECT_FLOAT_EQ(g.metadata["kimi-k3.rope.freq_base"].get<float>(), 50000.5f);
  EXPECT_DOUBLE_EQ(g.metadata["x.f64"].get<double>(), -1e300);
  EXPECT_EQ(g.metadata["x.bool"], true);
  EXPECT_EQ(g.metadata["tokenizer.ggml.tokens"], nlohmann::json::array({"a", "", "\xe4\xb8\xad"}));
  EXPECT_EQ(g.metadata["x.nested"], nlohmann::json::parse("[[1, 2], [7]]"));
  EXPECT_EQ(g.metadata_types["kimi-k3.expert_count"], 10);
  ASSERT_EQ(g.tensors.size(), ts.size());
  EXPECT_EQ(g.data_offset % 32, 0u);
  for (size_t i = 0; i < ts.size(); ++i) {
    const k3::GgufTensor& t = g.tensors[i];
    EXPECT_EQ(t.name, ts[i].name);
    EXPECT_EQ(t.bytes, ts[i].bytes) << t.name;
    EXPECT_EQ(t.data, f.data() + g.data_offset + ts[i].offset);
    EXPECT_EQ(t.data[1], static_cast<uint8_t>((i * 31 + 1) & 0xff));
  }
  EXPECT_EQ(g.find("blk.1.ffn_gate_exps.weight")->elements(), 256);
  EXPECT_EQ(g.find("nope"), nullptr);
  EXPECT_EQ(std::string(k3::ggml_type_info(39)->name), "mxfp4");
  EXPECT_FALSE(k3::ggml_type_info(4).has_value());
  EXPECT_FALSE(k3::ggml_type_info(1000).has_value());
}

// Every proper prefix of a valid file is an error (the data section's end included), never a crash or a
// read past the span (ASan build).
TEST(Gguf, EveryTruncationIsAnError) {
  const auto f = make_file(some_tensors());
  for (size_t n = 0; n < f.size(); ++n) {
    std::vector<uint8_t> cut(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse(cut), k3::Error) << "prefix " << n << " of " << f.size();
  }
}

TEST(Gguf, MalformedFieldsAreNamedErrors) {
  auto ts = some_tensors();
  auto f = make_file(ts);
  f[0] = 'X';
  expect_error(f, "magic");
  expect_error(make_file(ts, 32, 4), "version 4");
  expect_error(make_file(ts, 24), "power of two");
  auto bad = ts;
  bad[1].offset = 65;
  expect_error(make_file(bad), "not aligned");
  bad = ts;
  bad[2].dims = {48, 4};  // 48 % 32: not whole MXFP4 blocks
  expect_error(make_file(bad), "block");
  bad = ts;
  bad[0].dims = {5, 0};
  expect_error(make_file(bad), "zero");
  bad = ts;
  bad[0].dims = {1, 1, 1, 1, 1};
  expect_error(make_file(bad), "dimensions");
  bad = ts;
  bad[0].type = 4;  // removed Q4_2
  expect_error(make_file(bad), "unknown ggml type 4");
  bad = ts;
  bad[3].name = bad[0].name;
  expect_error(make_file(bad), "duplicate tensor");
  bad = ts;
  bad[0].dims = {1ull << 40, 1ull << 40};
  expect_error(make_file(bad), "overflow");
  // Data past the end: the last tensor claims more bytes than the file has.
  f = make_file(ts);
  f.resize(f.size() - 1);
  expect_error(f, "past the end");
  // A metadata array whose count the file cannot hold fails before allocating.
  Writer w;
  w.put<uint32_t>(0x46554747u).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  w.str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(1ull << 60);
  expect_error(w.b, "past the end");
  // A file that holds that many u8s, but more array elements than the reader keeps as JSON values.
  Writer big;
  big.put<uint32_t>(0x46554747u).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(1);
  big.str("k").put<uint32_t>(9).put<uint32_t>(0).put<uint64_t>((1ull << 24) + 1);
  big.b.resize(big.b.size() + (1u << 24) + 1, 1);
  expect_error(big.b, "array elements");
  Writer v;
  v.put<uint32_t>(0x46554747u).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(2);
  v.str("k").put<uint32_t>(7).put<uint8_t>(0).str("k").put<uint32_t>(7).put<uint8_t>(1);
  expect_error(v.b, "duplicate metadata key");
}

// By hand: K3_GGUF_FILE=/path/model.gguf (e.g. the llama.cpp peer's conversions, docs/perf/cpu/llama-peer.md).
TEST(Gguf, RealFileFromLlamaCppConverter) {
  const char* path = std::getenv("K3_GGUF_FILE");
  if (!path) GTEST_SKIP() << "set K3_GGUF_FILE to a .gguf written by llama.cpp";
  const k3::GgufFile f(path);
  const k3::Gguf& g = f.gguf();
  EXPECT_TRUE(g.metadata.contains("general.architecture"));
  EXPECT_GT(g.tensors.size(), 0u);
  std::printf("[ gguf ] %s: v%u, %zu keys, %zu tensors, arch %s\n", path, g.version, g.metadata.size(), g.tensors.size(),
              g.metadata["general.architecture"].dump().c_str());
}
