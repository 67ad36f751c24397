// `k3 bench serve` against a real `k3 serve` on models/k3-tiny: every request completes and the
// bench's output-token total equals the server's own count (/metrics k3_generation_tokens_total).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "k3/bench/client.h"
#include "test_util.h"

namespace {

std::string slurp(const std::string& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct ServeProcess {
  pid_t pid = -1;
  int port = 0;
  ServeProcess(const std::string& log, const std::vector<std::string>& extra,
               const std::string& model = k3test::source_path("models/k3-tiny")) {
    std::vector<std::string> args = {K3_BINARY, "serve", "-m", model, "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid = ::fork();
    if (pid == 0) {
      FILE* f = std::fopen(log.c_str(), "w");
      ::dup2(::fileno(f), 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const std::regex re("ready in [0-9.]+ s on http://[0-9.]+:([0-9]+)");
    for (int i = 0; i < 600 && port == 0; ++i) {
      std::smatch m;
      const std::string s = slurp(log);
      if (std::regex_search(s, m, re)) port = std::stoi(m[1]);
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ServeProcess() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
  }
};

double gen_tokens(const k3::bench::Url& u) {
  auto v = k3::bench::prometheus_value(k3::bench::http_get(u, "/metrics"), "k3_generation_tokens_total");
  return v.value_or(-1);
}

}  // namespace

TEST(BenchServeE2E, CompletedAndTokensMatchServerMetrics) {
  ASSERT_TRUE(k3test::fs::exists(k3test::source_path("models/k3-tiny/config.json"))) << "no models/k3-tiny (committed)";
  k3test::TempDir t;
  ServeProcess srv(t.str() + "/serve.log", {});
  ASSERT_GT(srv.port, 0) << slurp(t.str() + "/serve.log");
  const std::string base = "http://127.0.0.1:" + std::to_string(srv.port);
  const auto url = k3::bench::parse_url(base);
  const double before = gen_tokens(url);
  ASSERT_GE(before, 0);
  const std::string res = t.str() + "/res.json";
  const std::string cmd = std::string(K3_BINARY) + " bench serve --base-url " + base +
                          " --num-prompts 20 --max-concurrency 4 --dataset-name random --input-len 32 --output-len 16"
                          " --ignore-eos -q --result-file " + res + " > " + t.str() + "/bench.out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(t.str() + "/bench.out");
  const double after = gen_tokens(url);
  auto j = nlohmann::json::parse(slurp(res));
  EXPECT_EQ(j["completed"], 20);
  EXPECT_EQ(j["failed"], 0);
  const double bench_tokens = j["total_output_tokens"].get<double>();
  EXPECT_EQ(bench_tokens, 20 * 16);  // ignore_eos: exactly max_tokens each
  EXPECT_NEAR(bench_tokens, after - before, 0.02 * (after - before));
  EXPECT_EQ(j["server_generation_tokens_delta"].get<double>(), after - before);
  EXPECT_EQ(j["total_input_tokens"], 20 * 32);  // token-id prompts: exact input lengths
  EXPECT_GT(j["mean_ttft_ms"].get<double>(), 0);
  EXPECT_GT(j["mean_tpot_ms"].get<double>(), 0);
  EXPECT_GT(j["p99_itl_ms"].get<double>(), 0);
  std::printf("%s", slurp(t.str() + "/bench.out").c_str());
}

// Also behind an API key: bench serve sends it to GET /v1/models too (it used to ask there without it: 401).
TEST(BenchServeE2E, ChatEndpointAndSweep) {
  ASSERT_TRUE(k3test::fs::exists(k3test::source_path("models/k3-tiny/config.json"))) << "no models/k3-tiny (committed)";
  k3test::TempDir t;
  ServeProcess srv(t.str() + "/serve.log", {"--api-key", "sk-bench"});
  ASSERT_GT(srv.port, 0) << slurp(t.str() + "/serve.log");
  const std::string base = "http://127.0.0.1:" + std::to_string(srv.port);
  const std::string res = t.str() + "/res.json";
  const std::string cmd = std::string(K3_BINARY) + " bench serve --base-url " + base +
                          " --api-key sk-bench --endpoint /v1/chat/completions --num-prompts 6 --sweep-concurrency 1,3 --input-len 16"
                          " --output-len 8 --ignore-eos -q --goodput ttft:60000 tpot:60000 --result-file " + res +
                          " > " + t.str() + "/bench.out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(t.str() + "/bench.out");
  auto j = nlohmann::json::parse(slurp(res));
  ASSERT_EQ(j["sweep"].size(), 2u);
  for (auto& r : j["sweep"]) {
    EXPECT_EQ(r["completed"], 6);
    EXPECT_EQ(r["total_output_tokens"], 6 * 8);
    EXPECT_DOUBLE_EQ(r["request_goodput"].get<double>(), r["request_throughput"].get<double>());
  }
  EXPECT_EQ(j["sweep"][1]["max_concurrency"], 3);
}

// vllm bench serve's flags: --backend openai-chat picks the chat endpoint, --save-result writes
// {backend}-{rate}qps-{model}-{date}.json into --result-dir (against the built-in mock server).
TEST(BenchServeE2E, VllmBackendAndSaveResultFlags) {
  k3test::TempDir t;
  const std::string cmd = std::string(K3_BINARY) + " bench serve --dry-run-server --backend openai-chat --save-result"
                          " --result-dir " + t.str() + " --num-prompts 4 --input-len 8 --output-len 4 -q > " + t.str() +
                          "/bench.out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(t.str() + "/bench.out");
  std::vector<std::string> files;
  for (const auto& e : k3test::fs::directory_iterator(t.str()))
    if (e.path().extension() == ".json") files.push_back(e.path().filename().string());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].rfind("openai-chat-infqps-mock-", 0), 0u) << files[0];
  auto j = nlohmann::json::parse(slurp(t.str() + "/" + files[0]));
  EXPECT_EQ(j["endpoint"], "/v1/chat/completions");
  EXPECT_EQ(j["completed"], 4);
  // --endpoint given explicitly wins over --backend.
  const std::string res = t.str() + "/r.json";
  const std::string cmd2 = std::string(K3_BINARY) + " bench serve --dry-run-server --backend openai-chat --endpoint "
                           "/v1/completions --num-prompts 2 --input-len 8 --output-len 2 -q --result-file " + res +
                           " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd2.c_str()), 0);
  EXPECT_EQ(nlohmann::json::parse(slurp(res))["endpoint"], "/v1/completions");
}

// vllm bench's tokenizer defaults to the served model's: without --tokenizer, bench serve takes the path
// GET /v1/models gives as `root` (k3 serve: the model's directory), not the built-in model's.
TEST(BenchServeE2E, TokenizerComesFromTheServedModel) {
  ASSERT_TRUE(k3test::fs::exists(k3test::source_path("models/k3-tiny/config.json"))) << "no models/k3-tiny (committed)";
  k3test::TempDir t;
  const auto served = k3test::fs::path(t.str()) / "served-copy";
  k3test::fs::create_directory(served);
  for (const auto& e : k3test::fs::directory_iterator(k3test::source_path("models/k3-tiny")))
    k3test::fs::create_symlink(k3test::fs::absolute(e.path()), served / e.path().filename());
  ServeProcess srv(t.str() + "/serve.log", {}, served.string());
  ASSERT_GT(srv.port, 0) << slurp(t.str() + "/serve.log");
  const std::string base = "http://127.0.0.1:" + std::to_string(srv.port);
  const auto models = nlohmann::json::parse(k3::bench::http_get(k3::bench::parse_url(base), "/v1/models"));
  EXPECT_EQ(models["data"][0]["root"], served.string());
  const std::string res = t.str() + "/res.json";
  const std::string cmd = std::string(K3_BINARY) + " bench serve --base-url " + base +
                          " --num-prompts 2 --input-len 8 --output-len 2 -q --result-file " + res + " > " + t.str() +
                          "/bench.out 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(t.str() + "/bench.out");
  EXPECT_EQ(nlohmann::json::parse(slurp(res))["tokenizer_id"], served.string()) << slurp(t.str() + "/bench.out");
}
