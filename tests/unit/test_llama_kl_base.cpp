// llama.cpp's KL-divergence base file (k3/eval/llama_kl_base.h): the row encoding against a float64
// reading of its definition (step (max - floor) / 65535, floor = max - 16), the writer / reader round trip,
// validation of every header field and the exact size, and `k3 perplexity --kl-base-format llama`
// end to end (llama-perplexity's rule: BOS in front of the text, chunks whose first token becomes BOS,
// the second half scored; a model against its own llama-format base is within the 16-bit rounding).
// Interop with llama.cpp's own binaries was checked by hand (docs/quality.md); CI has no llama.cpp.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/eval/kl_divergence.h"
#include "k3/eval/llama_kl_base.h"
#include "test_util.h"

namespace {

std::vector<float> random_logp(std::mt19937& rng, int64_t V, float scale) {
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> l(static_cast<size_t>(V));
  for (float& x : l) x = nd(rng);
  std::vector<float> lp(l.size());
  k3::eval::log_softmax(l.data(), V, lp.data());
  return lp;
}

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

std::pair<int, std::string> sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = ::pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

std::string error_of(const std::vector<uint8_t>& b) {
  try {
    k3::eval::parse_llama_kl_base(b.data(), b.size());
  } catch (const k3::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(LlamaKlBase, RowEncodingMatchesItsDefinition) {
  std::mt19937 rng(7);
  for (const int64_t V : {2, 5, 6, 1001}) {
    for (const float scale : {0.5f, 4.0f, 30.0f}) {  // narrow spreads and ones wider than the 16-nat window
      const auto lp = random_logp(rng, V, scale);
      std::vector<uint16_t> row(static_cast<size_t>(2 * ((V + 1) / 2) + 4), 0xffff);
      k3::eval::encode_llama_row(lp.data(), V, row.data());
      const double mx = *std::max_element(lp.begin(), lp.end());
      const double floor = std::max<double>(*std::min_element(lp.begin(), lp.end()), mx - 16.0);
      float step, base;
      std::memcpy(&step, row.data(), 4);
      std::memcpy(&base, row.data() + 2, 4);
      EXPECT_NEAR(step, (mx - floor) / 65535.0, 1e-6 * (mx - floor) + 1e-12);
      EXPECT_FLOAT_EQ(base, static_cast<float>(floor));
      for (int64_t i = 0; i < V; ++i) {
        const double decoded = step * row[static_cast<size_t>(4 + i)] + base;
        if (lp[static_cast<size_t>(i)] > floor) {
          EXPECT_NEAR(decoded, lp[static_cast<size_t>(i)], 0.51 * step + 1e-5) << V << " " << i;
        } else {
          EXPECT_EQ(row[static_cast<size_t>(4 + i)], 0) << "at or below the floor: stored as 0";
        }
      }
      if (V % 2) {
        EXPECT_EQ(row.back(), 0) << "the pad to an even count is zero";
      }
    }
  }
}

TEST(LlamaKlBase, WriterReaderRoundTripAndValidation) {
  k3test::TempDir t;
  const std::string p = t.str() + "/b.kld";
  const int64_t ctx = 8, V = 37, chunks = 3;
  std::vector<int32_t> toks(static_cast<size_t>(ctx * chunks));
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<int32_t>((i * 11 + 3) % V);
  std::mt19937 rng(3);
  std::vector<std::vector<float>> rows;
  {
    k3::eval::LlamaKlBaseWriter w(p, ctx, V, toks);
    for (int64_t r = 0; r < chunks * (ctx - 1 - ctx / 2); ++r) {
      rows.push_back(random_logp(rng, V, 3.0f));
      w.add_row(rows.back().data());
    }
    EXPECT_THROW(w.add_row(rows.back().data()), k3::Error);  // one more than the chunks hold
    w.finish();
  }
  k3::eval::LlamaKlBase b(p);
  EXPECT_EQ(b.header().n_ctx, ctx);
  EXPECT_EQ(b.header().n_chunk, chunks);
  EXPECT_TRUE(std::equal(toks.begin(), toks.end(), b.tokens().begin()));
  std::vector<float> d(static_cast<size_t>(V));
  double worst = 0;
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t r = 0; r < ctx - 1 - ctx / 2; ++r) {
      b.decode_row(c, r, d.data());
      const auto& want = rows[static_cast<size_t>(c * (ctx - 1 - ctx / 2) + r)];
      const float floor = std::max(*std::min_element(want.begin(), want.end()), *std::max_element(want.begin(), want.end()) - 16.f);
      for (int64_t i = 0; i < V; ++i)  // below the floor: stored as the floor
        worst = std::max(worst, std::fabs(static_cast<double>(d[i]) - std::max(want[i], floor)));
    }
  EXPECT_LT(worst, 16.0 / 65535 * 0.51 + 1e-5);  // within half a step of a <= 16-nat range (rows here span < 16)
  EXPECT_THROW(b.decode_row(chunks, 0, d.data()), k3::Error);

  const std::vector<uint8_t> good = read_all(p);
  EXPECT_EQ(error_of(good), "");
  auto edit = [&](size_t at, uint32_t v) {
    auto b2 = good;
    std::memcpy(b2.data() + at, &v, 4);
    return error_of(b2);
  };
  EXPECT_NE(error_of({good.begin(), good.end() - 1}).find("truncated"), std::string::npos);
  EXPECT_NE(edit(0, 0x41414141).find("no _logits_ header"), std::string::npos);
  EXPECT_NE(edit(8, 2).find("n_ctx 2 out of range"), std::string::npos);
  EXPECT_NE(edit(8, 9).find("header implies"), std::string::npos);  // a lying n_ctx: the size no longer fits
  EXPECT_NE(edit(12, 1).find("vocabulary size 1"), std::string::npos);
  EXPECT_NE(edit(16, 0xffffffffu).find("chunks of"), std::string::npos);  // n_chunk -1
  EXPECT_NE(edit(20 + 4 * 5, 37).find("token 5 has id 37"), std::string::npos);
  EXPECT_NE(edit(20 + 4 * 5, 0xffffffffu).find("token 5 has id -1"), std::string::npos);
  // A writer refuses text that is not whole chunks.
  EXPECT_THROW(k3::eval::LlamaKlBaseWriter(t.str() + "/c.kld", ctx, V, std::span<const int32_t>(toks.data(), 9)), k3::Error);
}

// k3 perplexity writes a llama.cpp base (its rule: [BOS] + text, chunks, second half) and compares with it.
TEST(LlamaKlBase, PerplexityCliWritesAndComparesLlamaBases) {
  K3_SKIP_WITHOUT_SHARED();
  k3test::TempDir t;
  const std::string k3 = K3_BINARY, text = t.str() + "/t.txt", base = t.str() + "/b.kld", k3base = t.str() + "/k.kld";
  {
    std::ifstream in(k3test::shared_path("data/corpora/emma.txt"), std::ios::binary);
    std::string s(3000, '\0');
    in.read(s.data(), static_cast<std::streamsize>(s.size()));
    std::ofstream(text, std::ios::binary) << s;
  }
  auto [st, out] = sh(k3 + " perplexity -f " + text + " --ctx 64 --chunks 3 --kl-base-format llama --kl-divergence-base " + base);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("windows 3 x ctx 64\ntokens 93\n"), std::string::npos) << out;  // 3 x (64 - 1 - 32) scored
  const auto bytes = read_all(base);
  const auto h = k3::eval::parse_llama_kl_base(bytes.data(), bytes.size());
  EXPECT_EQ(h.n_chunk, 3);
  int32_t first;
  std::memcpy(&first, bytes.data() + h.tokens_offset, 4);
  const auto cfg = nlohmann::json::parse(std::ifstream(k3test::source_path("models/k3-tiny/config.json")));
  EXPECT_EQ(first, cfg.at("bos_token_id").get<int32_t>());  // the text after one BOS, as llama-perplexity tokenises
  // The same model against its own llama-format base: the 16-bit rows cost < 1e-6 nats; the text (BOS in
  // front) tokenises to the base's tokens.
  std::tie(st, out) = sh(k3 + " perplexity --kl-divergence-base " + base + " --kl-divergence -f " + text);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("llama-perplexity's rule"), std::string::npos) << out;
  const double kld = std::stod(out.substr(out.find("kld_mean ") + 9));
  EXPECT_LT(kld, 1e-6) << out;
  EXPECT_GT(kld, -1e-6) << out;  // >= 0 in exact arithmetic; per-token sums of near-equal logs round either way
  EXPECT_NE(out.find("same_top1 1.0000"), std::string::npos) << out;
  const double ratio = std::stod(out.substr(out.find("ppl_ratio ") + 10));
  EXPECT_NEAR(ratio, 1.0, 1e-4) << out;
  // Too little text for two chunks, as llama-perplexity refuses it.
  std::tie(st, out) = sh(k3 + " perplexity -f " + text + " --ctx 4096 --kl-base-format llama --kl-divergence-base " + k3base);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("needs at least 2 x --ctx"), std::string::npos) << out;
  // A truncated llama base is a clear error.
  {
    std::ofstream f(k3base, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() - 3));
  }
  std::tie(st, out) = sh(k3 + " perplexity --kl-divergence-base " + k3base + " --kl-divergence");
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("truncated"), std::string::npos) << out;
}
