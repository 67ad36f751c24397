#include "k3/text/tokenizer.h"

#include <charconv>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/io/json_depth.h"
#include "k3/io/regular_file.h"

namespace k3::text {

Tokenizer Tokenizer::load(const std::string& model_dir, const std::string& pattern) {
  const std::filesystem::path dir(model_dir);
  const auto cfg = dir / "tokenizer_config.json";
  std::error_code ec;  // a dangling link or a symlink loop is "present" and then fails to open, clearly
  const bool has_cfg = std::filesystem::exists(std::filesystem::symlink_status(cfg, ec));
  return load_files((dir / "tiktoken.model").string(), has_cfg ? cfg.string() : std::string(), pattern);
}

Tokenizer Tokenizer::load_files(const std::string& model_path, const std::string& config_path,
                                const std::string& pattern) {
  Tokenizer t(TiktokenBpe::load(model_path), Pretokenizer(pattern));
  t.check_ranks(model_path);
  t.init_specials(config_path);
  return t;
}

Tokenizer Tokenizer::from_contents(std::string_view tiktoken_contents, const nlohmann::json& config,
                                   const std::string& origin, const std::string& pattern) {
  Tokenizer t(TiktokenBpe::parse(tiktoken_contents, origin), Pretokenizer(pattern));
  t.check_ranks(origin);
  t.init_specials_json(config, origin);
  return t;
}

void Tokenizer::check_ranks(const std::string& origin) {
  // Like tokenization_kimi.py, special ids start at len(mergeable_ranks).
  n_ranks_ = bpe_.size();
  if (bpe_.max_rank() + 1 != n_ranks_)
    throw Error(origin + ": ranks are not contiguous 0.." + std::to_string(n_ranks_ - 1));
  // Byte-level BPE encodes any text only if every single byte is a token; checked here so that a
  // vocabulary lacking one fails at load instead of on the first request containing that byte.
  for (int b = 0; b < 256; ++b)
    if (!bpe_.rank(std::string(1, static_cast<char>(b))))
      throw Error(origin + ": no token for byte " + std::to_string(b) + " (a byte-level BPE needs all 256)");
}

void Tokenizer::init_specials(const std::string& config_path) {
  nlohmann::json cfg;
  if (!config_path.empty()) {
    const std::string text = read_regular_file(config_path, 16u << 20, "tokenizer config");
    check_json_depth(text, config_path);
    try {
      cfg = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      throw Error(config_path + ": invalid JSON: " + e.what());
    }
    if (!cfg.is_object()) throw Error(config_path + ": must be a JSON object");
  }
  init_specials_json(cfg, config_path);
}

void Tokenizer::init_specials_json(const nlohmann::json& cfg, const std::string& config_path) {
  // tokenization_kimi.py: added_tokens_decoder.get(i, f"<|reserved_token_{i}|>") for every
  // i in [n_ranks, n_ranks + 256) -- note N is the full id, not the offset.
  special_names_.clear();
  for (int32_t i = 0; i < kNumSpecialSlots; ++i)
    special_names_.push_back("<|reserved_token_" + std::to_string(n_ranks_ + i) + "|>");
  {
    if (cfg.contains("added_tokens_decoder")) {
      if (!cfg["added_tokens_decoder"].is_object())
        throw Error(config_path + ": added_tokens_decoder must be an object of id -> token");
      for (const auto& [key, entry] : cfg["added_tokens_decoder"].items()) {
        int64_t id = -1;  // the whole key must be a decimal id ("163584x" is not 163584)
        const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
        if (ec != std::errc() || end != key.data() + key.size()) id = -1;
        if (id < n_ranks_ || id >= n_vocab())
          throw Error(config_path + ": added token id '" + key + "' outside the special range " +
                      std::to_string(n_ranks_) + ".." + std::to_string(n_vocab() - 1));
        if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
          throw Error(config_path + ": added token " + key + " has no string 'content'");
        if (entry["content"].get_ref<const std::string&>().size() > kMaxSpecialBytes)
          throw Error(config_path + ": added token " + key + " is longer than " + std::to_string(kMaxSpecialBytes) +
                      " bytes");
        special_names_[id - n_ranks_] = entry["content"].get<std::string>();
      }
    }
  }

  special_ids_.clear();
  trie_.clear();
  std::fill(std::begin(special_first_byte_), std::end(special_first_byte_), false);
  for (int32_t i = 0; i < kNumSpecialSlots; ++i) {
    const std::string& name = special_names_[i];
    if (name.empty()) throw Error(config_path + ": empty special token for id " + std::to_string(n_ranks_ + i));
    if (!special_ids_.emplace(name, n_ranks_ + i).second)
      throw Error(config_path + ": special token '" + name + "' appears twice");
    special_first_byte_[static_cast<uint8_t>(name[0])] = true;
    add_to_trie(name, n_ranks_ + i);
  }

  // bos_token / eos_token: a string or {"content": ...}; absent -> -1.
  auto resolve = [&](const char* field) -> int32_t {
    if (!cfg.is_object() || !cfg.contains(field) || cfg[field].is_null()) return -1;
    const auto& v = cfg[field];
    std::string name;
    if (v.is_string())
      name = v.get<std::string>();
    else if (v.is_object() && v.contains("content") && v["content"].is_string())
      name = v["content"].get<std::string>();
    else
      throw Error(config_path + ": '" + field + "' is neither a string nor {\"content\": ...}");
    const auto it = special_ids_.find(name);
    if (it == special_ids_.end())
      throw Error(config_path + ": " + field + " '" + name + "' is not a special token");
    return it->second;
  };
  bos_id_ = resolve("bos_token");
  eos_id_ = resolve("eos_token");
}

std::optional<int32_t> Tokenizer::token_id(std::string_view special_text) const {
  const auto it = special_ids_.find(special_text);
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (is_special(id)) return special_names_[id - n_ranks_];
  if (const std::string* b = bpe_.bytes(id)) return *b;
  throw Error("token id " + std::to_string(id) + " out of range [0, " + std::to_string(n_vocab()) +
              ")");
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  pre_.split(text, [&](std::string_view piece) { bpe_.encode_piece(piece, out); });
}

void Tokenizer::add_to_trie(const std::string& name, int32_t id) {
  if (trie_.empty()) trie_.emplace_back();
  size_t node = 0;
  for (const char ch : name) {
    const auto b = static_cast<uint8_t>(ch);
    int32_t next = -1;
    for (const auto& [c, child] : trie_[node].next)
      if (c == b) next = child;
    if (next < 0) {
      next = static_cast<int32_t>(trie_.size());
      trie_[node].next.emplace_back(b, next);
      trie_.emplace_back();
    }
    node = static_cast<size_t>(next);
  }
  trie_[node].id = id;
}

// Walks the trie of special tokens from each candidate position: the cost per position is the
// length of the longest special-token prefix found there, not max_special_len x hash lookups
// (which made 8 MB of '<' take minutes).
std::pair<size_t, int32_t> Tokenizer::find_special(std::string_view text, size_t from) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!special_first_byte_[static_cast<uint8_t>(text[i])]) continue;
    int32_t best = -1;  // longest match wins
    size_t node = 0;
    for (size_t k = i; k < text.size(); ++k) {
      int32_t next = -1;
      for (const auto& [c, child] : trie_[node].next)
        if (c == static_cast<uint8_t>(text[k])) next = child;
      if (next < 0) break;
      node = static_cast<size_t>(next);
      if (trie_[node].id >= 0) best = trie_[node].id;
    }
    if (best >= 0) return {i, best};
  }
  return {std::string_view::npos, -1};
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (!allow_special) {
    encode_ordinary(text, out);
    return out;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [at, id] = find_special(text, pos);
    if (at == std::string_view::npos) break;
    encode_ordinary(text.substr(pos, at - pos), out);
    out.push_back(id);
    pos = at + special_names_[id - n_ranks_].size();
  }
  encode_ordinary(text.substr(pos), out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string s;
  for (const int32_t id : ids) s += token_bytes(id);
  return s;
}

}  // namespace k3::text
