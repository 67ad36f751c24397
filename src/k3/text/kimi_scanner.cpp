#include "k3/text/kimi_scanner.h"

#include <cstdint>
#include <vector>

#include "k3/text/kimi_classes.h"
#include "k3/text/utf8.h"

namespace k3::text {
namespace {

// Class bits per code point.
enum : uint8_t { kHan = 1, kUpper = 2, kLower = 4, kLetter = 8, kNumber = 16, kSpace = 32 };

const std::vector<uint8_t>& class_table() {
  // 1.1 MB, built once from the ranges: one load per character in the scan loops.
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> t(0x110000, 0);
    auto fill = [&t](const auto& ranges, uint8_t bit) {
      for (const auto& r : ranges)
        for (uint32_t c = r.lo; c <= r.hi; ++c) t[c] |= bit;
    };
    fill(kimi_classes::kHan, kHan);
    fill(kimi_classes::kUpperNotHan, kUpper);
    fill(kimi_classes::kLowerNotHan, kLower);
    fill(kimi_classes::kLetter, kLetter);
    fill(kimi_classes::kNumber, kNumber);
    fill(kimi_classes::kSpace, kSpace);
    return t;
  }();
  return table;
}

constexpr size_t kNone = static_cast<size_t>(-1);

// A run of well-formed UTF-8 (no invalid bytes): the regex sees its end as the end of the subject.
class Segment {
 public:
  Segment(std::string_view s, const std::vector<uint8_t>& table) : s_(s), table_(table) {}
  size_t size() const { return s_.size(); }
  uint32_t cp(size_t i) const {
    const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s_[i + k])); };
    const uint32_t b0 = b(0);
    if (b0 < 0x80) return b0;
    if (b0 < 0xE0) return ((b0 & 0x1F) << 6) | (b(1) & 0x3F);
    if (b0 < 0xF0) return ((b0 & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    return ((b0 & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
  size_t next(size_t i) const {
    const auto b0 = static_cast<uint8_t>(s_[i]);
    return i + (b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4);
  }
  // Class bits of the character at i; 0 at the end (no class matches there).
  uint8_t cls(size_t i) const { return i < s_.size() ? table_[cp(i)] : 0; }
  bool is(size_t i, uint32_t c) const { return i < s_.size() && cp(i) == c; }
  bool is_crlf(size_t i) const { return is(i, '\r') || is(i, '\n'); }
  // [^\r\n\p{L}\p{N}]: the optional prefix of the letter alternatives.
  bool is_prefix(size_t i) const {
    return i < s_.size() && !is_crlf(i) && !(cls(i) & (kLetter | kNumber));
  }
  // [^\s\p{L}\p{N}]: punctuation and symbols.
  bool is_other(size_t i) const { return i < s_.size() && !(cls(i) & (kSpace | kLetter | kNumber)); }
  size_t skip(size_t i, uint8_t bits) const {
    while (i < s_.size() && (cls(i) & bits)) i = next(i);
    return i;
  }

 private:
  std::string_view s_;
  const std::vector<uint8_t>& table_;
};

// (?i:'s|'t|'re|'ve|'m|'ll|'d)? at i: the end of the contraction, or i when there is none.
// Case-insensitive in Unicode's sense: 's' also matches U+017F LATIN SMALL LETTER LONG S.
size_t contraction(const Segment& g, size_t i) {
  if (!g.is(i, '\'')) return i;
  const size_t a = i + 1;
  if (a >= g.size()) return i;
  const uint32_t c = g.cp(a);
  const size_t b = g.next(a);
  auto lower = [](uint32_t x) { return x >= 'A' && x <= 'Z' ? x + 32 : x; };
  if (c == 0x17F) return b;
  const uint32_t lc = lower(c);
  if (lc == 's' || lc == 't' || lc == 'm' || lc == 'd') return b;
  if (b >= g.size()) return i;
  const uint32_t lc2 = lower(g.cp(b));
  if ((lc == 'r' && lc2 == 'e') || (lc == 'v' && lc2 == 'e') || (lc == 'l' && lc2 == 'l')) return g.next(b);
  return i;
}

// Greedy letters from q: `upper* lower+` (upper_first=false) or `upper+ lower*` (true), with the
// backtracking of the regex: upper* gives back characters until lower+ can start, so lower+ starts
// at the last position of the upper run (or just after it) that holds a lower-class character.
size_t letters(const Segment& g, size_t q, bool upper_first) {
  size_t i = q, last_lower = kNone;
  while (g.cls(i) & kUpper) {
    if (g.cls(i) & kLower) last_lower = i;
    i = g.next(i);
  }
  if (upper_first) return i == q ? kNone : g.skip(i, kLower);
  const size_t lower_start = (g.cls(i) & kLower) ? i : last_lower;
  return lower_start == kNone ? kNone : g.skip(lower_start, kLower);
}

// End of the first alternative of the pattern that matches at p, or kNone.
size_t match_at(const Segment& g, size_t p) {
  const uint8_t c0 = g.cls(p);
  if (c0 & kHan) return g.skip(p, kHan);  // [Han]+
  // [^\r\n\p{L}\p{N}]? upper* lower+ contraction? | ... upper+ lower* contraction?
  for (const bool upper_first : {false, true}) {
    if (g.is_prefix(p))
      if (const size_t e = letters(g, g.next(p), upper_first); e != kNone) return contraction(g, e);
    if (const size_t e = letters(g, p, upper_first); e != kNone) return contraction(g, e);
  }
  if (c0 & kNumber) {  // \p{N}{1,3}
    size_t e = g.next(p);
    for (int k = 1; k < 3 && (g.cls(e) & kNumber); ++k) e = g.next(e);
    return e;
  }
  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
  size_t o = kNone;
  if (g.is(p, ' ') && g.is_other(g.next(p)))
    o = g.next(p);
  else if (g.is_other(p))
    o = p;
  if (o != kNone) {
    while (g.is_other(o)) o = g.next(o);
    while (g.is_crlf(o)) o = g.next(o);
    return o;
  }
  if (!(c0 & kSpace)) return kNone;
  // \s*[\r\n]+ | \s+(?!\S) | \s+ over the same run of white space.
  size_t i = p, last = p, last_crlf = kNone;
  while (g.cls(i) & kSpace) {
    if (g.is_crlf(i)) last_crlf = i;
    last = i;
    i = g.next(i);
  }
  if (last_crlf != kNone) return g.next(last_crlf);  // \s*[\r\n]+
  if (i == g.size()) return i;                        // \s+(?!\S) at the end
  if (last != p) return last;                         // \s+(?!\S): gives back the last one
  return i;                                           // \s+
}

}  // namespace

void kimi_scan(std::string_view text, const std::function<void(std::string_view)>& fn) {
  const auto& table = class_table();
  size_t pos = 0;  // end of the last emitted piece
  size_t p = 0;
  while (p < text.size()) {
    // The well-formed run starting at p (if any); matches never leave it.
    size_t seg_end = p;
    while (seg_end < text.size()) {
      const size_t n = utf8_seq_len(text.substr(seg_end, 4));
      if (n == 0) break;
      seg_end += n;
    }
    if (seg_end == p) {  // ill-formed byte: part of the gap before the next match
      ++p;
      continue;
    }
    const Segment g(text.substr(p, seg_end - p), table);
    size_t i = 0;
    while (i < g.size()) {
      const size_t e = match_at(g, i);
      if (e == kNone) {  // no alternative matches here: the character joins the gap
        i = g.next(i);
        continue;
      }
      if (p + i > pos) fn(text.substr(pos, p + i - pos));
      fn(text.substr(p + i, e - i));
      pos = p + e;
      i = e;
    }
    p = seg_end;
  }
  if (pos < text.size()) fn(text.substr(pos));
}

}  // namespace k3::text
