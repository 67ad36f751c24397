// The hand-written Kimi pre-tokeniser (kimi_scanner.h) against the PCRE2 translation of the same
// pattern (itself checked against tiktoken class by class in test_tokenizer_regex.cpp), and texts
// of any length: issue 11 item 5 (a run of 1,364 letters overflowed PCRE2's JIT stack; 10 MB of
// spaces hit its match limit).
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <random>

#include "k3/text/pretokenizer.h"
#include "k3/text/utf8.h"
#include "tokenizer_test_util.h"

using namespace k3::text;

namespace {

// Characters of every class the pattern distinguishes, plus bytes that are never valid UTF-8.
const std::vector<std::string>& alphabet() {
  static const std::vector<std::string> a = [] {
    std::vector<std::string> v;
    for (const char* s : {"a", "z", "A", "Z", "s", "S", "t", "r", "e", "v", "m", "l", "d", "'", "0", "9", " ", " ",
                          "\t", "\r", "\n", ".", ",", "!", "-", "_", "\x0b", "\xff", "\x80", "\xe4\xbd"})
      v.emplace_back(s);
    for (uint32_t cp : {0x4F60u, 0x597Du, 0x3005u, 0x2E80u,  // Han (Lo, Lm, So)
                        0x3042u, 0x30A2u, 0x02B0u,           // Lo (kana), Lm: upper and lower classes
                        0x0301u, 0x0903u,                    // M: both letter classes, not \p{L}
                        0x01C5u, 0x00C9u, 0x00E9u, 0x0416u, 0x0436u, 0x017Fu,  // Lt, Lu, Ll, long s
                        0x0660u, 0x2160u, 0x00B2u,           // Nd, Nl, No
                        0x00A0u, 0x0085u, 0x2028u, 0x3000u, 0x180Eu,  // white space (and one that is not)
                        0x1F600u, 0x00A9u, 0x2014u,          // emoji, symbols, punctuation
                        0x1C89u, 0x105C0u, 0x2EBF0u, 0x10D40u})  // assigned after Unicode 14
      v.push_back(k3test::utf8_of(cp));
    return v;
  }();
  return a;
}

std::vector<std::string> pieces(const Pretokenizer& p, std::string_view text) {
  std::vector<std::string> out;
  p.split(text, [&](std::string_view s) { out.emplace_back(s); });
  return out;
}

}  // namespace

TEST(KimiScanner, SameSplitsAsPcre2OnRandomTexts) {
  const Pretokenizer scanner(kimi_pattern());
  const Pretokenizer regex(kimi_pattern(), Pretokenizer::Engine::kRegex);
  std::mt19937 rng(1234);
  const auto& a = alphabet();
  for (int n = 0; n < 20000; ++n) {
    std::string text;
    const int len = static_cast<int>(rng() % 24);
    // Runs of one character (the shapes that backtrack) as well as mixtures.
    for (int k = 0; k < len; ++k) text += a[rng() % a.size()];
    if (rng() % 4 == 0) text += std::string(rng() % 40, text.empty() ? 'x' : text.back());
    ASSERT_EQ(pieces(scanner, text), pieces(regex, text)) << "text: " << text;
  }
}

TEST(KimiScanner, LongRunsSplitLikeShortOnes) {
  const Pretokenizer p(kimi_pattern());
  // The failures of issue 11: 1,364 letters (PCRE2 JIT stack), 10 MB of spaces (match limit).
  EXPECT_EQ(pieces(p, std::string(1364, 'a')), std::vector<std::string>{std::string(1364, 'a')});
  std::string dna;
  for (int i = 0; i < 500; ++i) dna += "ACGT";
  EXPECT_EQ(pieces(p, dna), std::vector<std::string>{dna});
  const std::string spaces(10 << 20, ' ');
  EXPECT_EQ(p.split(spaces).size(), 1u);
  EXPECT_EQ(p.split(spaces + "x"), (std::vector<std::string_view>{std::string_view(spaces).substr(1),
                                                                   std::string_view(" x")}));
  const std::string newlines(1 << 20, '\n');
  EXPECT_EQ(p.split(newlines).size(), 1u);
  std::string han;
  for (int i = 0; i < 100000; ++i) han += "\xe4\xbd\xa0";
  EXPECT_EQ(p.split(han).size(), 1u);
  // Digits stay in groups of three however long the run.
  EXPECT_EQ(p.split(std::string(300000, '7')).size(), 100000u);
}

TEST(KimiScanner, TenMegabytesOfEachShapeInLinearTime) {
  const Pretokenizer p(kimi_pattern());
  const auto t0 = std::chrono::steady_clock::now();
  size_t total = 0;
  for (const std::string unit : {"a", "A", " ", "\n", " \n", "!", "a ", "\xe3\x81\x82", "\xcc\x81", "'s"}) {
    std::string text;
    while (text.size() < (10u << 20)) text += unit;
    p.split(text, [&](std::string_view s) { total += s.size(); });
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(total, 100u << 20);
  EXPECT_LT(s, 30.0) << "100 MB of pathological text should split in a few seconds";
  std::cout << "[info] 100 MB of long runs split in " << s << " s\n";
}

namespace {

// python/gen_tokenizer_edge_goldens.py: a recipe part is [unit, repeat] or [alphabet, length, seed].
std::string text_of_recipe(const nlohmann::json& recipe) {
  std::string text;
  for (const auto& part : recipe) {
    const std::string unit = part[0].get<std::string>();
    if (part.size() == 2) {
      for (int i = 0; i < part[1].get<int>(); ++i) text += unit;
      continue;
    }
    std::vector<std::string> chars;  // the alphabet's code points
    for (size_t i = 0; i < unit.size(); i += k3::text::utf8_seq_len(std::string_view(unit).substr(i)))
      chars.push_back(unit.substr(i, k3::text::utf8_seq_len(std::string_view(unit).substr(i))));
    uint64_t x = part[2].get<uint64_t>();
    for (int i = 0; i < part[1].get<int>(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      text += chars[(x >> 33) % chars.size()];
    }
  }
  return text;
}

}  // namespace

TEST(KimiScanner, LongRunsEncodeLikeTiktoken) {
  K3_SKIP_WITHOUT_SHARED();
  const auto goldens = k3test::load_json(k3test::kTokData + "kimi_edge_goldens.json");
  ASSERT_GE(goldens["cases"].size(), 30u);
  for (const auto& c : goldens["cases"]) {
    const std::string text = text_of_recipe(c["recipe"]);
    const std::vector<int32_t> ids = k3test::kimi().encode(text);
    EXPECT_EQ(k3test::kimi().decode(ids), text);
    if (c["full"].get<bool>()) {
      EXPECT_EQ(ids, c["ids"].get<std::vector<int32_t>>()) << c["recipe"].dump().substr(0, 200);
      continue;
    }
    uint64_t h = 1469598103934665603ull;
    for (int32_t id : ids) h = (h ^ static_cast<uint64_t>(id)) * 1099511628211ull;
    EXPECT_EQ(ids.size(), c["ids"][0].get<size_t>()) << c["recipe"].dump().substr(0, 200);
    EXPECT_EQ(std::to_string(h), c["ids"][1].get<std::string>()) << c["recipe"].dump().substr(0, 200);
  }
}

namespace {
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
}  // namespace

// 10 MB (over the server's 8 MB body limit) of each pathological shape through the whole
// tokenizer: BPE of a 10 MB single piece is O(n log n) (merge_heap), not minutes.
TEST(KimiScanner, TenMegabytePiecesEncodeAndRoundTrip) {
  K3_SKIP_WITHOUT_SHARED();
  // 10 MB for the two shapes that failed (letters, spaces); 1 MB for the others (CI time).
  for (const auto& [unit, mb] : std::vector<std::pair<std::string, size_t>>{
           {"a", 10}, {" ", 10}, {"ACGT", 1}, {"\xe4\xbd\xa0", 1}}) {
    std::string text;
    while (text.size() < (mb << 20)) text += unit;
    // CPU time of this thread (encode is single-threaded), not wall time: on a loaded 2-core CI box the
    // wall time of the 10 MB of spaces went from 5.5 s to 20.6 s, while a quadratic BPE takes minutes
    // of CPU either way. CPU time <= wall time, so the bound is no looser.
    const double t0 = thread_cpu_seconds();
    const std::vector<int32_t> ids = k3test::kimi().encode(text);
    const double s = thread_cpu_seconds() - t0;
    EXPECT_EQ(k3test::kimi().decode(ids), text);
    EXPECT_LT(s, 20.0) << unit;
    std::cout << "[info] " << mb << " MB of '" << unit << "': " << ids.size() << " ids in " << s << " s\n";
  }
}
