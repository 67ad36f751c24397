// Issue 11 items 7 and 9 (loader part): each test breaks one input the loaders read and fails on
// the code before the fix (a wrap-around, a hang, a silent default or a huge allocation).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>

#include "k3/core/error.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/weights.h"
#include "k3/text/tiktoken_bpe.h"
#include "k3/text/tokenizer.h"
#include "checkpoint_edit.h"
#include "test_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const k3::Error& e) {
    return e.what();
  }
  return "";
}

json tiny_k3_config() {
  std::ifstream f(k3test::source_path("tests/data/tiny-k3/config.json"));
  return json::parse(f);
}

std::string parse_capturing_stderr(const json& j, std::string* err_out) {
  testing::internal::CaptureStderr();
  const std::string err = error_of([&] { k3::parse_model_config(j.dump(), "config.json"); });
  *err_out = testing::internal::GetCapturedStderr();
  return err;
}

}  // namespace

TEST(LoaderHardening, SafetensorsShapeWhoseByteCountOverflowsIsRejected) {
  k3test::TempDir d;
  const std::string p = d.str() + "/x.safetensors";
  // 2^32 x 2^32 x 4 bytes wraps to 0 in 64 bits: before the fix this "matched" data_offsets [0, 0].
  k3test::write_safetensors_raw(
      p, json{{"w", {{"dtype", "F32"}, {"shape", {uint64_t{1} << 32, uint64_t{1} << 32}}, {"data_offsets", {0, 0}}}}},
      {});
  EXPECT_NE(error_of([&] { k3::SafetensorsFile f(p); }).find("too large"), std::string::npos);
  // A zero dimension last: zero bytes, but numel() multiplies 2^62 x 8 first and would overflow.
  k3test::write_safetensors_raw(
      p, json{{"w", {{"dtype", "F32"}, {"shape", {int64_t{1} << 62, 8, 0}}, {"data_offsets", {0, 0}}}}}, {});
  const std::string e1 = error_of([&] { k3::SafetensorsFile f(p); });
  EXPECT_NE(e1.find("too large"), std::string::npos) << e1;
}

TEST(LoaderHardening, SafetensorsNonIntegerNumbersAndDuplicateNamesAreRejected) {
  k3test::TempDir d;
  const std::string p = d.str() + "/x.safetensors";
  const std::vector<uint8_t> data(16);
  for (const json& bad : {json{{"dtype", "F32"}, {"shape", {1.5}}, {"data_offsets", {0, 4}}},
                          json{{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0.0, 4.0}}},
                          json{{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {-4, 0}}},
                          json{{"dtype", "F32"}, {"shape", 4}, {"data_offsets", {0, 16}}}}) {
    k3test::write_safetensors_raw(p, json{{"w", bad}}, data);
    EXPECT_NE(error_of([&] { k3::SafetensorsFile f(p); }), "") << bad.dump();
  }
  // Two entries named "w": the JSON parser would silently keep the second.
  const std::string header = R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                             R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  std::ofstream(p, std::ios::binary) << bytes << header << std::string(16, '\0');
  EXPECT_NE(error_of([&] { k3::SafetensorsFile f(p); }).find("listed twice"), std::string::npos);
}

TEST(LoaderHardening, FifoInPlaceOfAnyInputFailsInsteadOfHanging) {
  k3test::TempDir d;
  for (const std::string name : {"config.json", "model.safetensors", "tiktoken.model"}) {
    const std::string p = d.str() + "/" + name;
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
    const auto t0 = std::chrono::steady_clock::now();
    std::string err;
    if (name == "config.json") err = error_of([&] { k3::load_model_config(d.str()); });
    if (name == "model.safetensors") err = error_of([&] { k3::SafetensorsFile f(p); });
    if (name == "tiktoken.model") err = error_of([&] { k3::text::TiktokenBpe::load(p); });
    EXPECT_NE(err.find("not a regular file"), std::string::npos) << name << ": " << err;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
    fs::remove(p);
  }
}

TEST(LoaderHardening, SymlinkLoopAndPathEscapesAreK3Errors) {
  k3test::TempDir d;
  fs::create_symlink(d.path / "loop", d.path / "loop");
  EXPECT_NE(error_of([&] { k3::Checkpoint c((d.path / "loop").string()); }), "");
  fs::create_symlink(d.path / "model.safetensors.index.json", d.path / "model.safetensors.index.json");
  EXPECT_NE(error_of([&] { k3::Checkpoint c(d.str()); }), "");
  fs::remove(d.path / "model.safetensors.index.json");
  std::ofstream(d.path / "model.safetensors.index.json") << R"({"weight_map": {"w": "../../etc/passwd"}})";
  EXPECT_NE(error_of([&] { k3::Checkpoint c(d.str()); }).find("plain file name"), std::string::npos);
}

TEST(LoaderHardening, MisspelledConfigKeyWarnsWithTheClosestKnownKey) {
  json j = tiny_k3_config();
  j["text_config"]["latent_moe_use_noro"] = true;
  std::string warn;
  EXPECT_EQ(parse_capturing_stderr(j, &warn), "");
  EXPECT_NE(warn.find("unknown config key 'text_config.latent_moe_use_noro'"), std::string::npos) << warn;
  EXPECT_NE(warn.find("did you mean 'text_config.latent_moe_use_norm'"), std::string::npos) << warn;
  EXPECT_EQ(std::count(warn.begin(), warn.end(), '\n'), 1) << warn;
  // On K3 the key is required: the error names the misspelling it found.
  j["text_config"].erase("latent_moe_use_norm");
  EXPECT_NE(parse_capturing_stderr(j, &warn).find("found 'text_config.latent_moe_use_noro': misspelled?"), std::string::npos);
}

TEST(LoaderHardening, RealConfigsLoadWithoutWarnings) {
  for (const std::string f : {"tests/data/configs/kimi-k3.json", "tests/data/configs/kimi-linear-48b-a3b.json",
                              "tests/data/tiny-k3/config.json", "tests/data/tiny-kimi-linear/config.json",
                              "resources/presets/kimi-k3.json", "resources/presets/kimi-linear-48b-a3b.json"}) {
    std::ifstream in(k3test::source_path(f));
    std::string warn;
    EXPECT_EQ(parse_capturing_stderr(json::parse(in), &warn), "") << f;
    EXPECT_EQ(warn, "") << f;
  }
}

TEST(LoaderHardening, K3ConfigMissingAKeyThatSelectsK3BehaviourIsAnError) {
  // Without these keys the Kimi-Linear defaults would load silently and produce garbage text.
  for (const std::string key : {"latent_moe_use_norm", "routed_expert_hidden_size", "mla_use_output_gate",
                                "attn_res_block_size", "routed_scaling_factor", "num_shared_experts"}) {
    json j = tiny_k3_config();
    j["text_config"].erase(key);
    std::string warn;
    EXPECT_NE(parse_capturing_stderr(j, &warn).find(key), std::string::npos) << key;
  }
  for (const std::string key : {"gate_lower_bound", "use_full_rank_gate"}) {
    json j = tiny_k3_config();
    j["text_config"]["linear_attn_config"].erase(key);
    std::string warn;
    EXPECT_NE(parse_capturing_stderr(j, &warn).find(key), std::string::npos) << key;
  }
}

TEST(LoaderHardening, HugeOrNonIntegerSizesFailBeforeAllocating) {
  for (const json& v : {json(1e9), json(1000000000), json(int64_t{1} << 40), json(8.5)}) {
    json j = tiny_k3_config();
    j["text_config"]["num_hidden_layers"] = v;
    std::string warn;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_NE(parse_capturing_stderr(j, &warn).find("num_hidden_layers"), std::string::npos) << v.dump();
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0) << v.dump();
  }
}

TEST(LoaderHardening, TokenIdsOutsideTheVocabularyAreRejected) {
  for (const std::string key : {"bos_token_id", "eos_token_id", "pad_token_id"})
    for (const json& v : {json(1024), json(-2), json(4294967296)}) {
      json j = tiny_k3_config();
      j[key] = v;
      std::string warn;
      EXPECT_NE(parse_capturing_stderr(j, &warn).find(key), std::string::npos) << key << " = " << v.dump();
    }
}

TEST(LoaderHardening, TiktokenRankFarPastTheFileIsRejected) {
  // One line claiming rank 16,777,215 made the table allocate 16M entries (~0.5 GB).
  EXPECT_NE(error_of([] { k3::text::TiktokenBpe::parse("QQ== 16777215\n", "t"); }).find("number of lines"),
            std::string::npos);
}

TEST(LoaderHardening, AddedTokenKeysMustBeWholeIdsAndContentsBounded) {
  k3test::TempDir d;
  fs::copy_file(k3test::source_path("tests/data/tiny-tokenizer/tiktoken.model"), d.path / "tiktoken.model");
  std::ifstream in(k3test::source_path("tests/data/tiny-tokenizer/tokenizer_config.json"));
  const json cfg = json::parse(in);
  auto with = [&](const std::function<void(json&)>& fn) {
    json j = cfg;
    fn(j);
    std::ofstream(d.path / "tokenizer_config.json") << j.dump();
    return error_of([&] { k3::text::Tokenizer::load(d.str()); });
  };
  EXPECT_EQ(with([](json&) {}), "");
  // "768x" was read as 768 by stoll (a second name for id 768, replacing the first).
  EXPECT_NE(with([](json& j) { j["added_tokens_decoder"]["769x"] = {{"content", "<x>"}}; }), "");
  EXPECT_NE(with([](json& j) { j["added_tokens_decoder"]["800"] = {{"content", std::string(1 << 20, '<')}}; }), "");
  EXPECT_NE(with([](json& j) { j["added_tokens_decoder"] = json::array(); }), "");
}

// Special-token search walks a trie. It tried every length up to the longest special token at each
// candidate byte, hashing each substring: with one 200-byte special token, 1 MB of "<|" took ~10^10
// byte operations (minutes); now one pass.
TEST(LoaderHardening, SpecialTokenSearchIsLinear) {
  k3test::TempDir d;
  fs::copy_file(k3test::source_path("tests/data/tiny-tokenizer/tiktoken.model"), d.path / "tiktoken.model");
  std::ifstream in(k3test::source_path("tests/data/tiny-tokenizer/tokenizer_config.json"));
  json cfg = json::parse(in);
  cfg["added_tokens_decoder"]["800"] = {{"content", "<|" + std::string(198, 'x')}};
  std::ofstream(d.path / "tokenizer_config.json") << cfg.dump();
  const auto tok = k3::text::Tokenizer::load(d.str());
  std::string text;
  while (text.size() < (1u << 20)) text += "<|";
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(text, /*allow_special=*/true);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

// A vocabulary without byte 255 loaded, then threw on the first text containing that byte.
TEST(LoaderHardening, VocabularyMissingASingleByteIsRejectedAtLoad) {
  k3test::TempDir d;
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::ofstream f(d.path / "tiktoken.model");
  for (int b = 0; b < 255; ++b)  // base64 of one byte: two characters and "=="
    f << b64[b >> 2] << b64[(b & 3) << 4] << "== " << b << "\n";
  f.close();
  const std::string err = error_of([&] { k3::text::Tokenizer::load_files((d.path / "tiktoken.model").string(), ""); });
  EXPECT_NE(err.find("no token for byte 255"), std::string::npos) << err;
}

// "[[[[...]]]]" a million levels deep: nlohmann parses it, but destroying or dumping the value
// recurses per level and overflowed the stack (segfault) in the config, header and tokenizer loaders.
TEST(LoaderHardening, DeeplyNestedJsonIsAnErrorNotAStackOverflow) {
  const std::string deep = std::string(1000000, '[') + std::string(1000000, ']');
  json j = tiny_k3_config();
  std::string text = j.dump();
  text.replace(text.find("\"num_hidden_layers\":8"), 21, "\"num_hidden_layers\":" + deep);
  EXPECT_NE(error_of([&] { k3::parse_model_config(text, "config.json"); }).find("nested"), std::string::npos);

  k3test::TempDir d;
  const std::string header = R"({"w":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,0]}})";
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xFF);
  std::ofstream(d.path / "x.safetensors", std::ios::binary) << bytes << header;
  EXPECT_NE(error_of([&] { k3::SafetensorsFile f((d.path / "x.safetensors").string()); }).find("nested"),
            std::string::npos);

  fs::copy_file(k3test::source_path("tests/data/tiny-tokenizer/tiktoken.model"), d.path / "tiktoken.model");
  std::ofstream(d.path / "tokenizer_config.json") << R"({"added_tokens_decoder": )" << deep << "}";
  EXPECT_NE(error_of([&] { k3::text::Tokenizer::load(d.str()); }).find("nested"), std::string::npos);
}

// 1e39 is a finite double but infinity as a float: an infinite eps or scale loaded and produced NaN
// logits. (1e400 is already a JSON parse error in nlohmann.)
TEST(LoaderHardening, NonFiniteFloatsAreRejected) {
  for (const std::string key : {"rms_norm_eps", "routed_scaling_factor", "activation_situ_beta"}) {
    json j = tiny_k3_config();
    std::string text = j.dump();
    const std::string field = "\"" + key + "\":";
    const size_t at = text.find(field) + field.size();
    text.replace(at, text.find_first_of(",}", at) - at, "1e39");
    EXPECT_NE(error_of([&] { k3::parse_model_config(text, "config.json"); }).find(key), std::string::npos) << key;
  }
}

// E8M0 0xFF is NaN (OCP MX v1.0): one such scale in one expert loaded, and every logit came out NaN.
// Now the loader names the tensor, row and block; the CLI says `k3: error:` and exits 1.
TEST(LoaderHardening, Mxfp4ScaleNaNIsRejectedAtLoadNamingTheTensor) {
  k3test::EditableCheckpoint ck("k3-tiny");
  const std::string target = "layers.5.block_sparse_moe.experts.17.w2.weight_scale";
  int edited = 0;
  ck.edit_tensors_ending(target, [&](const std::string&, const json&, uint8_t* p, size_t size) {
    ASSERT_GT(size, 7u);
    p[size - 3] = 0xFF;  // [128, 3] scales: row 127, block 0
    ++edited;
  });
  ASSERT_EQ(edited, 1);
  const std::string err = error_of([&] {
    const k3::ModelConfig cfg = k3::load_model_config(ck.str());
    const k3::Checkpoint c(ck.str());
    (void)k3::bind_weights(cfg, c);
  });
  EXPECT_NE(err.find(target), std::string::npos) << err;
  EXPECT_NE(err.find("E8M0 scale 255 (NaN in OCP MX) at row 127, block 0"), std::string::npos) << err;

  FILE* p = ::popen((std::string(K3_BINARY) + " logits -m " + ck.str() + " --tokens 1,2 --out " + ck.str() + "/x.npy 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int st = ::pclose(p);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << out;
  EXPECT_EQ(out.rfind("k3: error:", 0), 0u) << out;
  EXPECT_NE(out.find(target), std::string::npos) << out;
}
