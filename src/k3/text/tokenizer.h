// The Kimi tokenizer: tiktoken BPE ranks + pre-tokeniser regex + special tokens, loaded from an
// HF model directory (tiktoken.model + tokenizer_config.json).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/text/pretokenizer.h"
#include "k3/text/tiktoken_bpe.h"

namespace k3::text {

class Tokenizer {
 public:
  // Kimi reserves this many ids after the BPE ranks for special tokens (163584..163839).
  static constexpr int32_t kNumSpecialSlots = 256;
  // Longest special-token text accepted from tokenizer_config.json (real ones are < 40 bytes).
  static constexpr size_t kMaxSpecialBytes = 1024;

  // Reads model_dir/tiktoken.model and, if present, model_dir/tokenizer_config.json.
  static Tokenizer load(const std::string& model_dir, const std::string& pattern = kimi_pattern());
  // Explicit files; config_path may be empty (then every special slot gets its reserved name).
  static Tokenizer load_files(const std::string& model_path, const std::string& config_path,
                              const std::string& pattern = kimi_pattern());

  // From contents already in memory (a GGUF's vocabulary: cli/gguf_vocab.h): `tiktoken_contents` as in a
  // tiktoken.model, `config` as tokenizer_config.json (added_tokens_decoder, bos_token, eos_token; may be
  // null); `origin` names the source in messages.
  static Tokenizer from_contents(std::string_view tiktoken_contents, const nlohmann::json& config,
                                 const std::string& origin, const std::string& pattern = kimi_pattern());

  // allow_special=false is tiktoken's encode_ordinary (special-token text is plain text).
  // allow_special=true maps special-token strings in the text (leftmost, then longest) to their
  // ids and encodes the text between them ordinarily. Invalid UTF-8 never throws: see
  // Pretokenizer::split (ill-formed bytes become their own pieces and encode as byte tokens,
  // so decode(encode(x)) == x for any bytes x).
  std::vector<int32_t> encode(std::string_view text, bool allow_special = false) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  // Raw bytes of the tokens concatenated (may be invalid UTF-8 for partial sequences).
  std::string decode(std::span<const int32_t> ids) const;
  // Token bytes; for special ids their text. Throws k3::Error for invalid ids.
  const std::string& token_bytes(int32_t id) const;

  int32_t n_vocab() const { return n_ranks_ + kNumSpecialSlots; }
  int32_t n_ranks() const { return n_ranks_; }
  bool is_special(int32_t id) const { return id >= n_ranks_ && id < n_vocab(); }
  std::optional<int32_t> token_id(std::string_view special_text) const;
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }

  const TiktokenBpe& bpe() const { return bpe_; }

 private:
  Tokenizer(TiktokenBpe bpe, Pretokenizer pre) : bpe_(std::move(bpe)), pre_(std::move(pre)) {}
  void init_specials(const std::string& config_path);
  void init_specials_json(const nlohmann::json& cfg, const std::string& config_path);
  void check_ranks(const std::string& origin);
  // Leftmost, longest special token at or after `from`: returns (position, id) or npos.
  std::pair<size_t, int32_t> find_special(std::string_view text, size_t from) const;
  void add_to_trie(const std::string& name, int32_t id);

  TiktokenBpe bpe_;
  Pretokenizer pre_;
  int32_t n_ranks_ = 0;
  std::vector<std::string> special_names_;  // index = id - n_ranks_
  struct SvHash {  // heterogeneous lookup: find(string_view) without allocating
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, SvHash, std::equal_to<>> special_ids_;
  bool special_first_byte_[256] = {};
  struct TrieNode {  // byte trie of the special-token texts, for leftmost-longest matching
    std::vector<std::pair<uint8_t, int32_t>> next;
    int32_t id = -1;
  };
  std::vector<TrieNode> trie_;
  int32_t bos_id_ = -1, eos_id_ = -1;
};

}  // namespace k3::text
