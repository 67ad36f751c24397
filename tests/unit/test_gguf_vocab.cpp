// A Kimi tokenizer through a GGUF's tokenizer.ggml.* arrays (text/gguf_vocab.h): what `k3 convert` writes
// reads back into a tokenizer that encodes, decodes and names special tokens exactly as the tiktoken.model
// it came from (k3-tiny's vocabulary; the real 163,840-entry Kimi one from the shared data); a vocabulary
// that is not Kimi's is a clear error naming the key.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/io/gguf_writer.h"
#include "k3/text/gguf_vocab.h"
#include "k3/text/tokenizer.h"
#include "test_util.h"

namespace {

// The tokenizer metadata alone, written and parsed back.
k3::GgufFile vocab_gguf(const k3::text::Tokenizer& tok, int64_t vocab, const std::string& path,
                        const std::string& pre = "kimi-k2") {
  k3::GgufWriter w;
  if (pre != "kimi-k2") {
    w.set_string("tokenizer.ggml.pre", pre);
    w.set_string("tokenizer.ggml.model", "gpt2");
  } else {
    k3::text::add_tokenizer_to_gguf(w, tok, vocab, true);
  }
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tok.bos_id() >= 0 ? tok.bos_id() : 0));
  w.write(path);
  return k3::GgufFile(path);
}

void expect_same_tokenizer(const k3::text::Tokenizer& a, const k3::text::Tokenizer& b, const std::string& text) {
  ASSERT_EQ(a.n_ranks(), b.n_ranks());
  ASSERT_EQ(a.n_vocab(), b.n_vocab());
  EXPECT_EQ(a.encode(text), b.encode(text));
  EXPECT_EQ(a.encode(text, true), b.encode(text, true));
  for (int32_t id = a.n_ranks(); id < a.n_vocab(); ++id) EXPECT_EQ(a.token_bytes(id), b.token_bytes(id)) << id;
  EXPECT_EQ(a.bos_id(), b.bos_id());
}

std::string sample_text() {
  std::string t = "Il était une fois, in 1815, a ‘quiet’ village — 東京 naïve café 😀\n\n  tabs\tand   spaces ";
  if (k3test::have_shared()) {
    std::ifstream f(k3test::shared_path("data/corpora/emma.txt"));
    std::ostringstream s;
    s << f.rdbuf();
    t += s.str().substr(0, 20000);
  }
  return t;
}

TEST(GgufVocab, K3TinyRoundTrip) {
  k3test::TempDir tmp;
  const auto tok = k3::text::Tokenizer::load(k3test::source_path("models/k3-tiny"));
  const k3::GgufFile f = vocab_gguf(tok, tok.n_vocab(), (tmp.path / "v.gguf").string());
  const auto back = k3::text::tokenizer_from_gguf(f.gguf(), "v.gguf");
  const std::string specials = tok.token_bytes(tok.n_ranks()) + " x " + tok.token_bytes(tok.n_ranks() + 1);
  expect_same_tokenizer(tok, back, sample_text() + specials);
}

TEST(GgufVocab, RealKimiVocabularyRoundTrip) {
  K3_SKIP_WITHOUT_SHARED();
  k3test::TempDir tmp;
  const std::string dir = k3test::shared_path("data/tokenizers/kimi");
  const auto tok = k3::text::Tokenizer::load(dir);
  const k3::GgufFile f = vocab_gguf(tok, tok.n_vocab(), (tmp.path / "v.gguf").string());
  EXPECT_GT(f.gguf().metadata["tokenizer.ggml.merges"].size(), 100000u);
  const auto back = k3::text::tokenizer_from_gguf(f.gguf(), "v.gguf");
  expect_same_tokenizer(tok, back, sample_text());
}

TEST(GgufVocab, NotAKimiVocabularyIsAClearError) {
  k3test::TempDir tmp;
  const auto tok = k3::text::Tokenizer::load(k3test::source_path("models/k3-tiny"));
  const k3::GgufFile f = vocab_gguf(tok, tok.n_vocab(), (tmp.path / "v.gguf").string(), "llama-bpe");
  try {
    k3::text::tokenizer_from_gguf(f.gguf(), "v.gguf");
    FAIL() << "accepted";
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'tokenizer.ggml.pre': missing or not 'kimi-k2'"), std::string::npos) << e.what();
  }
}

}  // namespace
