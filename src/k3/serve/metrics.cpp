#include "k3/serve/metrics.h"

#include <chrono>
#include <cmath>
#include <cstdio>

namespace k3::serve {

std::string prom_number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  if (std::floor(v) == v && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.17g", v);
  // shortest representation that round-trips
  for (int prec = 1; prec <= 17; ++prec) {
    char b2[64];
    std::snprintf(b2, sizeof b2, "%.*g", prec, v);
    if (std::strtod(b2, nullptr) == v) return b2;
  }
  return buf;
}

namespace {
std::string escape_label(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '\\' || c == '"') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o;
}
}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  std::lock_guard lk(mu_);
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out, const std::string& labels) const {
  std::lock_guard lk(mu_);
  const std::string plain = labels.empty() ? " " : "{" + labels + "} ", with = labels.empty() ? "{" : "{" + labels + ",";
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? prom_number(bounds_[i]) : "+Inf";
    out += name + "_bucket" + with + "le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_sum" + plain + prom_number(sum_) + "\n";
  out += name + "_count" + plain + std::to_string(count_) + "\n";
}

const std::vector<double>& Metrics::ttft_buckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                        0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
  return b;
}
const std::vector<double>& Metrics::tpot_buckets() {
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15,
                                        0.2,   0.3,   0.4,  0.5,   0.75, 1.0,   2.5};
  return b;
}
const std::vector<double>& Metrics::e2e_buckets() {
  static const std::vector<double> b = {0.01, 0.05, 0.1, 0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,
                                        10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0};
  return b;
}

Metrics::Metrics(const std::string& model_name)
    : model_label_(model_name.empty() ? std::string() : "model_name=\"" + escape_label(model_name) + "\""),
      start_time_(std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()),
      ttft_(ttft_buckets()),
      tpot_(tpot_buckets()),
      e2e_(e2e_buckets()) {}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_rejection(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++rejections_[reason];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_ += prompt;
  generation_tokens_ += generated;
}

namespace {
// One /metrics page. Every sample carries the page's labels first (`model_name`, as vLLM labels its
// metrics, so that one Prometheus scraping several servers can tell the models apart), then its own.
struct Page {
  std::string out;
  std::string labels;
  void family(const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, const std::string& value, const std::string& own = {}) {
    const std::string all = labels.empty() ? own : own.empty() ? labels : labels + "," + own;
    out += name + (all.empty() ? std::string() : "{" + all + "}") + " " + value + "\n";
  }
};
// Routed experts of a model read from a file-backed mapping (docs/bigger-than-ram.md).
void render_expert_cache(const ExpertCacheStats& e, Page& pg) {
  pg.family("k3_expert_cache_hit_ratio", "gauge", "Fraction of routed-expert uses whose weights were resident when needed.");
  pg.sample("k3_expert_cache_hit_ratio", prom_number(e.hit_ratio()));
  pg.family("k3_expert_cache_lookups_total", "counter", "Routed-expert uses (one per layer, step and expert).");
  pg.sample("k3_expert_cache_lookups_total", std::to_string(e.lookups));
  pg.family("k3_expert_cache_hits_total", "counter", "Routed-expert uses whose weights were resident.");
  pg.sample("k3_expert_cache_hits_total", std::to_string(e.hits));
  pg.family("k3_expert_cache_missing_bytes_total", "counter", "Bytes of used experts that were not resident.");
  pg.sample("k3_expert_cache_missing_bytes_total", std::to_string(e.missing_bytes));
  pg.family("k3_expert_cache_prefetched_total", "counter", "Experts prefetched once routing was known.");
  pg.sample("k3_expert_cache_prefetched_total", std::to_string(e.prefetched_experts));
  pg.family("k3_expert_cache_pinned_bytes", "gauge", "Bytes of the hot experts kept resident (mlock).");
  pg.sample("k3_expert_cache_pinned_bytes", std::to_string(e.hot_bytes));
  pg.family("k3_expert_cache_budget_bytes", "gauge", "Budget of the pinned hot set (--expert-cache-gb).");
  pg.sample("k3_expert_cache_budget_bytes", std::to_string(e.hot_budget_bytes));
  if (e.disk.read_bytes >= 0) {
    pg.family("k3_process_disk_read_bytes_total", "counter", "Bytes this process read from storage (/proc/self/io).");
    pg.sample("k3_process_disk_read_bytes_total", std::to_string(e.disk.read_bytes));
  }
  pg.family("k3_process_major_faults_total", "counter", "Major page faults of this process (pages read from storage).");
  pg.sample("k3_process_major_faults_total", std::to_string(e.disk.major_faults));
}

// Speculative decoding, under vLLM's names (its Counter "vllm:spec_decode_num_drafts" is exposed as
// ..._total, as prometheus_client writes it) so that vLLM dashboards read k3 as they are; plus the two
// ratios they compute, as gauges over the server's lifetime.
void render_spec_decode(const engine::EngineStats& st, Page& pg) {
  pg.family("vllm:spec_decode_num_drafts_total", "counter", "Verification steps that had draft tokens.");
  pg.sample("vllm:spec_decode_num_drafts_total", std::to_string(st.spec_num_drafts));
  pg.family("vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed and verified.");
  pg.sample("vllm:spec_decode_num_draft_tokens_total", std::to_string(st.spec_num_draft_tokens));
  pg.family("vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.");
  pg.sample("vllm:spec_decode_num_accepted_tokens_total", std::to_string(st.spec_num_accepted_tokens));
  pg.family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "Draft tokens accepted, by draft position (0: the first).");
  for (size_t j = 0; j < st.spec_accepted_per_pos.size(); ++j)
    pg.sample("vllm:spec_decode_num_accepted_tokens_per_pos_total", std::to_string(st.spec_accepted_per_pos[j]),
              "position=\"" + std::to_string(j) + "\"");
  const double drafts = static_cast<double>(st.spec_num_drafts), tokens = static_cast<double>(st.spec_num_draft_tokens);
  const double acc = static_cast<double>(st.spec_num_accepted_tokens);
  pg.family("k3_spec_decode_acceptance_rate", "gauge", "Accepted / proposed draft tokens since start (0 before any draft).");
  pg.sample("k3_spec_decode_acceptance_rate", prom_number(tokens > 0 ? acc / tokens : 0.0));
  pg.family("k3_spec_decode_mean_acceptance_length", "gauge",
       "Tokens per verification step since start: 1 + accepted / drafts (0 before any draft).");
  pg.sample("k3_spec_decode_mean_acceptance_length", prom_number(drafts > 0 ? 1.0 + acc / drafts : 0.0));
}

}  // namespace

std::string Metrics::render(const engine::EngineStats& st) const {
  Page pg{{}, model_label_};
  pg.family("k3_requests_total", "counter", "HTTP requests by endpoint and status code.");
  {
    std::lock_guard lk(mu_);
    for (const auto& [k, v] : requests_)
      pg.sample("k3_requests_total", std::to_string(v),
                "endpoint=\"" + escape_label(k.first) + "\",status=\"" + std::to_string(k.second) + "\"");
  }
  pg.family("k3_http_rejections_total", "counter",
       "Requests or connections the HTTP layer refused, by reason (limits; see docs/serving.md).");
  {
    std::lock_guard lk(mu_);
    for (const auto& [k, v] : rejections_)
      pg.sample("k3_http_rejections_total", std::to_string(v), "reason=\"" + escape_label(k) + "\"");
  }
  pg.family("k3_http_connections_open", "gauge", "Client connections open.");
  pg.sample("k3_http_connections_open", std::to_string(open_connections_.load()));
  pg.family("k3_http_inflight_body_bytes", "gauge", "Bytes reserved for request bodies being received or parsed.");
  pg.sample("k3_http_inflight_body_bytes", std::to_string(inflight_body_bytes_.load()));
  pg.family("k3_client_disconnects_total", "counter", "Generation requests cancelled because their client went away.");
  pg.sample("k3_client_disconnects_total", std::to_string(client_disconnects_.load()));
  pg.family("k3_prompt_tokens_total", "counter", "Prompt tokens of finished generation requests.");
  pg.sample("k3_prompt_tokens_total", std::to_string(prompt_tokens_.load()));
  pg.family("k3_generation_tokens_total", "counter", "Generated tokens of finished generation requests.");
  pg.sample("k3_generation_tokens_total", std::to_string(generation_tokens_.load()));
  pg.family("k3_time_to_first_token_seconds", "histogram", "Time from request arrival to the first generated token.");
  ttft_.render("k3_time_to_first_token_seconds", pg.out, pg.labels);
  pg.family("k3_time_per_output_token_seconds", "histogram", "Time between consecutive generated tokens.");
  tpot_.render("k3_time_per_output_token_seconds", pg.out, pg.labels);
  pg.family("k3_e2e_request_latency_seconds", "histogram", "Time from request arrival to the last token.");
  e2e_.render("k3_e2e_request_latency_seconds", pg.out, pg.labels);
  pg.family("k3_num_requests_running", "gauge", "Sequences the engine is running.");
  pg.sample("k3_num_requests_running", std::to_string(st.running));
  pg.family("k3_num_requests_waiting", "gauge", "Sequences waiting in the engine's queue.");
  pg.sample("k3_num_requests_waiting", std::to_string(st.waiting));
  pg.family("k3_cache_usage_ratio", "gauge", "Fraction of the engine's sequence cache in use (0..1).");
  const double used = st.cache_bytes_total > 0 ? double(st.cache_bytes_used) / double(st.cache_bytes_total) : 0.0;
  pg.sample("k3_cache_usage_ratio", prom_number(used));
  pg.family("k3_cache_pages_total", "gauge", "MLA latent pages of the engine's cache.");
  pg.sample("k3_cache_pages_total", std::to_string(st.cache_pages_total));
  pg.family("k3_cache_pages_used", "gauge", "Cache pages referenced by live sequences.");
  pg.sample("k3_cache_pages_used", std::to_string(st.cache_pages_used));
  pg.family("k3_cache_pages_cached", "gauge", "Cache pages held only by the prefix cache (evictable).");
  pg.sample("k3_cache_pages_cached", std::to_string(st.cache_pages_cached));
  pg.family("k3_cache_state_slots_total", "gauge", "KDA state slots of the engine's cache.");
  pg.sample("k3_cache_state_slots_total", std::to_string(st.cache_slots_total));
  pg.family("k3_cache_state_slots_used", "gauge", "KDA state slots held by live sequences.");
  pg.sample("k3_cache_state_slots_used", std::to_string(st.cache_slots_used));
  pg.family("k3_cache_checkpoints", "gauge", "Prefix-cache KDA state checkpoints held (evictable).");
  pg.sample("k3_cache_checkpoints", std::to_string(st.cache_checkpoints));
  pg.family("k3_prefix_cache_queries_tokens_total", "counter", "Prompt tokens looked up in the prefix cache.");
  pg.sample("k3_prefix_cache_queries_tokens_total", std::to_string(st.prefix_queries_tokens));
  pg.family("k3_prefix_cache_hits_tokens_total", "counter", "Prompt tokens found in the prefix cache.");
  pg.sample("k3_prefix_cache_hits_tokens_total", std::to_string(st.prefix_hit_tokens));
  pg.family("k3_num_preemptions_total", "counter", "Sequences preempted by the engine.");
  pg.sample("k3_num_preemptions_total", std::to_string(st.preemptions));
  if (st.num_speculative_tokens > 0) render_spec_decode(st, pg);
  if (st.expert_cache && st.expert_cache->enabled) render_expert_cache(*st.expert_cache, pg);
  pg.family("process_start_time_seconds", "gauge", "Start time of the process since the Unix epoch in seconds.");
  // The process collector's metric, unlabelled as prometheus_client writes it (one per process).
  pg.out += "process_start_time_seconds " + prom_number(start_time_) + "\n";
  return std::move(pg.out);
}

}  // namespace k3::serve
