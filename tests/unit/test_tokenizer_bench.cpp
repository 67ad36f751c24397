// Encode throughput on the shared corpora. Disabled by default (timing, not correctness); run:
//   ./build/release/tests/k3_tests --gtest_also_run_disabled_tests --gtest_filter='*TokenizerBench*'
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer_test_util.h"

TEST(TokenizerBench, DISABLED_EncodeCorpora) {
  const auto& tok = k3test::kimi();
  const auto t_load0 = std::chrono::steady_clock::now();
  const auto fresh = k3::text::Tokenizer::load_files(k3test::kKimiModel, k3test::kK3Config);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load0).count();
  std::cout << "load tiktoken.model + config: " << load_s * 1e3 << " ms\n";
  size_t total_bytes = 0, total_tokens = 0;
  double total_s = 0;
  for (const auto& e : std::filesystem::directory_iterator(k3test::shared_path("data/corpora"))) {
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(text);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << e.path().filename().string() << ": " << text.size() / 1e6 << " MB, "
              << ids.size() << " tokens, " << s * 1e3 << " ms, " << text.size() / 1e6 / s
              << " MB/s\n";
    EXPECT_EQ(tok.decode(ids), text);
    total_bytes += text.size();
    total_tokens += ids.size();
    total_s += s;
  }
  std::cout << "total: " << total_bytes / 1e6 << " MB, " << total_tokens << " tokens, "
            << total_bytes / 1e6 / total_s << " MB/s\n";
}
