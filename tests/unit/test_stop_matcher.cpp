#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/engine/stop_matcher.h"

using k3::engine::StopMatcher;

namespace {

struct Run {
  std::string text;           // concatenation of all emits (+ flush if not stopped)
  std::vector<std::string> emits;
  bool stopped = false;
};

Run feed(StopMatcher& m, const std::vector<std::string>& chunks, bool do_flush = true) {
  Run r;
  for (const auto& c : chunks) {
    auto res = m.push(c);
    r.emits.push_back(res.emit);
    r.text += res.emit;
    if (res.stopped) {
      r.stopped = true;
      break;
    }
  }
  if (do_flush) r.text += m.flush();
  return r;
}

// True when s is empty or starts at and ends on UTF-8 character boundaries (complete sequences).
bool whole_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = s[i];
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

TEST(StopMatcher, StopSplitAcrossChunks) {
  StopMatcher m({"</s>"});
  auto r1 = m.push("Hello <");
  EXPECT_EQ(r1.emit, "Hello ");
  EXPECT_FALSE(r1.stopped);
  EXPECT_EQ(m.held(), 1u);
  auto r2 = m.push("/");
  EXPECT_EQ(r2.emit, "");
  EXPECT_FALSE(r2.stopped);
  auto r3 = m.push("s> world");
  EXPECT_EQ(r3.emit, "");
  EXPECT_TRUE(r3.stopped);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.flush(), "");
  auto r4 = m.push("more");
  EXPECT_TRUE(r4.stopped);
  EXPECT_EQ(r4.emit, "");
}

TEST(StopMatcher, MatchInsideOneChunkEmitsPrefix) {
  StopMatcher m({"STOP"});
  auto r = m.push("abc STOP def");
  EXPECT_EQ(r.emit, "abc ");
  EXPECT_TRUE(r.stopped);
}

TEST(StopMatcher, EarliestOfMultipleStopsWins) {
  {
    StopMatcher m({"world", "lo w"});
    auto r = m.push("hello world");
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(r.emit, "hel");
  }
  {
    StopMatcher m({"xyz", "b"});
    auto run = feed(m, {"a", "x", "y", "b", "xyz"});
    EXPECT_TRUE(run.stopped);
    EXPECT_EQ(run.text, "axy");
  }
  {
    // Two stops completing in the same chunk: the one starting earlier wins.
    StopMatcher m({"cd", "abcdef"});
    auto run = feed(m, {"xxab", "cdef"});
    EXPECT_TRUE(run.stopped);
    EXPECT_EQ(run.text, "xx");
  }
}

TEST(StopMatcher, FailedPartialMatchReleasesHeldText) {
  StopMatcher m({"STOP"});
  auto r1 = m.push("go ST");
  EXPECT_EQ(r1.emit, "go ");
  EXPECT_EQ(m.held(), 2u);
  auto r2 = m.push("AR");
  EXPECT_EQ(r2.emit, "STAR");
  EXPECT_FALSE(r2.stopped);
  EXPECT_EQ(m.held(), 0u);
  // Overlapping restart: "aab" inside "aaab" after holding "aa".
  StopMatcher o({"aab"});
  EXPECT_EQ(o.push("xaa").emit, "x");
  auto r3 = o.push("aab!");
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.emit, "aa");
}

TEST(StopMatcher, FlushReturnsHeldTextWhenNoStop) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("the E").emit, "the ");
  EXPECT_EQ(m.push("N").emit, "");
  EXPECT_EQ(m.flush(), "EN");
  EXPECT_EQ(m.flush(), "");
  StopMatcher none({});
  EXPECT_EQ(none.push("anything <").emit, "anything <");
  EXPECT_EQ(none.flush(), "");
}

TEST(StopMatcher, Utf8MultibyteText) {
  // Stop string with a multibyte first char: "é!" held as a candidate, then released whole.
  StopMatcher m({"\xC3\xA9!"});
  auto r1 = m.push("caf\xC3\xA9");
  EXPECT_EQ(r1.emit, "caf");
  auto r2 = m.push("?");
  EXPECT_EQ(r2.emit, "\xC3\xA9?");
  auto r3 = m.push(" \xE2\x82\xAC\xC3\xA9!x");  // " €é!x"
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.emit, " \xE2\x82\xAC");
}

TEST(StopMatcher, HoldBackNeverSplitsACharacter) {
  // A byte-level stop whose prefix would cut "é" (C3 A9) in half: the cut moves before C3.
  StopMatcher m({"\xA9x"});
  auto r1 = m.push("caf\xC3\xA9");
  EXPECT_EQ(r1.emit, "caf");
  EXPECT_EQ(m.held(), 2u);
  EXPECT_EQ(m.push("y").emit, "\xC3\xA9y");
  // A chunk ending in an incomplete sequence is held until the sequence completes.
  StopMatcher n({"zz"});
  EXPECT_EQ(n.push("ab\xE2\x82").emit, "ab");
  EXPECT_EQ(n.push("\xAC!").emit, "\xE2\x82\xAC!");
}

TEST(StopMatcher, RandomisedAgainstReference) {
  // Alphabet with ASCII and 2/3/4-byte characters; chunks split on character boundaries.
  const std::vector<std::string> alpha = {"a", "b", "<", "/", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
  std::mt19937 rng(2024);
  auto rand_str = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += alpha[rng() % alpha.size()];
    return s;
  };
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<std::string> stops;
    const int ns = 1 + rng() % 3;
    for (int i = 0; i < ns; ++i) stops.push_back(rand_str(1 + rng() % 3));
    std::vector<std::string> chunks;
    const int nc = 1 + rng() % 12;
    for (int i = 0; i < nc; ++i) chunks.push_back(rand_str(rng() % 4));
    // Reference (streaming semantics, as generation stops at the first chunk that completes a
    // stop string): after each chunk, search the whole text so far; earliest start wins.
    std::string full;
    size_t first = std::string::npos;
    for (const auto& c : chunks) {
      full += c;
      for (const auto& s : stops) first = std::min(first, full.find(s));
      if (first != std::string::npos) break;
    }
    StopMatcher m(stops);
    auto run = feed(m, chunks);
    testing::Message msg;
    msg << "iter " << iter << " stops:";
    for (const auto& s : stops) msg << " [" << s << "]";
    msg << " chunks:";
    for (const auto& c : chunks) msg << " [" << c << "]";
    SCOPED_TRACE(msg);
    EXPECT_EQ(run.stopped, first != std::string::npos);
    EXPECT_EQ(run.text, first == std::string::npos ? full : full.substr(0, first));
    for (const auto& e : run.emits) EXPECT_TRUE(whole_utf8(e));
  }
}

TEST(StopMatcher, EmptyStopStringRejected) {
  EXPECT_THROW(StopMatcher({"a", ""}), k3::Error);
}
