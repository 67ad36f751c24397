#include "k3/text/utf8.h"

#include <cstdint>

namespace k3::text {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Inspects the sequence at s[0]. Returns its well-formed length (>0) via `len`, or, when it is
// ill-formed, the length of its maximal subpart via `bad` (>=1). `truncated` is set when the
// sequence is a valid prefix cut off by the end of s.
struct SeqInfo {
  size_t len = 0;
  size_t bad = 0;
  bool truncated = false;
};

SeqInfo inspect(std::string_view s) {
  SeqInfo r;
  const auto b0 = static_cast<uint8_t>(s[0]);
  if (b0 < 0x80) {
    r.len = 1;
    return r;
  }
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    r.bad = 1;  // continuation byte or never-valid lead (C0, C1, F5..FF)
    return r;
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= s.size()) {
      r.bad = k;
      r.truncated = true;
      return r;
    }
    const auto b = static_cast<uint8_t>(s[k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      r.bad = k;
      return r;
    }
  }
  r.len = need;
  return r;
}

}  // namespace

size_t utf8_seq_len(std::string_view s) { return s.empty() ? 0 : inspect(s).len; }

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<uint8_t>(s[i]) < 0x80) {  // ASCII fast path
      ++i;
      continue;
    }
    const size_t n = inspect(s.substr(i)).len;
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t utf8_lossy_append(std::string_view in, std::string& out, bool final) {
  size_t i = 0, run = 0;  // [run, i) is a pending run of valid bytes, appended in one go
  while (i < in.size()) {
    if (static_cast<uint8_t>(in[i]) < 0x80) {
      ++i;
      continue;
    }
    const SeqInfo info = inspect(in.substr(i));
    if (info.len) {
      i += info.len;
      continue;
    }
    out.append(in.substr(run, i - run));
    if (info.truncated && !final) return i;  // may still complete: keep it
    out.append(kReplacement);
    i += info.bad;
    run = i;
  }
  out.append(in.substr(run, i - run));
  return i;
}

std::string utf8_lossy(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  utf8_lossy_append(in, out, true);
  return out;
}

}  // namespace k3::text
