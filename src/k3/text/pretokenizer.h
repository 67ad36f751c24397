// Pre-tokenisation: splits text into the pieces that BPE then encodes independently: the hand-written
// Kimi scanner (kimi_scanner.h) or a PCRE2 (UTF + UCP, JIT) translation of tiktoken's fancy-regex patterns. See docs/tokenizer.md.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "k3/text/unicode_post14.h"

namespace k3::text {

// The building blocks of the translated patterns, exposed so tests can check each one against
// tiktoken code point by code point.
namespace regex_atoms {
// Unicode White_Space, which is what Rust's \s means. PCRE2's \s with UCP differs (it follows
// \p{Z}+\h+\v and includes U+180E), so \s is spelled out instead.
inline constexpr std::string_view kWs =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";
// PCRE2 10.42 has no class intersection (&&). The general categories partition the code space,
// so "Lu|Lt|Lm|Lo|M and not Han" equals "not (C|N|P|S|Z|Ll|Han)", a single negated class.
// Single classes (no (?!..) groups) keep the JIT matcher fast and free of per-character
// backtracking frames. \p{sc:Han} is Script=Han (PCRE2's bare \p{Han} would be
// Script_Extensions; Rust's \p{Han} is Script).
// PCRE2 10.42 has Unicode 14 tables; tiktoken's regex crate is newer. The code points assigned since
// (unicode_post14.h, generated from tiktoken's classes) are added explicitly: inside the class where the
// atom is a positive class, as a second alternative where it is negated (they sit in PCRE2's Cn, which the
// negated class must exclude).
inline constexpr std::string_view kUpperNotHan =
    "(?:[^\\p{C}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{Ll}\\p{sc:Han}]|[" K3_RE_UPPER_POST14 "])";
inline constexpr std::string_view kLowerNotHan =
    "(?:[^\\p{C}\\p{N}\\p{P}\\p{S}\\p{Z}\\p{Lu}\\p{Lt}\\p{sc:Han}]|[" K3_RE_LOWER_POST14 "])";
inline constexpr std::string_view kHan = "[\\p{sc:Han}" K3_RE_HAN_POST14 "]";
// The contents of \p{L} and \p{N} classes (to be wrapped in [...] or [^...]).
inline constexpr std::string_view kLetterBody = "\\p{L}" K3_RE_LETTER_POST14;
inline constexpr std::string_view kNumberBody = "\\p{N}" K3_RE_NUMBER_POST14;
}  // namespace regex_atoms

// Kimi's pat_str (tokenization_kimi.py) translated to PCRE2.
std::string kimi_pattern();
// OpenAI cl100k_base's pat_str translated to PCRE2 (used to cross-check against a second vocab).
std::string cl100k_pattern();

class Pretokenizer {
 public:
  // kAuto runs kimi_pattern() with the hand-written scanner (kimi_scanner.h: linear time, any
  // length) and other patterns with PCRE2; kRegex forces PCRE2 (tests compare the two).
  enum class Engine { kAuto, kRegex };
  explicit Pretokenizer(const std::string& pcre2_pattern = kimi_pattern(), Engine engine = Engine::kAuto);
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;
  ~Pretokenizer();

  // Calls fn for every piece in order. The pieces always tile `text` exactly (nothing is
  // dropped): bytes the regex does not match -- only invalid UTF-8 for the Kimi/cl100k patterns,
  // because PCRE2_MATCH_INVALID_UTF lets no character match an ill-formed sequence -- become
  // pieces of their own. For valid UTF-8 the pieces equal tiktoken's regex matches.
  // PCRE2 (patterns other than Kimi's, or kRegex) has finite backtracking limits: a very long run
  // of one class can fail with k3::Error there; the Kimi scanner has no such limit.
  void split(std::string_view text, const std::function<void(std::string_view)>& fn) const;
  std::vector<std::string_view> split(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  bool use_scanner_ = false;
  std::unique_ptr<Impl> impl_;
};

}  // namespace k3::text
