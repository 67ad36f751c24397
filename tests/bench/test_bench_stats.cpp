// k3::bench statistics, arrival process, datasets, request bodies and result JSON.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "k3/bench/client.h"
#include "k3/bench/dataset.h"
#include "k3/bench/stats.h"
#include "k3/core/error.h"
#include "k3/text/tokenizer.h"
#include "test_util.h"

using namespace k3::bench;

TEST(BenchStats, PercentileMatchesNumpyLinear) {
  std::vector<double> v = {15, 20, 35, 40, 50};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 15);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 50);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 35);
  EXPECT_DOUBLE_EQ(percentile(v, 40), 29);    // numpy.percentile([15,20,35,40,50], 40) == 29.0
  EXPECT_DOUBLE_EQ(percentile(v, 90), 46);    // 40 + 0.6 * 10
  EXPECT_DOUBLE_EQ(percentile(v, 99), 49.6);
  EXPECT_DOUBLE_EQ(percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(percentile({7}, 99), 7);
  std::vector<double> r;
  for (int i = 100; i >= 1; --i) r.push_back(i);  // unsorted input
  EXPECT_NEAR(percentile(r, 90), 90.1, 1e-12);
  EXPECT_NEAR(percentile(r, 99), 99.01, 1e-12);
  EXPECT_DOUBLE_EQ(mean({1, 2, 3, 4}), 2.5);
  EXPECT_DOUBLE_EQ(stddev({2, 4, 4, 4, 5, 5, 7, 9}), 2.0);
}

static RequestOutcome req(double ttft, double e2e, int64_t out, bool ok = true) {
  RequestOutcome r;
  r.success = ok;
  r.ttft = ttft;
  r.e2e = e2e;
  r.output_tokens = out;
  r.prompt_tokens = 10;
  r.chunks = out;
  if (!ok) r.error = "HTTP 500";
  for (int64_t i = 1; i < out; ++i) r.itl.push_back((e2e - ttft) / (out - 1));
  return r;
}

TEST(BenchStats, TpotAndGoodput) {
  auto a = req(0.1, 1.0, 10);  // tpot = 0.9 / 9 = 100 ms
  ASSERT_TRUE(tpot_of(a));
  EXPECT_NEAR(*tpot_of(a), 0.1, 1e-12);
  EXPECT_FALSE(tpot_of(req(0.1, 0.1, 1)));
  auto slo = parse_goodput({"ttft:200", "tpot:150"});
  EXPECT_TRUE(meets_slo(a, slo));
  EXPECT_FALSE(meets_slo(req(0.3, 1.0, 10), slo));   // ttft 300 ms
  EXPECT_FALSE(meets_slo(req(0.1, 2.0, 10), slo));   // tpot 211 ms
  EXPECT_TRUE(meets_slo(req(0.1, 0.1, 1), slo));     // no tpot: only ttft counts
  EXPECT_FALSE(meets_slo(req(0.1, 1.0, 10, false), slo));
  EXPECT_THROW(parse_goodput({"ttft"}), k3::Error);
  EXPECT_THROW(parse_goodput({"foo:1"}), k3::Error);
  EXPECT_THROW(parse_goodput({"ttft:abc"}), k3::Error);

  std::vector<RequestOutcome> v = {a, req(0.3, 1.0, 10), req(0.1, 2.0, 10), req(0, 0, 0, false)};
  auto s = summarize(v, 2.0, slo);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.total_output_tokens, 30);
  EXPECT_EQ(s.total_input_tokens, 30);
  EXPECT_DOUBLE_EQ(s.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(s.output_throughput, 15);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, 30);
  ASSERT_TRUE(s.request_goodput);
  EXPECT_EQ(s.good_requests, 1);
  EXPECT_DOUBLE_EQ(*s.request_goodput, 0.5);
  EXPECT_NEAR(s.ttft_ms.median, 100, 1e-9);
  EXPECT_NEAR(s.e2el_ms.mean, 4000.0 / 3, 1e-9);
  EXPECT_EQ(s.itl_ms.count, 27);
  EXPECT_EQ(s.errors.size(), 1u);
  // No SLO: no goodput.
  EXPECT_FALSE(summarize(v, 2.0, Slo{}).request_goodput);
}

TEST(BenchStats, ResultJsonHasVllmKeys) {
  std::vector<RequestOutcome> v = {req(0.1, 1.0, 10), req(0.2, 1.2, 11)};
  auto j = summary_json(summarize(v, 1.0, parse_goodput({"ttft:150"})));
  for (const char* k : {"completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
                        "request_goodput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
                        "median_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "std_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                        "p90_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms", "errors"})
    EXPECT_TRUE(j.contains(k)) << k;
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["total_output_tokens"], 21);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 150, 1e-9);
  // Round trip through text.
  auto back = nlohmann::json::parse(j.dump());
  EXPECT_EQ(back, j);
  const std::string t = summary_table(summarize(v, 1.0, Slo{}), "Serving Benchmark Result");
  EXPECT_NE(t.find("Successful requests:"), std::string::npos);
  EXPECT_NE(t.find("P99 ITL (ms):"), std::string::npos);
}

TEST(BenchStats, ArrivalsPoissonAndGammaRates) {
  for (double burst : {1.0, 0.5, 4.0}) {
    const double rate = 20;
    const int64_t n = 20000;
    auto t = arrival_times(n, rate, burst, 42);
    ASSERT_EQ(static_cast<int64_t>(t.size()), n);
    EXPECT_DOUBLE_EQ(t[0], 0);
    std::vector<double> gaps;
    for (int64_t i = 1; i < n; ++i) {
      ASSERT_GE(t[i], t[i - 1]);
      gaps.push_back(t[i] - t[i - 1]);
    }
    const double measured = (n - 1) / t.back();
    EXPECT_NEAR(measured, rate, rate * 0.03) << "burstiness " << burst;
    // Gamma(k, 1/(rate k)): coefficient of variation 1/sqrt(k).
    const double cv = stddev(gaps) / mean(gaps);
    EXPECT_NEAR(cv, 1 / std::sqrt(burst), 0.05 / std::sqrt(burst)) << "burstiness " << burst;
  }
  EXPECT_EQ(arrival_times(5, 10, 1, 7), arrival_times(5, 10, 1, 7));  // seeded
  EXPECT_NE(arrival_times(5, 10, 1, 7), arrival_times(5, 10, 1, 8));
  auto inf = arrival_times(3, std::numeric_limits<double>::infinity(), 1, 0);
  EXPECT_EQ(inf, std::vector<double>(3, 0.0));
  EXPECT_THROW(arrival_times(3, 0, 1, 0), k3::Error);
}

TEST(BenchDataset, RandomLengthsPrefixAndSeed) {
  std::vector<int32_t> pool = {5, 6, 7, 8};
  RandomOptions o;
  o.input_len = 32;
  o.output_len = 16;
  auto a = random_dataset(50, o, pool, 1);
  ASSERT_EQ(a.size(), 50u);
  for (auto& r : a) {
    EXPECT_EQ(r.prompt_ids.size(), 32u);
    EXPECT_EQ(r.prompt_len, 32);
    EXPECT_EQ(r.output_len, 16);
    for (auto id : r.prompt_ids) EXPECT_TRUE(id >= 5 && id <= 8);
  }
  auto b = random_dataset(50, o, pool, 1);
  EXPECT_EQ(a[3].prompt_ids, b[3].prompt_ids);
  o.range_ratio = 0.5;
  o.prefix_len = 4;
  auto c = random_dataset(400, o, pool, 2);
  std::set<int64_t> lens;
  for (auto& r : c) {
    EXPECT_GE(r.prompt_len, 4 + 16);
    EXPECT_LE(r.prompt_len, 4 + 48);
    EXPECT_GE(r.output_len, 8);
    EXPECT_LE(r.output_len, 24);
    EXPECT_TRUE(std::equal(c[0].prompt_ids.begin(), c[0].prompt_ids.begin() + 4, r.prompt_ids.begin()));
    lens.insert(r.prompt_len);
  }
  EXPECT_GT(lens.size(), 10u);
  EXPECT_THROW(random_dataset(1, RandomOptions{0, 1, 0, 0}, pool, 0), k3::Error);
}

TEST(BenchDataset, PrefixRepetition) {
  PrefixRepetitionOptions o{8, 4, 3, 5};
  auto v = prefix_repetition_dataset(30, o, {1, 2, 3, 4, 5, 6, 7, 8, 9}, 3);
  std::set<std::vector<int32_t>> prefixes;
  for (auto& r : v) {
    ASSERT_EQ(r.prompt_ids.size(), 12u);
    EXPECT_EQ(r.output_len, 5);
    prefixes.insert(std::vector<int32_t>(r.prompt_ids.begin(), r.prompt_ids.begin() + 8));
  }
  EXPECT_EQ(prefixes.size(), 3u);
}

TEST(BenchDataset, ShareGptAndTokenizerPool) {
  const std::string data = k3test::shared_path("data/prompts/ShareGPT_V3_filtered_1000.json");
  const std::string model = k3test::source_path("models/k3-tiny");
  K3_SKIP_WITHOUT_SHARED();  // fails instead under K3_REQUIRE_SHARED=1 (CI)
  ASSERT_TRUE(k3test::fs::exists(data)) << data;  // the shared data is there: its prompts must be too
  ASSERT_TRUE(k3test::fs::exists(model + "/tiktoken.model")) << model;  // committed in the repo
  auto tok = k3::text::Tokenizer::load(model);
  ShareGptOptions o;
  o.path = data;
  auto v = sharegpt_dataset(20, o, tok, 0);
  ASSERT_EQ(v.size(), 20u);
  for (auto& r : v) {
    EXPECT_FALSE(r.prompt_text.empty());
    EXPECT_EQ(r.prompt_len, static_cast<int64_t>(tok.encode(r.prompt_text).size()));
    EXPECT_GE(r.output_len, 4);
    EXPECT_LE(r.prompt_len, 1024);
    EXPECT_LE(r.prompt_len + r.output_len, 2048);
  }
  EXPECT_EQ(sharegpt_dataset(20, o, tok, 0)[7].prompt_text, v[7].prompt_text);
  o.output_len = 33;
  for (auto& r : sharegpt_dataset(5, o, tok, 1)) EXPECT_EQ(r.output_len, 33);
  auto pool = sampleable_ids(tok);
  EXPECT_GT(pool.size(), 1000u);
  for (size_t i = 0; i < pool.size(); i += 97) EXPECT_FALSE(tok.is_special(pool[i]));
}

TEST(BenchClient, UrlAndBodies) {
  auto u = parse_url("http://localhost:8123/prefix/");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, "8123");
  EXPECT_EQ(u.path, "/prefix");
  EXPECT_EQ(parse_url("127.0.0.1").port, "80");
  EXPECT_THROW(parse_url("https://x"), k3::Error);
  ClientOptions o;
  o.model = "m";
  o.ignore_eos = true;
  BenchRequest r;
  r.prompt_ids = {1, 2, 3};
  r.prompt_text = "hi";
  r.output_len = 7;
  auto j = nlohmann::json::parse(request_body(o, r));
  EXPECT_EQ(j["prompt"], nlohmann::json({1, 2, 3}));
  EXPECT_EQ(j["max_tokens"], 7);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_EQ(j["ignore_eos"], true);
  o.endpoint = "/v1/chat/completions";
  j = nlohmann::json::parse(request_body(o, r));
  EXPECT_EQ(j["messages"][0]["content"], "hi");
  EXPECT_EQ(j["max_completion_tokens"], 7);
  EXPECT_EQ(prometheus_value("# HELP x\nk3_x_total 5\nk3_x_total_other 9\nk3_y{a=\"b\"} 2\nk3_y{a=\"c\"} 3\n", "k3_x_total"), 5.0);
  EXPECT_EQ(prometheus_value("k3_y{a=\"b\"} 2\nk3_y{a=\"c\"} 3\n", "k3_y"), 5.0);
  EXPECT_FALSE(prometheus_value("k3_y 2\n", "k3_z"));
}

// The client against the built-in mock: every request completes with the mock's token count, and
// the client sustains far more than a real server (the number is printed for docs/bench.md).
TEST(BenchClient, MockServerCapacity) {
  MockServer mock(1);
  ClientOptions o;
  o.url = parse_url("http://127.0.0.1:" + std::to_string(mock.port()));
  o.model = "mock";
  RandomOptions ro;
  ro.input_len = 16;
  ro.output_len = 64;
  for (const char* ep : {"/v1/completions", "/v1/chat/completions"}) {
    o.endpoint = ep;
    auto reqs = random_dataset(2000, ro, {1, 2, 3}, 0);
    for (auto& r : reqs) r.prompt_text = "x";
    auto lr = run_load(o, reqs, std::vector<double>(reqs.size(), 0.0), 64);
    auto s = summarize(lr.outcomes, lr.duration_s, Slo{});
    EXPECT_EQ(s.completed, 2000) << (s.errors.empty() ? "" : s.errors[0]);
    EXPECT_EQ(s.total_output_tokens, 2000 * 64);
    EXPECT_EQ(s.total_chunks, 2000 * 64);
    EXPECT_LE(lr.connections_opened, 64 + 4);  // keep-alive reuse
    std::printf("[ client capacity %s, 64 concurrent, 1 client thread: %.0f req/s, %.0f chunks/s ]\n", ep,
                s.request_throughput, s.total_chunks / s.duration_s);
    EXPECT_GT(s.request_throughput, 200);
  }
  EXPECT_EQ(mock.requests(), 4000);
}

TEST(BenchClient, FailuresAreCounted) {
  ClientOptions o;
  o.url = parse_url("http://127.0.0.1:1");  // nothing listens
  o.model = "m";
  std::vector<BenchRequest> reqs(3);
  for (auto& r : reqs) r.output_len = 4, r.prompt_ids = {1};
  auto lr = run_load(o, reqs, {0, 0, 0}, 2);
  auto s = summarize(lr.outcomes, lr.duration_s, Slo{});
  EXPECT_EQ(s.completed, 0);
  EXPECT_EQ(s.failed, 3);
  ASSERT_FALSE(s.errors.empty());
  EXPECT_NE(s.errors[0].find("connect"), std::string::npos);
}

// vllm bench's --percentile-metrics / --metric-percentiles: the table shows mean, median and the chosen
// percentiles of the chosen metrics only; the JSON gains p{P}_{metric}_ms (numpy's linear percentile).
TEST(BenchStats, ChosenPercentilesAndMetrics) {
  std::vector<RequestOutcome> v(5);
  for (int i = 0; i < 5; ++i) {
    v[i].success = true;
    v[i].prompt_tokens = 4;
    v[i].output_tokens = 3;
    v[i].ttft = 0.01 * (i + 1);  // 10..50 ms
    v[i].e2e = 0.1 * (i + 1);
    v[i].itl = {0.001 * (i + 1), 0.002 * (i + 1)};
  }
  const auto s = summarize(v, 1.0, Slo{});
  const auto pc = parse_percentile_choice("e2el,ttft", "50,99.9");
  const auto j = summary_json(s, pc);
  EXPECT_NEAR(j["p50_ttft_ms"].get<double>(), 30, 1e-9);
  EXPECT_NEAR(j["p99.9_ttft_ms"].get<double>(), 40 + 0.996 * 10, 1e-9);
  EXPECT_NEAR(j["p50_e2el_ms"].get<double>(), 300, 1e-9);
  EXPECT_FALSE(j.contains("p50_itl_ms"));
  EXPECT_TRUE(j.contains("p99_itl_ms"));  // the fixed keys stay for every metric
  const std::string t = summary_table(s, "R", pc);
  EXPECT_NE(t.find("P99.9 TTFT (ms):"), std::string::npos) << t;
  EXPECT_NE(t.find("P50 E2EL (ms):"), std::string::npos) << t;
  EXPECT_EQ(t.find("ITL"), std::string::npos) << t;
  EXPECT_EQ(t.find("P99 TTFT"), std::string::npos) << t;
  EXPECT_LT(t.find("TTFT"), t.find("E2EL"));  // vllm's section order, whatever the flag's
  const std::string def = summary_table(s, "R");
  EXPECT_NE(def.find("P99 ITL (ms):"), std::string::npos);
  EXPECT_EQ(def.find("E2EL"), std::string::npos);  // vllm's default: ttft,tpot,itl
  for (auto [m, p] : {std::pair{"ttft,foo", "99"}, {"", "99"}, {"ttft", "0"}, {"ttft", "101"}, {"ttft", "nan"},
                      {"ttft", "9x"}, {"ttft", ""}, {"ttft", "1e999"}})
    EXPECT_THROW(parse_percentile_choice(m, p), k3::Error) << m << " / " << p;
}
