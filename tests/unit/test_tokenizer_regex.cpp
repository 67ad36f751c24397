// The PCRE2 translation of Kimi's pre-tokeniser, checked atom by atom against tiktoken over the
// whole code space, plus split behaviour on edge cases and invalid UTF-8.
#include <gtest/gtest.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <map>

#include "k3/text/pretokenizer.h"
#include "tokenizer_test_util.h"

using namespace k3::text;

namespace {

struct Sweep {
  std::map<std::string, std::set<uint32_t>> mismatches;  // atom -> code points that differ
  std::set<uint32_t> newer;                               // assigned after Unicode 14
};

bool in_ranges(const nlohmann::json& ranges, uint32_t cp) {
  // ranges are sorted [lo, hi] pairs: binary search.
  size_t lo = 0, hi = ranges.size();
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (ranges[mid][1].get<uint32_t>() < cp)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < ranges.size() && ranges[lo][0].get<uint32_t>() <= cp;
}

// Membership of every scalar value in `atom` according to PCRE2 (same flags as Pretokenizer).
std::vector<uint8_t> pcre2_members(const std::string& atom) {
  int err;
  PCRE2_SIZE off;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(atom.data()), atom.size(),
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
  EXPECT_NE(re, nullptr) << atom;
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
  std::vector<uint8_t> member(0x110000, 0);
  for (uint32_t cp = 0; cp < 0x110000; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string s = k3test::utf8_of(cp);
    member[cp] = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md,
                             nullptr) > 0;
  }
  pcre2_match_data_free(md);
  pcre2_code_free(re);
  return member;
}

const Sweep& sweep() {
  static const Sweep s = [] {
    Sweep r;
    const auto classes = k3test::load_json(k3test::kTokData + "kimi_classes.json");
    const std::string ws = "[" + std::string(regex_atoms::kWs) + "]";
    const std::map<std::string, std::string> atoms = {
        {"han", std::string(regex_atoms::kHan)},
        {"upper_not_han", std::string(regex_atoms::kUpperNotHan)},
        {"lower_not_han", std::string(regex_atoms::kLowerNotHan)},
        {"letter", "[" + std::string(regex_atoms::kLetterBody) + "]"},
        {"number", "[" + std::string(regex_atoms::kNumberBody) + "]"},
        {"space", ws},
    };
    for (const auto& rg : classes["assigned_after_unicode14"])
      for (uint32_t c = rg[0]; c <= rg[1].get<uint32_t>(); ++c) r.newer.insert(c);
    for (const auto& [name, atom] : atoms) {
      const auto member = pcre2_members(atom);
      const auto& ranges = classes[name];
      for (uint32_t cp = 0; cp < 0x110000; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (static_cast<bool>(member[cp]) != in_ranges(ranges, cp)) r.mismatches[name].insert(cp);
      }
    }
    return r;
  }();
  return s;
}

}  // namespace

// Every regex atom agrees with tiktoken on every scalar value, including the code points assigned
// after Unicode 14 that PCRE2 10.42's tables lack (added explicitly: unicode_post14.h).
TEST(TokenizerRegex, AtomsMatchTiktokenOnAllCodePoints) {
  const Sweep& s = sweep();
  for (const auto& [name, cps] : s.mismatches)
    EXPECT_TRUE(cps.empty()) << name << ": " << cps.size() << " code points differ, first U+" << std::hex
                             << (cps.empty() ? 0 : *cps.begin()) << (s.newer.count(*cps.begin()) ? " (post-Unicode-14)" : "");
  std::cout << "[info] " << s.newer.size() << " post-Unicode-14 code points checked among all scalar values\n";
  EXPECT_GT(s.newer.size(), 9000u);  // the sweep really covers them
}

TEST(TokenizerRegex, SplitsLikeTiktoken) {
  const Pretokenizer pre;
  using V = std::vector<std::string_view>;
  EXPECT_EQ(pre.split("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(pre.split("abc你好def"), (V{"abc", "你好", "def"}));
  EXPECT_EQ(pre.split("1234567"), (V{"123", "456", "7"}));
  EXPECT_EQ(pre.split("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pre.split("x \n\ny"), (V{"x", " \n\n", "y"}));
  EXPECT_EQ(pre.split("it'S HE'LL"), (V{"it'S", " HE'LL"}));
  EXPECT_EQ(pre.split("it\xC5\xBFs it'\xC5\xBF"), (V{"it\xC5\xBFs", " it'\xC5\xBF"}));  // 'ſ
  EXPECT_EQ(pre.split("trailing   "), (V{"trailing", "   "}));
  EXPECT_TRUE(pre.split("").empty());
}

// Invalid UTF-8: the regex never matches an ill-formed sequence (PCRE2_MATCH_INVALID_UTF); the
// bytes between matches become pieces of their own, so nothing is lost and nothing throws.
TEST(TokenizerRegex, InvalidUtf8BecomesOwnPieces) {
  const Pretokenizer pre;
  using V = std::vector<std::string_view>;
  EXPECT_EQ(pre.split("ab\xFF" "cd"), (V{"ab", "\xFF", "cd"}));
  EXPECT_EQ(pre.split("\xE4\xBD"), (V{"\xE4\xBD"}));                 // truncated 你
  EXPECT_EQ(pre.split("x\xC0\x80y \xED\xA0\x80"), (V{"x", "\xC0\x80", "y", " ", "\xED\xA0\x80"}));
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::string joined;
  for (auto p : pre.split(all)) joined += p;
  EXPECT_EQ(joined, all);
}

TEST(TokenizerRegex, BadPatternThrows) {
  EXPECT_THROW(Pretokenizer("(unclosed"), k3::Error);
}
