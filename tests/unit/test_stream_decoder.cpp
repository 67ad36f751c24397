// Incremental detokenisation: only complete UTF-8 is emitted; invalid bytes become U+FFFD.
#include <gtest/gtest.h>

#include "k3/text/stream_decoder.h"
#include "k3/text/utf8.h"
#include "tokenizer_test_util.h"

using namespace k3::text;

namespace {
// Feeds ids one at a time; every chunk must be valid UTF-8.
std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  StreamDecoder dec(tok);
  std::string all;
  for (int32_t id : ids) {
    const std::string chunk = dec.push(id);
    EXPECT_TRUE(is_valid_utf8(chunk));
    all += chunk;
  }
  const std::string tail = dec.flush();
  EXPECT_TRUE(is_valid_utf8(tail));
  return all + tail;
}
}  // namespace

TEST(StreamDecoder, GoldensRoundTrip) {
  K3_SKIP_WITHOUT_SHARED();
  const Tokenizer& tok = k3test::kimi();
  const auto& g = k3test::kimi_goldens();
  size_t split_chars = 0;  // how often a token ended inside a character (the case under test)
  for (const auto& t : g["texts"]) {
    const std::string text = t.get<std::string>();
    const auto ids = tok.encode(text);
    for (int32_t id : ids) split_chars += !is_valid_utf8(tok.token_bytes(id));
    EXPECT_EQ(stream(tok, ids), text);
  }
  EXPECT_GT(split_chars, 10u);
}

TEST(StreamDecoder, HoldsIncompleteSequences) {
  const Tokenizer& tok = k3test::tiny_markers();
  const auto& bpe = tok.bpe();
  StreamDecoder dec(tok);
  // 你 = E4 BD A0, fed byte by byte.
  EXPECT_EQ(dec.push(*bpe.rank("\xE4")), "");
  EXPECT_EQ(dec.push(*bpe.rank("\xBD")), "");
  EXPECT_EQ(dec.push(*bpe.rank("\xA0")), "\xE4\xBD\xA0");
  EXPECT_EQ(dec.flush(), "");
}

TEST(StreamDecoder, InvalidBytesBecomeReplacement) {
  const Tokenizer& tok = k3test::tiny_markers();
  const auto& bpe = tok.bpe();
  const std::string fffd = "\xEF\xBF\xBD";
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(*bpe.rank("\xFF")), fffd);  // can never be valid: emitted at once
  EXPECT_EQ(dec.push(*bpe.rank("\xE4")), "");
  EXPECT_EQ(dec.push(*bpe.rank("A")), fffd + "A");  // E4 then ASCII: one U+FFFD
  EXPECT_EQ(dec.push(*bpe.rank("\xF0")), "");
  EXPECT_EQ(dec.push(*bpe.rank("\x9F")), "");
  EXPECT_EQ(dec.flush(), fffd);  // truncated F0 9F at the end: one U+FFFD
  EXPECT_EQ(dec.push(*bpe.rank("\xED")), "");
  EXPECT_EQ(dec.push(*bpe.rank("\xA0")), fffd + fffd);  // surrogate lead: ED, A0 each replaced
  EXPECT_EQ(dec.push(*tok.token_id("[BOS]")), "[BOS]");
  EXPECT_EQ(dec.flush(), "");
  EXPECT_THROW(dec.push(-5), k3::Error);
}

// Byte-level behaviour needs only byte tokens and a special: the tiny vocabulary (runs everywhere).
// Random byte-token streams: output == lossy decode of the whole byte string, all chunks valid.
TEST(StreamDecoder, RandomBytesEqualLossyDecode) {
  const Tokenizer& tok = k3test::tiny_markers();
  uint32_t s = 12345;
  for (int t = 0; t < 500; ++t) {
    std::vector<int32_t> ids;
    std::string bytes;
    const int n = 1 + t % 17;
    for (int i = 0; i < n; ++i) {
      s = s * 1664525u + 1013904223u;
      const int32_t id = static_cast<int32_t>((s >> 8) % 4 == 0 ? (s >> 12) % tok.n_ranks() : *tok.bpe().rank(std::string(1, static_cast<char>(s >> 16))));
      ids.push_back(id);
      bytes += tok.token_bytes(id);
    }
    EXPECT_EQ(stream(tok, ids), utf8_lossy(bytes));
  }
}
