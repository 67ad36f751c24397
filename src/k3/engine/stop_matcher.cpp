#include "k3/engine/stop_matcher.h"

#include <algorithm>

#include "k3/core/error.h"

namespace k3::engine {

namespace {

bool is_cont(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the sequence announced by lead byte c (0 for a continuation or invalid byte).
size_t seq_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 0;
}

// Number of trailing bytes of s that form an incomplete (but so far well-formed) UTF-8 sequence.
size_t incomplete_utf8_tail(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if (is_cont(c)) continue;
    const size_t need = seq_len(c);
    return (need > back) ? back : 0;
  }
  return 0;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const auto& s : stops_)
    if (s.empty()) throw k3::Error("StopMatcher: stop strings must be non-empty");
}

StopMatcher::Result StopMatcher::push(std::string_view text) {
  if (stopped_) return {"", true};
  buf_.append(text);

  // Earliest full match of any stop string. buf_ held no full match before this chunk, so a
  // match must end inside the new text; searching all of buf_ is still cheap (held part is short).
  size_t best = std::string::npos;
  for (const auto& s : stops_) best = std::min(best, buf_.find(s));
  if (best != std::string::npos) {
    Result r{buf_.substr(0, best), true};
    buf_.clear();
    stopped_ = true;
    return r;
  }

  // Longest suffix of buf_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(buf_.size(), s.size() - 1); len > hold; --len) {
      if (std::string_view(buf_).substr(buf_.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  hold = std::max(hold, incomplete_utf8_tail(buf_));
  size_t cut = buf_.size() - hold;
  // Never split a UTF-8 sequence: move the cut left onto a lead byte.
  while (cut > 0 && cut < buf_.size() && is_cont(static_cast<unsigned char>(buf_[cut]))) --cut;

  Result r{buf_.substr(0, cut), false};
  buf_.erase(0, cut);
  return r;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(buf_);
  return out;
}

}  // namespace k3::engine
