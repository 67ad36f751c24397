// tiktoken.model parsing errors and the two merge implementations.
#include <gtest/gtest.h>

#include <random>

#include "k3/text/tiktoken_bpe.h"
#include "tokenizer_test_util.h"

using namespace k3::text;

namespace {
// Expects parse() to throw k3::Error whose message contains all of `parts`.
void expect_parse_error(const std::string& contents, std::initializer_list<const char*> parts) {
  try {
    TiktokenBpe::parse(contents, "vocab.model");
    ADD_FAILURE() << "no error for: " << contents;
  } catch (const k3::Error& e) {
    for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(TokenizerBpe, MalformedModelFiles) {
  expect_parse_error("YQ== 0\nYg 1\n", {"vocab.model:2", "base64"});       // bad length
  expect_parse_error("YQ== 0\nY!== 1\n", {"vocab.model:2", "base64"});     // bad character
  expect_parse_error("YQ== 0\nYg==\n", {"vocab.model:2", "missing rank"});
  expect_parse_error("YQ== 0\nYg== x1\n", {"vocab.model:2", "invalid rank"});
  expect_parse_error("YQ== 0\nYg== -1\n", {"vocab.model:2", "invalid rank"});
  expect_parse_error("YQ== 0\nYg== 0\n", {"vocab.model:2", "duplicate rank 0"});
  expect_parse_error("YQ== 0\nYQ== 1\n", {"vocab.model:2", "duplicate token"});
  expect_parse_error("", {"no tokens"});
  EXPECT_THROW(TiktokenBpe::load("/nonexistent/tiktoken.model"), k3::Error);
}

TEST(TokenizerBpe, ParsesAndMerges) {
  // a=0 b=1 c=2 ab=3 bc=4 abc=5: "abc" is a token itself; "abcabc" merges ab (3) first.
  const auto bpe = TiktokenBpe::parse("YQ== 0\nYg== 1\r\nYw== 2\nYWI= 3\nYmM= 4\nYWJj 5\n\n", "t");
  EXPECT_EQ(bpe.size(), 6);
  EXPECT_EQ(bpe.rank("abc"), 5);
  EXPECT_EQ(*bpe.bytes(4), "bc");
  EXPECT_EQ(bpe.bytes(6), nullptr);
  for (auto algo : {MergeAlgo::kLinear, MergeAlgo::kHeap}) {
    std::vector<int32_t> out;
    bpe.encode_piece("abcabc", out, algo);
    EXPECT_EQ(out, (std::vector<int32_t>{5, 5}));
    out.clear();
    bpe.encode_piece("bcab", out, algo);  // bc=4 vs ca(none) vs ab=3: ab first, then bc
    EXPECT_EQ(out, (std::vector<int32_t>{4, 3}));
  }
  std::vector<int32_t> out;
  EXPECT_THROW(bpe.encode_piece("xy", out), k3::Error);  // bytes without tokens
}

// The heap merge (long pieces) must reproduce the linear merge (tiktoken's) exactly.
TEST(TokenizerBpe, HeapEqualsLinear) {
  K3_SKIP_WITHOUT_SHARED();
  const TiktokenBpe& bpe = k3test::kimi().bpe();
  std::mt19937 rng(7);
  const std::string alphabet[] = {" ", "  ", "e", "th", "in", "=", "-", "\n", "0", "ab", "\xE4\xBD\xA0", "\xF0\x9F"};
  for (int t = 0; t < 300; ++t) {
    std::string piece;
    const int n = 1 + rng() % 200;
    for (int i = 0; i < n; ++i) piece += alphabet[rng() % std::size(alphabet)];
    std::vector<int32_t> a, b;
    bpe.encode_piece(piece, a, MergeAlgo::kLinear);
    bpe.encode_piece(piece, b, MergeAlgo::kHeap);
    ASSERT_EQ(a, b) << piece;
  }
}
