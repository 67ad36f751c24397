// GGUF models (model/gguf_model.h, model/gguf_export.h, io/gguf_writer.h): a tiny K3 and a tiny Kimi-Linear
// written as llama.cpp's converter would (k3 convert's code) load back with logits bit-identical to their HF
// directories (prefill and decode); the writer round-trips every metadata type and aligns tensors; each
// malformed model GGUF (missing / mistyped / out-of-range key, unknown architecture, wrong shape, unknown or
// misplaced type, lying metadata, missing half of kv_b) is one clear k3::Error naming the key or tensor.
#include <gtest/gtest.h>
#include <iterator>
#include <fstream>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/io/gguf_writer.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/gguf_export.h"
#include "k3/model/gguf_model.h"
#include "k3/model/model.h"
#include "k3/model/model_files.h"
#include "k3/quant/gguf_quant.h"
#include "test_util.h"

namespace {

using k3test::TempDir;

std::string write_tiny_gguf(const std::string& tiny, const std::string& out) {
  const std::string dir = k3test::source_path("tests/data/" + tiny);
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  k3::GgufWriter w;
  k3::add_model_to_gguf(w, c, ck, tiny);
  w.write(out);
  return out;
}

std::vector<float> run(const k3::Model& m, const std::vector<int32_t>& toks, bool decode) {
  auto st = m.new_sequence();
  std::vector<float> all, one;
  k3::ForwardOptions o;
  if (!decode) {
    o.all_logits = true;
    o.path = k3::AttnPath::Prefill;
    m.forward(toks, st, all, o);
    return all;
  }
  o.path = k3::AttnPath::Decode;
  for (int32_t t : toks) {
    m.forward(std::span<const int32_t>(&t, 1), st, one, o);
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

// Tensors of one ggml type among those a writer holds.
int64_t count_ggml_type(const k3::GgufWriter& w, uint32_t type) {
  int64_t n = 0;
  for (const auto& [t, b] : w.tensor_types()) n += t == type;
  return n;
}

// ||got - ref|| / ||ref|| over whole logit arrays.
double rms_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
  return std::sqrt(num / den);
}

class GgufTiny : public ::testing::TestWithParam<std::string> {};

// The transforms the converter applies (experts stacked + MXFP4 repacked, kv_b split and transposed,
// -exp(A_log), AttnRes fused, conv reshaped, vectors and router widened to F32) are all undone exactly.
TEST_P(GgufTiny, LogitsBitIdenticalToHfDir) {
  // The router is written F32 as llama.cpp's converter does; the opt-in avx512bf16 tier rounds the activations
  // of the HF dir's BF16 router but not of an F32 one (its MXFP4_GGML experts do match: CpuKernelsTier).
  if (k3::cpu::active_tier_for_testing() == k3::cpu::CpuIsa::Avx512Bf16 ||
      k3::cpu::active_tier_for_testing() == k3::cpu::CpuIsa::Amx)
    GTEST_SKIP() << "avx512bf16 / amx: the F32 router of a GGUF runs exact where the HF dir's BF16 one is rounded";
  TempDir tmp;
  const std::string path = write_tiny_gguf(GetParam(), (tmp.path / "m.gguf").string());
  auto hf = k3::Model::load(k3test::source_path("tests/data/" + GetParam()));
  auto gg = k3::Model::load(path);
  EXPECT_EQ(gg->config().num_layers, hf->config().num_layers);
  EXPECT_EQ(gg->config().expert_quant_format.has_value(), hf->config().expert_quant_format.has_value());
  if (hf->config().expert_quant_format) {
    EXPECT_EQ(*gg->config().expert_quant_format, k3::WeightFormat::MXFP4_GGML);
  }
  std::vector<int32_t> toks;
  for (int i = 0; i < 70; ++i) toks.push_back((i * 37 + 11) % static_cast<int>(hf->config().vocab_size));  // > one KDA chunk
  for (bool decode : {false, true}) {
    const auto a = run(*hf, toks, decode), b = run(*gg, toks, decode);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << (decode ? "decode" : "prefill");
  }
}
INSTANTIATE_TEST_SUITE_P(Tiny, GgufTiny, ::testing::Values("tiny-k3", "tiny-kimi-linear"));

// The GGUF names of the converter (a few of each kind) and the k3-only keys where the tiny K3 needs them.
TEST(GgufExport, NamesShapesAndKeysAsLlamaCpp) {
  TempDir tmp;
  const std::string path = write_tiny_gguf("tiny-k3", (tmp.path / "m.gguf").string());
  const k3::GgufFile f(path);
  const k3::Gguf& g = f.gguf();
  EXPECT_EQ(g.metadata["general.architecture"], "kimi-k3");
  EXPECT_EQ(g.metadata["kimi-k3.attention.head_count_kv"], nlohmann::json::array({0, 0, 0, 1, 0, 0, 1, 1}));
  EXPECT_EQ(g.metadata["kimi-k3.kda.head_count"], 2);  // KDA heads (2) differ from MLA heads (4)
  const auto dims = [&](const char* n) { return g.find(n) ? g.find(n)->dims : std::vector<int64_t>{}; };
  EXPECT_EQ(dims("blk.1.ffn_gate_exps.weight"), (std::vector<int64_t>{64, 64, 16}));
  EXPECT_EQ(g.find("blk.1.ffn_gate_exps.weight")->type, 39u);  // MXFP4
  EXPECT_EQ(dims("blk.3.attn_k_b.weight"), (std::vector<int64_t>{16, 32, 4}));
  EXPECT_EQ(dims("blk.3.attn_v_b.weight"), (std::vector<int64_t>{32, 16, 4}));
  EXPECT_EQ(dims("blk.0.ssm_conv1d_q.weight"), (std::vector<int64_t>{4, 1, 64, 1}));
  EXPECT_EQ(dims("blk.0.ssm_a"), (std::vector<int64_t>{2}));
  EXPECT_EQ(g.find("blk.1.ffn_gate_inp.weight")->type, 0u);  // F32, as the converter writes the router
  EXPECT_NE(g.find("output_res_score.weight"), nullptr);
  EXPECT_NE(g.find("blk.3.attn_gate.weight"), nullptr);
  EXPECT_NE(g.find("blk.0.ssm_g.weight"), nullptr);
}

// Every metadata type, arrays of several element types, and tensors at multiples of a custom alignment.
TEST(GgufWriter, RoundTripsEveryMetadataTypeAndAligns) {
  TempDir tmp;
  k3::GgufWriter w(64);
  w.set_u8("u8", 200);
  w.set_i8("i8", -100);
  w.set_u16("u16", 60000);
  w.set_i16("i16", -30000);
  w.set_u32("u32", 4000000000u);
  w.set_i32("i32", -2000000000);
  w.set_f32("f32", 1.5f);
  w.set_bool("bool", true);
  w.set_string("str", "héllo");
  w.set_u64("u64", uint64_t{1} << 62);
  w.set_i64("i64", -(int64_t{1} << 62));
  w.set_f64("f64", 0.1);
  w.set_array("af32", k3::GgufType::F32, {0.5, -2.0});
  w.set_array_i64("ai32", k3::GgufType::I32, {0, 1, -7});
  w.set_array_i64("au8", k3::GgufType::U8, {255, 3});
  w.set_array_strings("astr", {"a", "", "bc"});
  EXPECT_THROW(w.set_u8("u8", 1), k3::Error);
  const std::vector<float> t1{1, 2, 3};
  const std::vector<uint16_t> t2(40, 0x3f80);
  w.add_tensor("t1", {3}, 0, [&](k3::GgufSink& s) { s.write(t1.data(), 12); });
  w.add_tensor("t2", {8, 5}, 30, [&](k3::GgufSink& s) { s.write(t2.data(), 80); });
  EXPECT_THROW(w.add_tensor("t1", {3}, 0, [](k3::GgufSink&) {}), k3::Error);
  EXPECT_THROW(w.add_tensor("q", {33}, 8, [](k3::GgufSink&) {}), k3::Error);  // not whole Q8_0 blocks
  const std::string path = (tmp.path / "w.gguf").string();
  w.write(path);
  const k3::GgufFile f(path);
  const k3::Gguf& g = f.gguf();
  EXPECT_EQ(g.alignment, 64u);
  EXPECT_EQ(g.metadata["u8"], 200);
  EXPECT_EQ(g.metadata["i8"], -100);
  EXPECT_EQ(g.metadata["u16"], 60000);
  EXPECT_EQ(g.metadata["i16"], -30000);
  EXPECT_EQ(g.metadata["u32"], 4000000000u);
  EXPECT_EQ(g.metadata["i32"], -2000000000);
  EXPECT_EQ(g.metadata["f32"], 1.5);
  EXPECT_EQ(g.metadata["bool"], true);
  EXPECT_EQ(g.metadata["str"], "héllo");
  EXPECT_EQ(g.metadata["u64"], uint64_t{1} << 62);
  EXPECT_EQ(g.metadata["i64"], -(int64_t{1} << 62));
  EXPECT_EQ(g.metadata["f64"], 0.1);
  EXPECT_EQ(g.metadata["af32"], nlohmann::json::array({0.5, -2.0}));
  EXPECT_EQ(g.metadata["ai32"], nlohmann::json::array({0, 1, -7}));
  EXPECT_EQ(g.metadata["au8"], nlohmann::json::array({255, 3}));
  EXPECT_EQ(g.metadata["astr"], nlohmann::json::array({"a", "", "bc"}));
  const int types[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12};
  const char* keys[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "u64", "i64", "f64"};
  for (int i = 0; i < 12; ++i) EXPECT_EQ(g.metadata_types[keys[i]], types[i]) << keys[i];
  ASSERT_EQ(g.tensors.size(), 2u);
  for (const k3::GgufTensor& t : g.tensors) EXPECT_EQ(t.offset % 64, 0u) << t.name;
  EXPECT_EQ(std::memcmp(g.find("t1")->data, t1.data(), 12), 0);
  EXPECT_EQ(std::memcmp(g.find("t2")->data, t2.data(), 80), 0);
  EXPECT_EQ(g.find("t2")->dims, (std::vector<int64_t>{8, 5}));
}

TEST(GgufWriter, CallbackWritingTheWrongSizeFails) {
  TempDir tmp;
  k3::GgufWriter w;
  const float x[4] = {};
  w.add_tensor("t", {4}, 0, [&](k3::GgufSink& s) { s.write(x, 12); });
  EXPECT_THROW(w.write((tmp.path / "w.gguf").string()), k3::Error);
}

// ---- malformed model GGUFs: the tiny K3 re-emitted with one edit ----

struct Edit {
  std::function<bool(const std::string& key)> drop_key = [](const std::string&) { return false; };
  std::function<bool(k3::GgufWriter&, const std::string& key)> replace_key = [](k3::GgufWriter&, const std::string&) { return false; };
  std::function<bool(const std::string& name)> drop_tensor = [](const std::string&) { return false; };
  std::function<void(const std::string& name, std::vector<int64_t>& dims, uint32_t& type, std::vector<uint8_t>& data)>
      tensor = [](const std::string&, std::vector<int64_t>&, uint32_t&, std::vector<uint8_t>&) {};
};

// Re-emits a parsed GGUF through the writer with `e` applied (arrays as I32 / F32 / strings).
std::string rewrite(const k3::Gguf& g, const Edit& e, const std::string& out) {
  k3::GgufWriter w;
  for (const auto& [k, v] : g.metadata.items()) {
    if (e.drop_key(k) || e.replace_key(w, k)) continue;
    switch (g.metadata_types[k].get<int>()) {
      case 4: w.set_u32(k, v.get<uint32_t>()); break;
      case 5: w.set_i32(k, v.get<int32_t>()); break;
      case 6: w.set_f32(k, v.get<float>()); break;
      case 7: w.set_bool(k, v.get<bool>()); break;
      case 8: w.set_string(k, v.get<std::string>()); break;
      case 9:
        if (!v.empty() && v[0].is_string()) w.set_array_strings(k, v.get<std::vector<std::string>>());
        else if (!v.empty() && v[0].is_number_float()) w.set_array(k, k3::GgufType::F32, v.get<std::vector<double>>());
        else w.set_array_i64(k, k3::GgufType::I32, v.get<std::vector<int64_t>>());
        break;
      default: ADD_FAILURE() << "unexpected type for " << k;
    }
  }
  for (const k3::GgufTensor& t : g.tensors) {
    if (e.drop_tensor(t.name)) continue;
    auto dims = t.dims;
    uint32_t type = t.type;
    auto data = std::make_shared<std::vector<uint8_t>>(t.data, t.data + t.bytes);
    e.tensor(t.name, dims, type, *data);
    w.add_tensor(t.name, dims, type, [data](k3::GgufSink& s) { s.write(data->data(), data->size()); });
  }
  w.write(out);
  return out;
}

class GgufMalformed : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = write_tiny_gguf("tiny-k3", (tmp_.path / "good.gguf").string());
    file_ = std::make_unique<k3::GgufFile>(path_);
  }
  // The error loading the edited file gives (empty if it loads).
  std::string error_of(const Edit& e) {
    const std::string p = rewrite(file_->gguf(), e, (tmp_.path / "bad.gguf").string());
    try {
      k3::Model::load(p);
    } catch (const k3::Error& ex) {
      return ex.what();
    }
    return "";
  }
  TempDir tmp_;
  std::string path_;
  std::unique_ptr<k3::GgufFile> file_;
};

TEST_F(GgufMalformed, UneditedLoads) { EXPECT_EQ(error_of({}), ""); }

TEST_F(GgufMalformed, MissingKey) {
  Edit e;
  e.drop_key = [](const std::string& k) { return k == "kimi-k3.expert_count"; };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("'kimi-k3.expert_count': required key is missing"), std::string::npos) << m;
}

TEST_F(GgufMalformed, WrongTypedKey) {
  Edit e;
  e.replace_key = [](k3::GgufWriter& w, const std::string& k) {
    if (k != "kimi-k3.embedding_length") return false;
    w.set_string(k, "128");
    return true;
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("'kimi-k3.embedding_length': must be an integer, got STRING"), std::string::npos) << m;
}

TEST_F(GgufMalformed, OutOfRangeKey) {
  Edit e;
  e.replace_key = [](k3::GgufWriter& w, const std::string& k) {
    if (k != "kimi-k3.block_count") return false;
    w.set_u32(k, 100000);
    return true;
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("'kimi-k3.block_count': must be in 1..4096, got 100000"), std::string::npos) << m;
}

TEST_F(GgufMalformed, UnknownArchitecture) {
  Edit e;
  e.replace_key = [](k3::GgufWriter& w, const std::string& k) {
    if (k != "general.architecture") return false;
    w.set_string(k, "llama");
    return true;
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("unknown architecture 'llama' (supported: kimi-k3, kimi-linear)"), std::string::npos) << m;
}

TEST_F(GgufMalformed, WrongShape) {
  Edit e;
  e.tensor = [](const std::string& n, std::vector<int64_t>& dims, uint32_t&, std::vector<uint8_t>& d) {
    if (n != "blk.0.attn_q.weight") return;
    dims = {dims[0] / 2, dims[1] * 2};  // same bytes, another shape
    (void)d;
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("(GGUF 'blk.0.attn_q.weight')"), std::string::npos) << m;
  EXPECT_NE(m.find("expected [64, 128]"), std::string::npos) << m;
}

TEST_F(GgufMalformed, TypeWithoutWeightFormat) {
  Edit e;
  e.tensor = [](const std::string& n, std::vector<int64_t>& dims, uint32_t& type, std::vector<uint8_t>& d) {
    if (n != "blk.0.attn_q.weight") return;
    type = 9;  // Q8_1: 36 bytes per 32, a ggml type (llama.cpp's activation format) k3 has no WeightFormat for
    d.assign(static_cast<size_t>(dims[0] * dims[1] / 32 * 36), 0);
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("tensor 'blk.0.attn_q.weight' is Q8_1, which k3 cannot load there yet"), std::string::npos) << m;
}

// A block format is for matrices: a quantised norm vector is an error naming it.
TEST_F(GgufMalformed, QuantisedVector) {
  Edit e;
  e.tensor = [](const std::string& n, std::vector<int64_t>& dims, uint32_t& type, std::vector<uint8_t>& d) {
    if (n != "blk.0.attn_norm.weight") return;
    type = 8;  // Q8_0
    d.assign(static_cast<size_t>(dims[0] / 32 * 34), 0);
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("tensor 'blk.0.attn_norm.weight' is Q8_0"), std::string::npos) << m;
}

TEST_F(GgufMalformed, LyingExpertCount) {
  Edit e;
  e.replace_key = [](k3::GgufWriter& w, const std::string& k) {
    if (k != "kimi-k3.expert_count") return false;
    w.set_u32(k, 8);  // the stacked tensors hold 16
    return true;
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("tensor 'blk.1.ffn_gate_exps.weight': ne [64, 64, 16], expected 3 dimensions with 8 experts"),
            std::string::npos) << m;
}

TEST_F(GgufMalformed, LyingLayerKinds) {
  Edit e;
  e.replace_key = [](k3::GgufWriter& w, const std::string& k) {
    if (k != "kimi-k3.attention.head_count_kv") return false;
    w.set_array_i64(k, k3::GgufType::I32, {0, 0, 0});  // 8 layers
    return true;
  };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("'kimi-k3.attention.head_count_kv': has 3 entries, block_count is 8"), std::string::npos) << m;
}

TEST_F(GgufMalformed, MissingHalfOfKvB) {
  Edit e;
  e.drop_tensor = [](const std::string& n) { return n == "blk.3.attn_v_b.weight"; };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("tensor 'blk.3.attn_v_b.weight' is missing"), std::string::npos) << m;
}

// llama-quantize's Q4_K_M writes attn_k_b (rows of qk_nope = 128 values, not whole 256-blocks) in its fallback
// Q5_0 / Q8_0 beside a Q4_K attn_v_b: kv_b's halves may have two types (found on the H200 in session 16: such a
// file of the Kimi-Linear-dims slice did not load). tiny-k3's halves are 16 values wide (no block format fits),
// so the test gives attn_k_b another FLOAT type: widened to F32 (exact: the same logits bit for bit) and
// narrowed to F16 (exact too for BF16 values in f16's normal range, which the test asserts): the same logits.
TEST_F(GgufMalformed, KvBHalvesOfTwoTypesLoad) {
  const std::vector<int32_t> toks{5, 17, 3, 99, 42, 7};
  const std::vector<float> ref = run(*k3::Model::load(path_), toks, false);
  const uint32_t stored = file_->gguf().find("blk.3.attn_k_b.weight")->type;
  ASSERT_TRUE(stored == 0 || stored == 30) << "tiny-k3's attn_k_b is F32 or BF16 in the GGUF, not type " << stored;
  const auto load_edited = [&](uint32_t to) {  // to: 0 = F32, 1 = F16
    Edit e;
    e.tensor = [stored, to](const std::string& n, std::vector<int64_t>&, uint32_t& type, std::vector<uint8_t>& data) {
      if (n != "blk.3.attn_k_b.weight") return;
      std::vector<float> v(data.size() / (stored == 0 ? 4 : 2));
      for (size_t i = 0; i < v.size(); ++i) {
        uint16_t h;
        if (stored == 0) std::memcpy(&v[i], &data[4 * i], 4);
        else std::memcpy(&h, &data[2 * i], 2), v[i] = k3::bf16_to_f32(h);
      }
      data.resize(v.size() * (to == 0 ? 4 : 2));
      for (size_t i = 0; i < v.size(); ++i) {
        if (to == 0) {
          std::memcpy(&data[4 * i], &v[i], 4);
        } else {  // exact for a value with <= 10 mantissa bits in f16's normal range (or zero), as BF16 values are
          uint32_t b;
          std::memcpy(&b, &v[i], 4);
          const uint32_t ex = (b >> 23) & 0xff;
          ASSERT_TRUE(v[i] == 0.f || (ex >= 113 && ex <= 142 && (b & 0x1fff) == 0)) << "not exact in f16: " << v[i];
          const uint16_t h = static_cast<uint16_t>(((b >> 16) & 0x8000) | (v[i] == 0.f ? 0 : ((ex - 112) << 10) | ((b >> 13) & 0x3ff)));
          std::memcpy(&data[2 * i], &h, 2);
        }
      }
      type = to;
    };
    const std::string p = rewrite(file_->gguf(), e, (tmp_.path / ("kvb" + std::to_string(to) + ".gguf")).string());
    return run(*k3::Model::load(p), toks, false);
  };
  if (stored != 0) {  // BF16 halves: an F32 attn_k_b beside the BF16 attn_v_b
    const std::vector<float> widened = load_edited(0);
    EXPECT_EQ(0, std::memcmp(widened.data(), ref.data(), ref.size() * 4));
  }
  const std::vector<float> narrowed = load_edited(1);
  EXPECT_EQ(0, std::memcmp(narrowed.data(), ref.data(), ref.size() * 4));
}

TEST_F(GgufMalformed, MissingTensorNamedInGgufTerms) {
  Edit e;
  e.drop_tensor = [](const std::string& n) { return n == "blk.2.ssm_beta.weight"; };
  const std::string m = error_of(e);
  EXPECT_NE(m.find("missing tensor 'language_model.model.layers.2.self_attn.b_proj.weight' (GGUF 'blk.2.ssm_beta.weight')"),
            std::string::npos) << m;
}

TEST(GgufModelPath, NonGgufFileIsAClearError) {
  TempDir tmp;
  const std::string p = (tmp.path / "x.gguf").string();
  FILE* f = std::fopen(p.c_str(), "wb");
  std::fputs("not a gguf", f);
  std::fclose(f);
  try {
    k3::Model::load(p);
    FAIL() << "loaded";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("neither an HF checkpoint directory nor a GGUF file"), std::string::npos) << e.what();
  }
}

}  // namespace

// `--tensor-type REGEX=TYPE` (k3 convert): dense matrices written quantised load as that block format (the
// bytes are what quant::quantize_row makes of the stored row), run, and stay close to the HF dir's logits;
// experts, the router and vectors stay as stored.
// The trained k3-tiny: the random tiny checkpoints' near-tied routing turns any rounding into large logit
// changes (their bf16 GEMM path measures rel 0.9 on the GPU), which would hide a layout error in noise.
TEST(GgufQuantised, DenseMatricesLoadAsTheirBlocks) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  TempDir t;
  const std::string path = t.str() + "/q8.gguf";
  k3::GgufWriter w;
  const auto st = k3::add_model_to_gguf(w, c, ck, "k3-tiny", {k3::parse_tensor_type_rule("attn|ffn_(gate|up|down)\\.|output=q8_0")});
  w.write(path);
  EXPECT_GT(st.quantised, 0);
  auto hf = k3::Model::load(dir);
  auto gg = k3::Model::load(path);
  int q8 = 0;
  k3::for_each_matrix(gg->weights(), [&](const k3::WeightMatrix& m) { q8 += m.format == k3::WeightFormat::Q8_0; });
  EXPECT_EQ(q8, st.quantised);
  // The head: its rows are the quantised HF rows.
  const k3::WeightMatrix& a = hf->weights().lm_head;
  const k3::WeightMatrix& b = gg->weights().lm_head;
  ASSERT_EQ(b.format, k3::WeightFormat::Q8_0);
  std::vector<float> row(static_cast<size_t>(a.cols)), want(row.size()), got(row.size());
  std::vector<uint8_t> blocks(static_cast<size_t>(k3::row_data_bytes(k3::WeightFormat::Q8_0, a.cols)));
  for (int64_t r : {int64_t{0}, a.rows / 2, a.rows - 1}) {
    k3::cpu::dequant_row(a, r, row.data());
    k3::quant::quantize_row(k3::WeightFormat::Q8_0, row.data(), a.cols, nullptr, blocks.data());
    k3::quant::dequantize_row(k3::WeightFormat::Q8_0, blocks.data(), a.cols, want.data());
    k3::cpu::dequant_row(b, r, got.data());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << "row " << r;
  }
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back((i * 37 + 5) % static_cast<int32_t>(c.vocab_size));
  const auto ref = run(*hf, toks, false), q = run(*gg, toks, false);
  ASSERT_EQ(ref.size(), q.size());
  const double rel = rms_rel(q, ref);
  std::printf("[ gguf ] k3-tiny with Q8_0 dense matrices: logits rel %.3g vs the HF dir\n", rel);
  EXPECT_GT(rel, 0.0);   // quantised: not the same model
  EXPECT_LT(rel, 0.2);   // measured 0.053 (KLD 7.7e-3 on prose, docs/quantization.md); a misread layout gives ~1
  EXPECT_EQ(k3::parse_tensor_type_rule("attn=iq2_xxs").format, k3::WeightFormat::IQ2_XXS);  // the codebook i-quants are written too
  EXPECT_THROW(k3::parse_tensor_type_rule("attn=mxfp4"), k3::Error);  // read, not written
  EXPECT_THROW(k3::parse_tensor_type_rule("attn=q4_9"), k3::Error);
  EXPECT_EQ(k3::parse_tensor_type_rule("attn=q5_0").format, k3::WeightFormat::Q5_0);
  EXPECT_THROW(k3::parse_tensor_type_rule("=q8_0"), k3::Error);
  k3::GgufWriter w2;
  EXPECT_THROW(k3::add_model_to_gguf(w2, c, ck, "x", {k3::parse_tensor_type_rule("no_such_tensor=q8_0")}), k3::Error);
}

// The codebook i-quants end to end: k3-tiny with one i-quant per kind of dense matrix (the 256-wide inputs
// take it, the 96-wide shared-expert down projection falls back to IQ4_NL as llama-quantize does) loads,
// binds each matrix in its format with exactly the quantiser's rows, and runs.
TEST(GgufQuantised, CodebookIQuantsLoadAndRun) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  k3test::TempDir t;
  const std::string path = t.str() + "/iq.gguf";
  k3::GgufWriter w;
  std::vector<k3::TensorTypeRule> rules;
  for (const char* r : {"attn_q_a=iq3_xxs", "attn_kv_a_mqa=iq3_s", "ffn_gate_shexp=iq2_xxs", "ffn_up_shexp=iq2_s",
                        "ffn_down_shexp=iq2_xs", "ssm_beta=iq1_s", "ssm_f_a=iq1_m"})
    rules.push_back(k3::parse_tensor_type_rule(r));
  const auto st = k3::add_model_to_gguf(w, c, ck, "k3-tiny", rules);
  w.write(path);
  EXPECT_GT(st.fallbacks, 0);  // ffn_down_shexp: 96 wide
  constexpr uint32_t kIq4Nl = 20;
  EXPECT_GT(count_ggml_type(w, kIq4Nl), 0);
  auto hf = k3::Model::load(dir);
  auto gg = k3::Model::load(path);
  std::map<k3::WeightFormat, int> seen;
  k3::for_each_matrix(gg->weights(), [&](const k3::WeightMatrix& m) { ++seen[m.format]; });
  for (k3::WeightFormat f : {k3::WeightFormat::IQ3_XXS, k3::WeightFormat::IQ3_S, k3::WeightFormat::IQ2_XXS, k3::WeightFormat::IQ2_S,
                             k3::WeightFormat::IQ1_S, k3::WeightFormat::IQ1_M})
    EXPECT_GT(seen[f], 0) << k3::weight_format_name(f);
  // A layer's q_a rows are the quantiser's output for the HF rows.
  const k3::WeightMatrix* qa_hf = nullptr;
  const k3::WeightMatrix* qa_gg = nullptr;
  for (size_t l = 0; l < gg->weights().layers.size() && !qa_gg; ++l) {
    const k3::WeightMatrix& m = gg->weights().layers[l].mla.q_a;
    if (m.format == k3::WeightFormat::IQ3_XXS) qa_gg = &m, qa_hf = &hf->weights().layers[l].mla.q_a;
  }
  ASSERT_NE(qa_gg, nullptr);
  std::vector<float> row(static_cast<size_t>(qa_hf->cols)), want(row.size()), got(row.size());
  std::vector<uint8_t> blocks(static_cast<size_t>(k3::row_data_bytes(k3::WeightFormat::IQ3_XXS, qa_hf->cols)));
  for (int64_t r : {int64_t{0}, qa_hf->rows - 1}) {
    k3::cpu::dequant_row(*qa_hf, r, row.data());
    k3::quant::quantize_row(k3::WeightFormat::IQ3_XXS, row.data(), qa_hf->cols, nullptr, blocks.data());
    k3::quant::dequantize_row(k3::WeightFormat::IQ3_XXS, blocks.data(), qa_hf->cols, want.data());
    k3::cpu::dequant_row(*qa_gg, r, got.data());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * 4)) << "row " << r;
  }
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back((i * 37 + 5) % static_cast<int32_t>(c.vocab_size));
  const auto ref = run(*hf, toks, false), q = run(*gg, toks, false);
  const double rel = rms_rel(q, ref);
  std::printf("[ gguf ] k3-tiny with i-quant matrices: logits rel %.3g vs the HF dir\n", rel);
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 0.5);  // a misread layout gives ~1
}

// llama-quantize-style presets: every one applies to k3-tiny (each rule kind seen), a "keep" rule leaves
// matrices as stored, and an unknown name is an error listing the presets.
TEST(GgufQuantised, PresetsApplyAndKeepMeansAsStored) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  constexpr uint32_t kBf16 = 30, kQ8 = 8, kQ3K = 11, kQ4K = 12, kQ6K = 14, kQ5_0 = 6;
  for (const std::string& p : k3::quantize_preset_names()) {
    k3::GgufWriter w;
    const auto st = k3::add_model_to_gguf(w, c, ck, "x", k3::quantize_preset(p), nullptr, k3::gguf_file_type_of_preset(p));
    EXPECT_GT(st.quantised, 0) << p;
  }
  // general.file_type carries the preset's llama_ftype (llama.cpp's tools print it), read back from the written file.
  EXPECT_EQ(k3::gguf_file_type_of_preset("q4_k_m"), 15u);
  EXPECT_EQ(k3::gguf_file_type_of_preset("Q3_K_M"), 12u);
  EXPECT_EQ(k3::gguf_file_type_of_preset("Q4_K_M-E2"), 10u);
  EXPECT_THROW(k3::gguf_file_type_of_preset("Q9_K"), k3::Error);
  for (const auto& [ft, expect] : std::vector<std::pair<std::optional<uint32_t>, uint32_t>>{{15u, 15u}, {std::nullopt, 38u}}) {
    k3::GgufWriter w;
    k3::add_model_to_gguf(w, c, ck, "x", k3::quantize_preset("Q4_K_M"), nullptr, ft);
    k3test::TempDir td;
    w.write(td.str() + "/ft.gguf");
    std::ifstream in(td.str() + "/ft.gguf", std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const k3::Gguf g = k3::parse_gguf(bytes, "ft.gguf");
    ASSERT_TRUE(g.metadata.contains("general.file_type"));
    EXPECT_EQ(g.metadata["general.file_type"].get<uint64_t>(), expect);
  }
  k3::GgufWriter plain, km, kda16;
  k3::add_model_to_gguf(plain, c, ck, "x");
  k3::add_model_to_gguf(km, c, ck, "x", k3::quantize_preset("q4_k_m"));
  k3::add_model_to_gguf(kda16, c, ck, "x", k3::quantize_preset("Q4_K_M-KDA16"));
  EXPECT_GT(count_ggml_type(km, kQ4K), 0);
  EXPECT_GT(count_ggml_type(km, kQ6K), 0);                            // ffn_down / output / token_embd
  EXPECT_EQ(km.tensor_types().size(), plain.tensor_types().size());  // the same tensors, some re-typed
  // Every quantised one was BF16; widths that are not whole 256-blocks fell back as llama-quantize does
  // (Q4_K -> Q5_0, Q6_K -> Q8_0).
  EXPECT_GT(count_ggml_type(km, kQ5_0), 0);
  EXPECT_EQ(count_ggml_type(plain, kBf16) - count_ggml_type(km, kBf16),
            count_ggml_type(km, kQ4K) + count_ggml_type(km, kQ6K) + count_ggml_type(km, kQ8) + count_ggml_type(km, kQ5_0));
  EXPECT_GT(count_ggml_type(kda16, kBf16), count_ggml_type(km, kBf16));   // KDA and attention kept BF16
  // Q3_K_M as llama-quantize allocates it: the head Q6_K, KDA value / output projections and ffn_down Q4_K.
  k3::GgufWriter k3m;
  k3::add_model_to_gguf(k3m, c, ck, "x", k3::quantize_preset("Q3_K_M"));
  k3test::TempDir t3;
  k3m.write(t3.str() + "/q3.gguf");
  std::ifstream in(t3.str() + "/q3.gguf", std::ios::binary);
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const k3::Gguf g3 = k3::parse_gguf(bytes, "q3.gguf");
  for (const char* name : {"output.weight", "blk.1.attn_v.weight", "blk.1.attn_q.weight"}) {
    const k3::GgufTensor* tt = g3.find(name);
    ASSERT_NE(tt, nullptr) << name;
    const std::string n = name;
    EXPECT_EQ(tt->type, n == "output.weight" ? kQ6K : n == "blk.1.attn_q.weight" ? kQ3K : kQ4K) << name;
  }
  const k3::GgufTensor* ao = g3.find("blk.1.attn_output.weight");  // 128 wide on k3-tiny: Q4_K's fallback
  ASSERT_NE(ao, nullptr);
  EXPECT_EQ(ao->type, kQ5_0);
  EXPECT_LT(count_ggml_type(kda16, kQ4K), count_ggml_type(km, kQ4K));
  EXPECT_THROW(k3::quantize_preset("Q9_K"), k3::Error);
}

// kv_b's halves: quantised only by a rule naming them (a catch-all keeps them as stored); the key half transposed
// per head on the way out, so the loaded kv_b (the loader dequantises the halves back into it) must equal the
// checkpoint's within Q8_0's rounding -- a transposition slip would be off by the values' own size.
TEST(GgufQuantised, KvbHalvesOnlyByARuleNamingThem) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  constexpr uint32_t kBf16 = 30, kQ8 = 8, kQ5_0 = 6;
  k3test::TempDir t;
  auto types_of = [&](const std::vector<k3::TensorTypeRule>& rules, const std::string& file) {
    k3::GgufWriter w;
    k3::add_model_to_gguf(w, c, ck, "x", rules);
    w.write(t.str() + "/" + file);
    std::ifstream in(t.str() + "/" + file, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const k3::Gguf g = k3::parse_gguf(bytes, file);
    std::pair<uint32_t, uint32_t> kv{0, 0};
    for (const auto& x : g.tensors) {
      if (x.name == "blk.3.attn_k_b.weight") kv.first = x.type;
      if (x.name == "blk.3.attn_v_b.weight") kv.second = x.type;
    }
    return kv;
  };
  EXPECT_EQ(types_of({k3::parse_tensor_type_rule(".*=q8_0")}, "all.gguf"), std::make_pair(kBf16, kBf16));
  EXPECT_EQ(types_of({k3::parse_tensor_type_rule("attn_[kv]_b=q4_k")}, "k4.gguf"), std::make_pair(kQ5_0, kQ5_0));  // 32 / 64 wide: Q4_K's fallback
  EXPECT_EQ(types_of({k3::parse_tensor_type_rule("attn_k_b=q8_0"), k3::parse_tensor_type_rule("attn_v_b=q8_0")}, "q8.gguf"),
            std::make_pair(kQ8, kQ8));
  auto hf = k3::Model::load(dir);
  auto gg = k3::Model::load(t.str() + "/q8.gguf");
  int64_t mla = 0;
  for (size_t l = 0; l < hf->weights().layers.size(); ++l) {
    const auto& a = hf->weights().layers[l];
    if (a.is_kda) continue;
    ++mla;
    const k3::WeightVector& ref = a.mla.kv_b;
    const k3::WeightVector& got = gg->weights().layers[l].mla.kv_b;
    ASSERT_EQ(got.size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double r = ref.data()[i], d = got.data()[i] - r;
      num += d * d, den += r * r;
    }
    const double rel = std::sqrt(num / den);
    EXPECT_GT(rel, 0.0) << "layer " << l << ": Q8_0 rounds";
    EXPECT_LT(rel, 0.01) << "layer " << l;  // Q8_0 ~0.4%; a transposed head ~1.4
  }
  EXPECT_GT(mla, 0);
}

// A GGUF's quantised kv_b halves are bound as stored beside the fp32 rebuild (MlaWeights::k_b_blocks / v_b_blocks,
// head-major rows), the CPU's absorbed decode reads them -- logits within absorb_q's summation order of the fp32
// path's (K3_MLA_STORED_HALVES=0), and not its bits, which shows the switch takes another path -- and a GGUF-to-GGUF
// conversion that names no rule for them writes their bytes back unchanged (until session 34: the fp32 rebuild).
TEST(GgufQuantised, QuantisedKvbHalvesReadAndWrittenAsStored) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = k3::load_model_config(dir);
  k3test::TempDir t;
  {
    const k3::Checkpoint ck(dir);
    k3::GgufWriter w;
    k3::add_model_to_gguf(w, c, ck, "x", {k3::parse_tensor_type_rule("attn_k_b=q8_0"), k3::parse_tensor_type_rule("attn_v_b=q5_0")});
    w.write(t.str() + "/q.gguf");
  }
  auto gg = k3::Model::load(t.str() + "/q.gguf");
  int64_t mla = 0;
  for (const auto& L : gg->weights().layers) {
    if (L.is_kda) continue;
    ++mla;
    EXPECT_EQ(L.mla.k_b_blocks.format, k3::WeightFormat::Q8_0);
    EXPECT_EQ(L.mla.v_b_blocks.format, k3::WeightFormat::Q5_0);
    EXPECT_EQ(L.mla.k_b_blocks.rows, c.mla_heads * c.kv_lora_rank);
    EXPECT_EQ(L.mla.k_b_blocks.cols, c.qk_nope_dim);
    EXPECT_EQ(L.mla.v_b_blocks.rows, c.mla_heads * c.v_head_dim);
    EXPECT_EQ(L.mla.v_b_blocks.cols, c.kv_lora_rank);
  }
  ASSERT_GT(mla, 0);
  const std::vector<int32_t> toks{5, 17, 3, 99, 42, 7, 11, 250};
  const std::vector<float> stored = run(*gg, toks, true);
  setenv("K3_MLA_STORED_HALVES", "0", 1);
  const std::vector<float> rebuilt = run(*gg, toks, true);
  unsetenv("K3_MLA_STORED_HALVES");
  ASSERT_EQ(stored.size(), rebuilt.size());
  EXPECT_LT(rms_rel(stored, rebuilt), 1e-5);
  EXPECT_NE(std::memcmp(stored.data(), rebuilt.data(), stored.size() * 4), 0) << "K3_MLA_STORED_HALVES=0 took the same path";
  // Two sequences decoding in one step (each head's halves decoded once for both tokens): each as when alone.
  {
    const std::vector<int32_t> other{9, 31, 4, 77, 120, 2, 64, 8};
    const std::vector<float> alone = run(*gg, other, true);
    auto ca = gg->new_cache(), cb = gg->new_cache();
    k3::ForwardOptions fo;
    fo.path = k3::AttnPath::Decode;
    std::vector<float> logits, got_a, got_b;
    for (size_t i = 0; i < toks.size(); ++i) {
      gg->forward_batch({k3::BatchItem{std::span<const int32_t>(&toks[i], 1), ca.get(), true},
                         k3::BatchItem{std::span<const int32_t>(&other[i], 1), cb.get(), true}},
                        logits, fo);
      const size_t v = logits.size() / 2;
      got_a.insert(got_a.end(), logits.begin(), logits.begin() + static_cast<std::ptrdiff_t>(v));
      got_b.insert(got_b.end(), logits.begin() + static_cast<std::ptrdiff_t>(v), logits.end());
    }
    EXPECT_LT(rms_rel(got_a, stored), 1e-6);
    EXPECT_LT(rms_rel(got_b, alone), 1e-6);
  }
  // Written back as they came.
  const k3::ModelFiles in = k3::open_model_files(t.str() + "/q.gguf");
  k3::GgufWriter again;
  k3::add_model_to_gguf(again, in.config, *in.checkpoint, "x");
  again.write(t.str() + "/again.gguf");
  const k3::GgufFile a(t.str() + "/q.gguf"), b(t.str() + "/again.gguf");
  int64_t halves = 0;
  for (const auto& ta : a.gguf().tensors) {
    if (ta.name.find("attn_k_b") == std::string::npos && ta.name.find("attn_v_b") == std::string::npos) continue;
    ++halves;
    const k3::GgufTensor* tb = b.gguf().find(ta.name);
    ASSERT_NE(tb, nullptr) << ta.name;
    EXPECT_EQ(tb->type, ta.type) << ta.name;
    EXPECT_EQ(tb->dims, ta.dims) << ta.name;
    ASSERT_EQ(tb->bytes, ta.bytes) << ta.name;
    EXPECT_EQ(std::memcmp(tb->data, ta.data, ta.bytes), 0) << ta.name;
  }
  EXPECT_EQ(halves, 2 * mla);
  // Requantising them is refused as for any stored block matrix; a rule with their own type keeps them.
  k3::GgufWriter requant, same;
  try {
    k3::add_model_to_gguf(requant, in.config, *in.checkpoint, "x", {k3::parse_tensor_type_rule("attn_k_b=q4_0")});
    ADD_FAILURE() << "requantised attn_k_b";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("k3 does not requantise"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(k3::add_model_to_gguf(same, in.config, *in.checkpoint, "x",
                                        {k3::parse_tensor_type_rule("attn_k_b=q8_0"), k3::parse_tensor_type_rule("attn_v_b=q5_0")}));
}

// Quantised kv_b halves that lie -- flattened or swapped dims over the same bytes (a block type the rows are not whole
// blocks of cannot even be written: the GGUF writer and parser refuse it) -- are clear errors naming the tensor; one quantised half beside a float one loads through the fp32 rebuild (no stored
// halves bound) with the logits of the file it came from within Q8_0's rounding.
TEST(GgufQuantised, QuantisedKvbHalvesThatLieAreClearErrors) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  k3test::TempDir t;
  {
    const k3::Checkpoint ck(dir);
    k3::GgufWriter w;
    k3::add_model_to_gguf(w, k3::load_model_config(dir), ck, "x", {k3::parse_tensor_type_rule("attn_[kv]_b=q8_0")});
    w.write(t.str() + "/q.gguf");
  }
  const k3::GgufFile q(t.str() + "/q.gguf");
  const auto error_of = [&](const Edit& e, const std::string& name) {
    const std::string p = rewrite(q.gguf(), e, t.str() + "/" + name);
    try {
      k3::Model::load(p);
    } catch (const k3::Error& ex) {
      return std::string(ex.what());
    }
    return std::string();
  };
  constexpr uint32_t kF32 = 0;
  Edit flat;  // [nope, kv_lora, heads] flattened to [nope, kv_lora x heads]: the same bytes, no heads dimension
  flat.tensor = [](const std::string& n, std::vector<int64_t>& dims, uint32_t&, std::vector<uint8_t>&) {
    if (n == "blk.3.attn_k_b.weight") dims = {dims[0], dims[1] * dims[2]};
  };
  std::string m = error_of(flat, "flat.gguf");
  EXPECT_NE(m.find("attn_k_b"), std::string::npos) << m;
  Edit swapped;  // [nope, kv_lora, heads] written as [kv_lora, nope, heads]: the same bytes, the wrong shape
  swapped.tensor = [](const std::string& n, std::vector<int64_t>& dims, uint32_t&, std::vector<uint8_t>&) {
    if (n == "blk.3.attn_v_b.weight") std::swap(dims[0], dims[1]);
  };
  m = error_of(swapped, "swapped.gguf");
  EXPECT_NE(m.find("attn_v_b"), std::string::npos) << m;
  Edit mixed;  // attn_v_b widened to F32 (exact): the halves are not both block formats
  mixed.tensor = [](const std::string& n, std::vector<int64_t>& dims, uint32_t& type, std::vector<uint8_t>& data) {
    if (n != "blk.3.attn_v_b.weight") return;
    std::vector<float> v(static_cast<size_t>(dims[0] * dims[1] * dims[2]));
    k3::quant::dequantize_row(k3::WeightFormat::Q8_0, data.data(), static_cast<int64_t>(v.size()), v.data());
    data.assign(reinterpret_cast<const uint8_t*>(v.data()), reinterpret_cast<const uint8_t*>(v.data() + v.size()));
    type = kF32;
  };
  ASSERT_EQ(error_of(mixed, "mixed.gguf"), "");
  auto gm = k3::Model::load(t.str() + "/mixed.gguf");
  auto gq = k3::Model::load(t.str() + "/q.gguf");
  ASSERT_FALSE(gm->weights().layers[3].is_kda);
  EXPECT_TRUE(gm->weights().layers[3].mla.k_b_blocks.empty() && gm->weights().layers[3].mla.v_b_blocks.empty());
  EXPECT_FALSE(gq->weights().layers[3].mla.k_b_blocks.empty());
  const std::vector<int32_t> toks{5, 17, 3, 99, 42, 7};
  EXPECT_LT(rms_rel(run(*gm, toks, true), run(*gq, toks, true)), 1e-5);
}

// Routed experts: quantised only by a rule naming them ("exps"), per expert from their MXFP4 values; a width
// that is not whole blocks of the type keeps them as shipped; the GGUF loads with its experts in the new
// format and stays close to the HF dir.
TEST(GgufQuantised, ExpertRulesRequantiseTheStack) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  const k3::ModelConfig c = k3::load_model_config(dir);
  const k3::Checkpoint ck(dir);
  constexpr uint32_t kMxfp4 = 39, kQ8 = 8;
  k3::GgufWriter all, catchall, kq;
  k3::add_model_to_gguf(all, c, ck, "x", {k3::parse_tensor_type_rule("_exps=q8_0")});
  k3::add_model_to_gguf(catchall, c, ck, "x", {k3::parse_tensor_type_rule(".*=q8_0")});
  k3::add_model_to_gguf(kq, c, ck, "x", {k3::parse_tensor_type_rule("_exps=q3_k")});
  EXPECT_EQ(count_ggml_type(all, kMxfp4), 0);
  EXPECT_GT(count_ggml_type(catchall, kMxfp4), 0);  // ".*" does not name the experts: they stay MXFP4
  EXPECT_EQ(count_ggml_type(kq, kMxfp4), count_ggml_type(catchall, kMxfp4));  // widths 128 / 96: not whole 256-blocks
  k3test::TempDir t;
  all.write(t.str() + "/e.gguf");
  auto hf = k3::Model::load(dir);
  auto gg = k3::Model::load(t.str() + "/e.gguf");
  int64_t q8_experts = 0;
  for (const auto& L : gg->weights().layers)
    for (const auto& e : L.moe.experts) q8_experts += e.gate.format == k3::WeightFormat::Q8_0;
  EXPECT_GT(q8_experts, 0);
  EXPECT_GT(count_ggml_type(all, kQ8), 0);
  std::vector<int32_t> toks;
  for (int i = 0; i < 24; ++i) toks.push_back((i * 37 + 5) % static_cast<int32_t>(c.vocab_size));
  const auto ref = run(*hf, toks, false), q = run(*gg, toks, false);
  const double rel = rms_rel(q, ref);
  std::printf("[ gguf ] k3-tiny with Q8_0 experts (from MXFP4): logits rel %.3g vs the HF dir\n", rel);
  EXPECT_LT(rel, 0.2);  // measured 0.026 (Q8_0 rounding of the MXFP4 values); a misread stack gives ~1
}

// A GGUF as the input of convert / quantize (as llama-quantize takes one): k3-tiny's BF16 + MXFP4 GGUF
// quantised with a dense mix and with the experts requantised gives the same tensors, types and bytes as
// quantising the HF directory (the GGUF adapter's views, ggml's MXFP4 blocks and ssm_a = -exp(A_log) as
// stored are written back as they were); a tensor the input already holds in another block type is refused,
// not requantised.
TEST(GgufQuantised, GgufInputQuantisesAsTheHfDir) {
  const std::string dir = k3test::source_path("models/k3-tiny");
  k3test::TempDir t;
  {
    k3::GgufWriter w;
    const k3::Checkpoint ck(dir);
    k3::add_model_to_gguf(w, k3::load_model_config(dir), ck, "x");
    w.write(t.str() + "/in.gguf");
  }
  const k3::ModelFiles in = k3::open_model_files(t.str() + "/in.gguf");
  ASSERT_TRUE(in.gguf);
  for (const char* preset : {"Q4_K_M", "Q4_K_M-E3"}) {
    k3::GgufWriter from_hf, from_gguf;
    const k3::Checkpoint ck(dir);
    k3::add_model_to_gguf(from_hf, k3::load_model_config(dir), ck, "x", k3::quantize_preset(preset));
    k3::add_model_to_gguf(from_gguf, in.config, *in.checkpoint, "x", k3::quantize_preset(preset));
    from_hf.write(t.str() + "/a.gguf");
    from_gguf.write(t.str() + "/b.gguf");
    const k3::GgufFile a(t.str() + "/a.gguf"), b(t.str() + "/b.gguf");
    ASSERT_EQ(a.gguf().tensors.size(), b.gguf().tensors.size()) << preset;
    int64_t differ = 0;
    for (const auto& ta : a.gguf().tensors) {
      const k3::GgufTensor* tb = b.gguf().find(ta.name);
      ASSERT_NE(tb, nullptr) << ta.name;
      differ += ta.type != tb->type || ta.dims != tb->dims || ta.bytes != tb->bytes || std::memcmp(ta.data, tb->data, ta.bytes) != 0;
    }
    EXPECT_EQ(differ, 0) << preset;
    EXPECT_EQ(a.gguf().metadata, b.gguf().metadata) << preset;
  }
  // The Q4_K_M file as input: its Q6_K / Q4_K matrices may be kept, not requantised to Q8_0.
  k3::GgufWriter q;
  {
    const k3::Checkpoint ck(dir);
    k3::add_model_to_gguf(q, k3::load_model_config(dir), ck, "x", k3::quantize_preset("Q4_K_M"));
    q.write(t.str() + "/q.gguf");
  }
  const k3::ModelFiles qin = k3::open_model_files(t.str() + "/q.gguf");
  k3::GgufWriter again, keep;
  try {
    k3::add_model_to_gguf(again, qin.config, *qin.checkpoint, "x", k3::quantize_preset("Q8_0"));
    ADD_FAILURE() << "requantised a Q6_K / Q4_K tensor";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("k3 does not requantise"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(k3::add_model_to_gguf(keep, qin.config, *qin.checkpoint, "x", {k3::parse_tensor_type_rule(".*=keep")}));
}
