// The committed k3-tiny tokenizer (models/k3-tiny: 7936 BPE ranks + 256 special slots, trained by
// python/k3tiny/train_bpe.py) loads through the normal model-dir path and encodes exactly as tiktoken
// does (goldens from python/k3tiny/gen_goldens.py). The files are committed: a missing file fails.
#include <gtest/gtest.h>

#include <filesystem>

#include "tokenizer_test_util.h"

using namespace k3::text;
using Ids = std::vector<int32_t>;

namespace {

const std::string kTinyDir = K3_SOURCE_DIR "/models/k3-tiny";

const Tokenizer& tiny() {
  static const Tokenizer t = Tokenizer::load(kTinyDir);
  return t;
}

const nlohmann::json& goldens() {
  static const nlohmann::json j = k3test::load_json(k3test::kTokData + "k3tiny_goldens.json");
  return j;
}

}  // namespace

TEST(K3TinyTokenizer, FilesPresent) {
  EXPECT_TRUE(std::filesystem::exists(kTinyDir + "/tiktoken.model"));
  EXPECT_TRUE(std::filesystem::exists(kTinyDir + "/tokenizer_config.json"));
  EXPECT_TRUE(std::filesystem::exists(kTinyDir + "/chat_template.jinja"));
}

TEST(K3TinyTokenizer, VocabAndSpecialIds) {
  const Tokenizer& tok = tiny();
  EXPECT_EQ(tok.n_ranks(), 7936);
  EXPECT_EQ(tok.n_vocab(), 8192);
  EXPECT_EQ(tok.bos_id(), 7936);
  EXPECT_EQ(tok.eos_id(), 7938);  // eos_token is <|end_of_msg|>
  const std::pair<const char*, int32_t> table[] = {
      {"[BOS]", 7936},          {"[EOS]", 7937},          {"<|end_of_msg|>", 7938},
      {"<|open|>", 7939},       {"<|close|>", 7940},      {"<|sep|>", 7941},
      {"[start_header_id]", 7942}, {"[end_header_id]", 7943}, {"[EOT]", 7945},
      {"<|media_begin|>", 7954}, {"<|media_pad|>", 7957}, {"[UNK]", 8190}, {"[PAD]", 8191}};
  for (const auto& [name, id] : table) {
    EXPECT_EQ(tok.token_id(name), id) << name;
    EXPECT_EQ(tok.token_bytes(id), name);
    EXPECT_TRUE(tok.is_special(id));
  }
  EXPECT_EQ(tok.token_bytes(7944), "<|reserved_token_7944|>");
  EXPECT_FALSE(tok.is_special(7935));
  // Ranks 0..255 are the single bytes.
  for (int32_t b = 0; b < 256; ++b) EXPECT_EQ(tok.token_bytes(b), std::string(1, static_cast<char>(b)));
}

TEST(K3TinyTokenizer, OrdinaryMatchesTiktoken) {
  const Tokenizer& tok = tiny();
  const auto& g = goldens();
  const auto& texts = g["texts"];
  const auto& ids = g["ids"];
  ASSERT_EQ(texts.size(), ids.size());
  ASSERT_GE(texts.size(), 20u);
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const Ids got = tok.encode(text);
    EXPECT_EQ(got, ids[i].get<Ids>()) << "text #" << i << ": " << text;
    EXPECT_EQ(tok.decode(got), text) << "round trip, text #" << i;
  }
}

TEST(K3TinyTokenizer, SpecialMatchesTiktoken) {
  const Tokenizer& tok = tiny();
  const auto& g = goldens();
  const auto& texts = g["special_texts"];
  const auto& ids = g["special_ids"];
  ASSERT_EQ(texts.size(), ids.size());
  ASSERT_GE(texts.size(), 1u);
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const Ids got = tok.encode(text, /*allow_special=*/true);
    EXPECT_EQ(got, ids[i].get<Ids>()) << "special text #" << i << ": " << text;
    EXPECT_EQ(tok.decode(got), text);
  }
  // Plain encoding keeps markers inert: no special id appears.
  for (int32_t id : tok.encode("[BOS]<|open|>message<|sep|><|end_of_msg|>")) EXPECT_FALSE(tok.is_special(id));
}
