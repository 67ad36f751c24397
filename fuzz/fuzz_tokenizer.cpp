// Tokenizer::encode on arbitrary bytes (tests/data/tiny-tokenizer vocab, Kimi pattern): never throws
// for any input, decode(encode(x)) == x byte for byte, and the hand-written pre-tokeniser splits
// exactly like the PCRE2 translation of the pattern (on inputs short enough for PCRE2's limits).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "k3/core/error.h"
#include "k3/text/pretokenizer.h"
#include "k3/text/tokenizer.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    std::abort();
  }
}

std::vector<std::string_view> pieces(const k3::text::Pretokenizer& p, std::string_view s) { return p.split(s); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using k3::text::Pretokenizer;
  static const k3::text::Tokenizer tok = k3::text::Tokenizer::load(K3_SOURCE_DIR "/tests/data/tiny-tokenizer");
  static const Pretokenizer scanner(k3::text::kimi_pattern());
  static const Pretokenizer regex(k3::text::kimi_pattern(), Pretokenizer::Engine::kRegex);
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const bool special : {false, true}) {
    const std::vector<int32_t> ids = tok.encode(text, special);
    check(tok.decode(ids) == text, "decode(encode(x)) != x");
  }
  if (size <= 512) check(pieces(scanner, text) == pieces(regex, text), "scanner and PCRE2 split differently");
  return 0;
}
