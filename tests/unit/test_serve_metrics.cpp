// Prometheus text formatting of the server metrics.
#include <gtest/gtest.h>

#include <sstream>

#include "k3/serve/metrics.h"

TEST(ServeMetrics, Numbers) {
  EXPECT_EQ(k3::serve::prom_number(0.1), "0.1");
  EXPECT_EQ(k3::serve::prom_number(2.5), "2.5");
  EXPECT_EQ(k3::serve::prom_number(10), "10");
  EXPECT_EQ(k3::serve::prom_number(1.0 / 0.0), "+Inf");
}

TEST(ServeMetrics, HistogramIsCumulative) {
  k3::serve::Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  std::string out;
  h.render("x", out);
  EXPECT_EQ(out,
            "x_bucket{le=\"0.1\"} 2\n"
            "x_bucket{le=\"1\"} 3\n"
            "x_bucket{le=\"+Inf\"} 4\n"
            "x_sum 7.65\n"
            "x_count 4\n");
}

TEST(ServeMetrics, Page) {
  k3::serve::Metrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/chat/completions", 400);
  m.add_tokens(10, 5);
  m.observe_ttft(0.2);
  m.observe_tpot(0.01);
  m.observe_e2e(1.0);
  k3::engine::EngineStats st;
  st.running = 2;
  st.waiting = 3;
  st.cache_bytes_total = 100;
  st.cache_bytes_used = 25;
  st.prefix_queries_tokens = 40;
  st.prefix_hit_tokens = 8;
  st.cache_pages_total = 64;
  st.cache_pages_used = 5;
  st.cache_pages_cached = 7;
  st.cache_slots_total = 32;
  st.cache_slots_used = 2;
  st.cache_checkpoints = 4;
  const std::string p = m.render(st);
  auto has = [&](const std::string& line) { EXPECT_NE(p.find(line + "\n"), std::string::npos) << line << "\n" << p; };
  has("# TYPE k3_requests_total counter");
  has("k3_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2");
  has("k3_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"} 1");
  has("k3_prompt_tokens_total 10");
  has("k3_generation_tokens_total 5");
  has("# TYPE k3_time_to_first_token_seconds histogram");
  has("k3_time_to_first_token_seconds_bucket{le=\"0.25\"} 1");
  has("k3_time_to_first_token_seconds_bucket{le=\"0.1\"} 0");
  has("k3_time_to_first_token_seconds_count 1");
  has("k3_time_per_output_token_seconds_count 1");
  has("k3_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 1");
  has("k3_num_requests_running 2");
  has("k3_num_requests_waiting 3");
  has("k3_cache_usage_ratio 0.25");
  has("k3_cache_pages_total 64");
  has("k3_cache_pages_used 5");
  has("k3_cache_pages_cached 7");
  has("k3_cache_state_slots_total 32");
  has("k3_cache_state_slots_used 2");
  has("k3_cache_checkpoints 4");
  has("k3_prefix_cache_queries_tokens_total 40");
  has("k3_prefix_cache_hits_tokens_total 8");
  has("# TYPE process_start_time_seconds gauge");
  // every sample line belongs to a declared family
  std::istringstream is(p);
  std::string line, family;
  while (std::getline(is, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      family = line.substr(7, line.find(' ', 7) - 7);
      continue;
    }
    if (line[0] == '#') continue;
    EXPECT_EQ(line.rfind(family, 0), 0u) << line;
  }
}

// Issue 17: speculative decoding's counters under vLLM's names, and the derived ratios; absent when off.
TEST(ServeMetrics, SpeculativeDecoding) {
  k3::serve::Metrics m;
  k3::engine::EngineStats st;
  EXPECT_EQ(m.render(st).find("spec_decode"), std::string::npos);
  st.num_speculative_tokens = 3;
  st.spec_num_drafts = 10;
  st.spec_num_draft_tokens = 30;
  st.spec_num_accepted_tokens = 12;
  st.spec_accepted_per_pos = {7, 4, 1};
  const std::string p = m.render(st);
  auto has = [&](const std::string& line) { EXPECT_NE(p.find(line + "\n"), std::string::npos) << line << "\n" << p; };
  has("# TYPE vllm:spec_decode_num_drafts_total counter");
  has("vllm:spec_decode_num_drafts_total 10");
  has("vllm:spec_decode_num_draft_tokens_total 30");
  has("vllm:spec_decode_num_accepted_tokens_total 12");
  has("vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 7");
  has("vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"2\"} 1");
  has("k3_spec_decode_acceptance_rate 0.4");
  has("k3_spec_decode_mean_acceptance_length 2.2");
}

// Issue 19: every sample carries model_name (vLLM's label) before its own labels, escaped; the process
// collector's metric stays unlabelled. A page without a name has no label at all (the tests above).
TEST(ServeMetrics, ModelNameLabelsEverySample) {
  k3::serve::Metrics m("k3 \"tiny\"\\v1");
  m.count_request("/v1/completions", 200);
  m.count_rejection("body_too_large");
  m.observe_ttft(0.2);
  k3::engine::EngineStats st;
  st.running = 1;
  st.num_speculative_tokens = 2;
  st.spec_accepted_per_pos = {3, 1};
  const std::string p = m.render(st);
  const std::string ml = "model_name=\"k3 \\\"tiny\\\"\\\\v1\"";
  auto has = [&](const std::string& line) { EXPECT_NE(p.find(line + "\n"), std::string::npos) << line << "\n" << p; };
  has("k3_requests_total{" + ml + ",endpoint=\"/v1/completions\",status=\"200\"} 1");
  has("k3_http_rejections_total{" + ml + ",reason=\"body_too_large\"} 1");
  has("k3_num_requests_running{" + ml + "} 1");
  has("k3_time_to_first_token_seconds_bucket{" + ml + ",le=\"0.25\"} 1");
  has("k3_time_to_first_token_seconds_count{" + ml + "} 1");
  has("vllm:spec_decode_num_accepted_tokens_per_pos_total{" + ml + ",position=\"1\"} 1");
  std::istringstream is(p);
  std::string line;
  int samples = 0;
  while (std::getline(is, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("process_start_time_seconds ", 0) == 0) continue;
    ++samples;
    EXPECT_NE(line.find("{" + ml), std::string::npos) << line;
  }
  EXPECT_GT(samples, 30);
}
