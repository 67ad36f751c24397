// Special tokens, the tokenizer_config.json fixture, reserved names, ids and errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <unistd.h>

#include "tokenizer_test_util.h"

using namespace k3::text;
using Ids = std::vector<int32_t>;

TEST(TokenizerSpecial, K3TableFromConfig) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  const std::pair<const char*, int32_t> table[] = {
      {"[BOS]", 163584}, {"[EOS]", 163585}, {"<|end_of_msg|>", 163586}, {"<|open|>", 163587},
      {"<|close|>", 163588}, {"<|sep|>", 163589}, {"[start_header_id]", 163590},
      {"[end_header_id]", 163591}, {"[EOT]", 163593}, {"[UNK]", 163838}, {"[PAD]", 163839}};
  for (const auto& [name, id] : table) {
    EXPECT_EQ(tok.token_id(name), id) << name;
    EXPECT_EQ(tok.token_bytes(id), name);
    EXPECT_TRUE(tok.is_special(id));
  }
  EXPECT_EQ(tok.bos_id(), 163584);
  EXPECT_EQ(tok.eos_id(), 163586);  // eos_token given as {"content": ...}
  EXPECT_FALSE(tok.is_special(163583));
  EXPECT_FALSE(tok.is_special(163840));
  EXPECT_EQ(tok.token_id("[NOPE]"), std::nullopt);
  EXPECT_EQ(tok.token_id("Hello"), std::nullopt);  // ordinary tokens are not special names
}

// tokenization_kimi.py names unlisted slots f"<|reserved_token_{i}|>" with i the full id.
TEST(TokenizerSpecial, ReservedNames) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  EXPECT_EQ(tok.token_bytes(163592), "<|reserved_token_163592|>");
  EXPECT_EQ(tok.token_id("<|reserved_token_163837|>"), 163837);
  const Tokenizer bare = Tokenizer::load_files(k3test::kKimiModel, "");
  EXPECT_EQ(bare.token_bytes(163584), "<|reserved_token_163584|>");
  EXPECT_EQ(bare.token_bytes(163839), "<|reserved_token_163839|>");
  EXPECT_EQ(bare.bos_id(), -1);
  EXPECT_EQ(bare.eos_id(), -1);
  EXPECT_EQ(bare.token_id("[BOS]"), std::nullopt);
}

TEST(TokenizerSpecial, AllowSpecial) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  const std::string text = "[BOS]hi<|end_of_msg|>";
  const Ids with = tok.encode(text, true);
  ASSERT_EQ(with.size(), 3u);
  EXPECT_EQ(with.front(), 163584);
  EXPECT_EQ(with.back(), 163586);
  EXPECT_EQ(Ids(with.begin() + 1, with.end() - 1), tok.encode("hi"));
  // allow_special=false: the same text is plain BPE, no special ids at all.
  const Ids without = tok.encode(text, false);
  EXPECT_GT(without.size(), 3u);
  for (int32_t id : without) EXPECT_FALSE(tok.is_special(id));
  EXPECT_EQ(tok.decode(without), text);
  EXPECT_EQ(tok.decode(with), text);
  // Partial markers stay text.
  for (int32_t id : tok.encode("<|open [BOS", true)) EXPECT_FALSE(tok.is_special(id));
}

TEST(TokenizerSpecial, LoadFromModelDir) {
  K3_SKIP_WITHOUT_SHARED();
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("k3_tok_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(k3test::kKimiModel, dir / "tiktoken.model", fs::copy_options::overwrite_existing);
  {
    const Tokenizer t = Tokenizer::load(dir.string());  // no config: reserved names only
    EXPECT_EQ(t.token_bytes(163586), "<|reserved_token_163586|>");
    EXPECT_EQ(t.bos_id(), -1);
  }
  fs::copy_file(k3test::kK3Config, dir / "tokenizer_config.json",
                fs::copy_options::overwrite_existing);
  {
    const Tokenizer t = Tokenizer::load(dir.string());
    EXPECT_EQ(t.token_bytes(163586), "<|end_of_msg|>");
    EXPECT_EQ(t.bos_id(), 163584);
    EXPECT_EQ(t.encode("Hello, world!"), (Ids{19180, 11, 2695, 0}));
  }
  fs::remove_all(dir);
  EXPECT_THROW(Tokenizer::load(dir.string()), k3::Error);
}

TEST(TokenizerSpecial, InvalidIdsThrow) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  EXPECT_THROW(tok.token_bytes(-1), k3::Error);
  EXPECT_THROW(tok.token_bytes(163840), k3::Error);
  const Ids bad{1, 2, 999999};
  EXPECT_THROW(tok.decode(bad), k3::Error);
}

// Policy: invalid UTF-8 never throws; ill-formed bytes encode as byte tokens (each maximal
// unmatched run is its own BPE piece), so decode(encode(x)) == x for any byte string.
TEST(TokenizerSpecial, InvalidUtf8Input) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  const std::string cases[] = {"\xFF", "abc\xFE\xFF" "def", "\xE4\xBD", "\xED\xA0\x80 x",
                               "\xC0\xAF\x80\x80", std::string("a\0b", 3), "ok \xF4\x90\x80\x80!"};
  for (const std::string& s : cases) {
    Ids ids;
    ASSERT_NO_THROW(ids = tok.encode(s)) << s;
    EXPECT_EQ(tok.decode(ids), s);
  }
  // The valid parts encode exactly as on their own.
  const Ids a = tok.encode("Hello"), b = tok.encode("Hello\xFF");
  ASSERT_EQ(b.size(), a.size() + 1);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
  EXPECT_EQ(b.back(), *tok.bpe().rank("\xFF"));
  std::string all;
  for (int i = 0; i < 4096; ++i) all += static_cast<char>((i * 7919) & 0xFF);
  EXPECT_EQ(tok.decode(tok.encode(all)), all);
  EXPECT_EQ(tok.decode(tok.encode(all, true)), all);
}

namespace {
std::string write_file(const std::string& name, const std::string& body) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("k3_tok_" + std::to_string(::getpid()) + "_" + name);
  std::ofstream(p, std::ios::binary) << body;
  return p.string();
}

// A 256-token byte vocab: its special slots are ids 256..511.
std::string byte_vocab() {
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string s;
  for (int b = 0; b < 256; ++b)
    s += std::string{b64[b >> 2], b64[(b & 3) << 4], '=', '='} + " " + std::to_string(b) + "\n";
  return s;
}
}  // namespace

TEST(TokenizerSpecial, SmallVocabConfig) {
  const std::string model = write_file("bytes.model", byte_vocab());
  const std::string cfg = write_file(
      "ok.json", R"({"added_tokens_decoder": {"256": {"content": "<s>"}, "300": {"content": "<t>"}},
                     "bos_token": {"content": "<s>"}, "eos_token": null})");
  const Tokenizer t = Tokenizer::load_files(model, cfg);
  EXPECT_EQ(t.n_vocab(), 512);
  EXPECT_EQ(t.bos_id(), 256);
  EXPECT_EQ(t.eos_id(), -1);
  EXPECT_EQ(t.token_bytes(257), "<|reserved_token_257|>");
  EXPECT_EQ(t.encode("a<s>b<t>", true), (Ids{'a', 256, 'b', 300}));
  EXPECT_EQ(t.encode("a<s>b", false), (Ids{'a', '<', 's', '>', 'b'}));
  std::filesystem::remove(model);
  std::filesystem::remove(cfg);
}

// Longest match wins when one special token is a prefix of another.
TEST(TokenizerSpecial, LongestSpecialMatch) {
  const std::string model = write_file("bytes2.model", byte_vocab());
  const std::string cfg = write_file(
      "prefix.json", R"({"added_tokens_decoder": {"256": {"content": "<a>"}, "257": {"content": "<a>>"}}})");
  const Tokenizer t = Tokenizer::load_files(model, cfg);
  EXPECT_EQ(t.encode("<a>><a>", true), (Ids{257, 256}));
  std::filesystem::remove(model);
  std::filesystem::remove(cfg);
}

TEST(TokenizerSpecial, BadConfigThrows) {
  const std::string model = write_file("bytes3.model", byte_vocab());
  for (const char* body : {"{not json", R"({"added_tokens_decoder": {"5": {"content": "x"}}})",
                           R"({"added_tokens_decoder": {"512": {"content": "x"}}})",
                           R"({"added_tokens_decoder": {"256": {"special": true}}})",
                           R"({"bos_token": "[NOT_A_TOKEN]"})", R"({"bos_token": 7})",
                           R"({"added_tokens_decoder": {"256": {"content": "<|a|>"},
                                                        "257": {"content": "<|a|>"}}})"}) {
    const std::string p = write_file("bad.json", body);
    try {
      Tokenizer::load_files(model, p);
      ADD_FAILURE() << "no error for " << body;
    } catch (const k3::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();  // names the file
    }
    std::filesystem::remove(p);
  }
  std::filesystem::remove(model);
}
