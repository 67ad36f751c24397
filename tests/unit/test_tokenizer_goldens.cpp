// Encoding goldens produced by tiktoken (python/gen_tokenizer_goldens.py) for the Kimi vocab and
// pattern, and for OpenAI cl100k_base as a second vocab + pattern.
#include <gtest/gtest.h>

#include "k3/text/utf8.h"
#include "tokenizer_test_util.h"

using namespace k3::text;
using Ids = std::vector<int32_t>;

namespace {

void check_goldens(const Tokenizer& tok, const nlohmann::json& g, size_t min_texts) {
  const auto& texts = g["texts"];
  const auto& ids = g["ids"];
  ASSERT_EQ(texts.size(), ids.size());
  ASSERT_GE(texts.size(), min_texts);
  // Every text, including those with code points assigned after Unicode 14 (PCRE2 10.42's tables):
  // the pre-tokeniser adds those explicitly (unicode_post14.h).
  size_t checked = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const Ids expect = ids[i].get<Ids>();
    const Ids got = tok.encode(text);
    EXPECT_EQ(tok.decode(got), text) << "round trip, text #" << i;
    EXPECT_EQ(got, expect) << "text #" << i << ": " << text;
    ++checked;
  }
  std::cout << "[info] " << checked << " goldens matched exactly\n";
}

}  // namespace

TEST(TokenizerGoldens, SpecGoldens) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  EXPECT_EQ(tok.encode("Hello, world!"), (Ids{19180, 11, 2695, 0}));
  EXPECT_EQ(tok.encode("你好世界"), (Ids{33845, 2243}));
  EXPECT_EQ(tok.encode("1234567890"), (Ids{6694, 12972, 16242, 15}));
  EXPECT_EQ(tok.n_ranks(), 163584);
  EXPECT_EQ(tok.n_vocab(), 163840);
}

TEST(TokenizerGoldens, KimiMatchesTiktoken) {
  K3_SKIP_WITHOUT_SHARED();
  check_goldens(k3test::kimi(), k3test::kimi_goldens(), 400);
}

TEST(TokenizerGoldens, KimiAllowSpecialMatchesTiktoken) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  const auto& g = k3test::kimi_goldens();
  ASSERT_EQ(g["special_texts"].size(), g["special_ids"].size());
  ASSERT_GE(g["special_texts"].size(), 20u);
  for (size_t i = 0; i < g["special_texts"].size(); ++i) {
    const std::string text = g["special_texts"][i].get<std::string>();
    const Ids got = tok.encode(text, /*allow_special=*/true);
    EXPECT_EQ(got, g["special_ids"][i].get<Ids>()) << text;
    EXPECT_EQ(tok.decode(got), text);
  }
}

TEST(TokenizerGoldens, Cl100kMatchesTiktoken) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer tok = Tokenizer::load_files(k3test::kCl100kModel, "", cl100k_pattern());
  check_goldens(tok, k3test::load_json(k3test::kTokData + "cl100k_goldens.json"), 200);
}

TEST(TokenizerGoldens, LossyUtf8MatchesPython) {
  const auto& lossy = k3test::kimi_goldens()["lossy"];
  ASSERT_GE(lossy.size(), 100u);
  for (const auto& e : lossy) {
    const std::string hex = e[0].get<std::string>();
    std::string bytes;
    for (size_t i = 0; i < hex.size(); i += 2)
      bytes += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
    EXPECT_EQ(utf8_lossy(bytes), e[1].get<std::string>()) << hex;
    EXPECT_EQ(is_valid_utf8(bytes), utf8_lossy(bytes) == bytes) << hex;
  }
}

// Whole corpora (8 MB of English, incl. the 4 MB KJV) against tiktoken, via count + checksum.
TEST(TokenizerGoldens, CorporaMatchTiktoken) {
  K3_SKIP_WITHOUT_SHARED();
  const auto& corpora = k3test::kimi_goldens()["corpora"];
  ASSERT_GE(corpora.size(), 7u);
  for (const auto& [name, expect] : corpora.items()) {
    std::ifstream f(k3test::shared_path("data/corpora/" + name), std::ios::binary);
    ASSERT_TRUE(f) << name;
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const Ids ids = k3test::kimi().encode(text);
    uint64_t h = 1469598103934665603ull;
    for (int32_t id : ids) h = (h ^ static_cast<uint64_t>(id)) * 1099511628211ull;
    EXPECT_EQ(ids.size(), expect[0].get<size_t>()) << name;
    EXPECT_EQ(std::to_string(h), expect[1].get<std::string>()) << name;
  }
}
