#include "k3/text/gguf_vocab.h"

#include <string>
#include <vector>

namespace k3::text {

namespace {

// GPT-2's byte -> unicode code point map (printable bytes stand for themselves, the rest shift above 255).
const std::vector<uint32_t>& byte_to_cp() {
  static const std::vector<uint32_t> map = [] {
    std::vector<uint32_t> m(256, 0);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      m[b] = printable ? b : next++;
    }
    return m;
  }();
  return map;
}

std::string byte_level(const std::string& bytes) {
  const std::vector<uint32_t>& map = byte_to_cp();
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
bool merge_of(const TiktokenBpe& bpe, const std::string& t, int32_t rank, std::string& a, std::string& b) {
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

// byte_level's inverse; false for a string that is not byte-level spelling (code points outside the map).
bool from_byte_level(const std::string& s, std::string& out) {
  static const std::vector<int> inverse = [] {
    std::vector<int> inv(324, -1);
    for (uint32_t b = 0; b < 256; ++b) inv[byte_to_cp()[b]] = static_cast<int>(b);
    return inv;
  }();
  out.clear();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c, i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3Fu), i += 2;
    } else {
      return false;
    }
    if (cp >= inverse.size() || inverse[cp] < 0) return false;
    out += static_cast<char>(inverse[cp]);
  }
  return true;
}

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) | uint8_t(in[i + 2]);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], t[v & 63]};
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += {t[v >> 18], t[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8);
    out += {t[v >> 18], t[(v >> 12) & 63], t[(v >> 6) & 63], '='};
  }
  return out;
}

}  // namespace

Tokenizer tokenizer_from_gguf(const k3::Gguf& g, const std::string& source) {
  const auto& m = g.metadata;
  auto fail = [&](const std::string& key, const std::string& why) -> Tokenizer {
    throw k3::Error("'" + source + "': GGUF metadata key '" + key + "': " + why +
                    " (k3 builds its tokenizer from a Kimi vocabulary only; pass --tokenizer DIR)");
  };
  const auto str = [&](const char* k) { return m.contains(k) && m[k].is_string() ? m[k].get<std::string>() : std::string(); };
  if (str("tokenizer.ggml.model") != "gpt2") return fail("tokenizer.ggml.model", "missing or not 'gpt2'");
  if (str("tokenizer.ggml.pre") != "kimi-k2") return fail("tokenizer.ggml.pre", "missing or not 'kimi-k2'");
  const char* kt = "tokenizer.ggml.tokens";
  const char* ky = "tokenizer.ggml.token_type";
  if (!m.contains(kt) || !m[kt].is_array() || !m.contains(ky) || !m[ky].is_array() || m[kt].size() != m[ky].size())
    return fail(kt, "tokens and token_type must be arrays of one length");
  const auto& toks = m[kt];
  const auto& types = m[ky];
  std::string ranks;
  nlohmann::json added = nlohmann::json::object();
  size_t n_ranks = 0;
  for (size_t id = 0; id < toks.size(); ++id) {
    if (!toks[id].is_string() || !types[id].is_number_integer()) return fail(kt, "entry " + std::to_string(id) + " is malformed");
    const int64_t type = types[id].get<int64_t>();
    const std::string& text = toks[id].get_ref<const std::string&>();
    if (type == 1) {  // NORMAL: a BPE rank, contiguous from 0
      std::string bytes;
      if (n_ranks != id) return fail(kt, "normal token " + std::to_string(id) + " after a special one");
      if (!from_byte_level(text, bytes)) return fail(kt, "token " + std::to_string(id) + " is not byte-level spelling");
      ranks += base64(bytes) + " " + std::to_string(id) + "\n";
      ++n_ranks;
    } else if (type == 3 || type == 4) {  // CONTROL / USER_DEFINED: a special slot
      added[std::to_string(id)] = {{"content", text}};
    }
  }
  nlohmann::json cfg = {{"added_tokens_decoder", added}};
  for (const auto& [key, field] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token"}, std::pair{"tokenizer.ggml.eos_token_id", "eos_token"}})
    if (m.contains(key) && m[key].is_number_integer()) {
      const std::string id = std::to_string(m[key].get<int64_t>());
      if (added.contains(id)) cfg[field] = added[id]["content"];
    }
  return Tokenizer::from_contents(ranks, cfg, source + " (tokenizer.ggml.*)");
}

void add_tokenizer_to_gguf(k3::GgufWriter& w, const Tokenizer& tok, int64_t vocab_size, bool add_bos) {
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

}  // namespace k3::text
