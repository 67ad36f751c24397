#include "cli/gguf_vocab.h"

#include <string>
#include <vector>

namespace k3cli {

namespace {

// GPT-2's byte -> unicode code point map (printable bytes stand for themselves, the rest shift above 255).
std::string byte_level(const std::string& bytes) {
  static const std::vector<uint32_t> map = [] {
    std::vector<uint32_t> m(256, 0);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      m[b] = printable ? b : next++;
    }
    return m;
  }();
  std::string out;
  for (unsigned char c : bytes) {
    const uint32_t cp = map[c];
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else {  // all code points here are < 0x800: two UTF-8 bytes
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  return out;
}

// The merge that makes token `rank` (bytes t): byte-pair merging of t restricted to ranks below `rank` (what
// tiktoken would do before reaching it); when that stops at exactly two parts they are the merge.
bool merge_of(const k3::text::TiktokenBpe& bpe, const std::string& t, int32_t rank, std::string& a, std::string& b) {
  std::vector<std::string> parts;
  for (char c : t) parts.emplace_back(1, c);
  while (parts.size() > 2) {
    int32_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const auto r = bpe.rank(parts[i] + parts[i + 1]);
      if (r && *r < rank && (best < 0 || *r < best)) best = *r, at = i;
    }
    if (best < 0) return false;
    parts[at] += parts[at + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  if (parts.size() != 2) return false;
  a = parts[0], b = parts[1];
  return true;
}

}  // namespace

void add_tokenizer_to_gguf(k3::GgufWriter& w, const k3::text::Tokenizer& tok, int64_t vocab_size, bool add_bos) {
  constexpr int64_t kNormal = 1, kControl = 3, kUnused = 5;  // llama.cpp's token types
  std::vector<std::string> tokens, merges;
  std::vector<int64_t> types;
  const auto& bpe = tok.bpe();
  for (int64_t id = 0; id < vocab_size; ++id) {
    const auto i = static_cast<int32_t>(id);
    if (id < tok.n_ranks() && bpe.bytes(i)) {
      const std::string& t = *bpe.bytes(i);
      tokens.push_back(byte_level(t));
      types.push_back(kNormal);
      std::string a, b;
      if (t.size() > 1 && merge_of(bpe, t, i, a, b)) merges.push_back(byte_level(a) + " " + byte_level(b));
    } else if (tok.is_special(i)) {
      tokens.push_back(tok.token_bytes(i));
      types.push_back(kControl);
    } else {
      tokens.push_back("[PAD" + std::to_string(id) + "]");
      types.push_back(kUnused);
    }
  }
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", "kimi-k2");
  w.set_array_strings("tokenizer.ggml.tokens", tokens);
  w.set_array_i64("tokenizer.ggml.token_type", k3::GgufType::I32, types);
  w.set_array_strings("tokenizer.ggml.merges", merges);
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
}

}  // namespace k3cli
