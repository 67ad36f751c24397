#include "k3/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "k3/core/error.h"
#include "k3/text/kimi_scanner.h"

namespace k3::text {

std::string kimi_pattern() {
  using namespace regex_atoms;
  const std::string ws(kWs), up(kUpperNotHan), low(kLowerNotHan), L(kLetterBody), N(kNumberBody);
  const std::string contractions = "(?i:'s|'t|'re|'ve|'m|'ll|'d)?";
  const std::string not_crlf_letter_num = "[^\\r\\n" + L + N + "]";
  return std::string(kHan) + "+" +                                             //
         "|" + not_crlf_letter_num + "?" + up + "*" + low + "+" + contractions +  //
         "|" + not_crlf_letter_num + "?" + up + "+" + low + "*" + contractions +  //
         "|[" + N + "]{1,3}" +                                                    //
         "| ?[^" + ws + L + N + "]+[\\r\\n]*" +                                   //
         "|[" + ws + "]*[\\r\\n]+" +                                              //
         "|[" + ws + "]+(?![^" + ws + "])" +                                      //
         "|[" + ws + "]+";
}

std::string cl100k_pattern() {
  // Rust's $ (no multiline) is end of text: \z in PCRE2 ($ would also match before a final \n).
  const std::string ws(regex_atoms::kWs), L(regex_atoms::kLetterBody), N(regex_atoms::kNumberBody);
  return "'(?i:[sdmt]|ll|ve|re)|[^\\r\\n" + L + N + "]?+[" + L + "]++|[" + N + "]{1,3}+| ?[^" + ws + L + N +
         "]++[\\r\\n]*+|[" + ws + "]++\\z|[" + ws + "]*[\\r\\n]|[" + ws + "]+(?![^" + ws + "])|[" + ws + "]";
}

struct Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Pretokenizer::Pretokenizer(const std::string& pcre2_pattern, Engine engine)
    : pattern_(pcre2_pattern),
      use_scanner_(engine == Engine::kAuto && pcre2_pattern == kimi_pattern()),
      impl_(std::make_unique<Impl>()) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off,
                              nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error("pre-tokenizer regex does not compile at offset " + std::to_string(err_off) +
                ": " + reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation only: without it pcre2_match falls back to the interpreter.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;
Pretokenizer::~Pretokenizer() = default;

void Pretokenizer::split(std::string_view text,
                         const std::function<void(std::string_view)>& fn) const {
  if (use_scanner_) {
    kimi_scan(text, fn);
    return;
  }
  struct MatchData {  // RAII for the per-call match block (a pcre2_code may be shared by threads)
    pcre2_match_data* md;
    ~MatchData() { pcre2_match_data_free(md); }
  } m{pcre2_match_data_create_from_pattern(impl_->code, nullptr)};
  if (!m.md) throw Error("pre-tokenizer: out of memory");

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;     // end of the last emitted piece
  size_t search = 0;  // where the next match attempt starts
  while (search < text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), search, 0, m.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error(std::string("pre-tokenizer match failed: ") +
                  reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    const size_t start = ov[0], end = ov[1];
    if (end == start) {  // empty match (not possible with our patterns): step over one byte
      search = start + 1;
      continue;
    }
    if (start > pos) fn(text.substr(pos, start - pos));  // unmatched gap (invalid UTF-8)
    fn(text.substr(start, end - start));
    pos = search = end;
  }
  if (pos < text.size()) fn(text.substr(pos));
}

std::vector<std::string_view> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string_view> out;
  split(text, [&](std::string_view p) { out.push_back(p); });
  return out;
}

}  // namespace k3::text
