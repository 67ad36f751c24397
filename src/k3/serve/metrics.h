// Prometheus metrics of the server (text exposition format 0.0.4). Names follow vLLM's vllm:*
// metrics with a k3_ prefix; docs/serving.md lists them.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "k3/engine/engine_api.h"

namespace k3::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the _bucket / _sum / _count lines of `name`; `labels` (`k="v",...`) go first in each.
  void render(const std::string& name, std::string& out, const std::string& labels = {}) const;

 private:
  std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), + the +Inf one
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  // `model_name` (the served name) labels every sample, as vLLM's metrics are labelled; empty: no label.
  explicit Metrics(const std::string& model_name = {});
  void count_request(const std::string& endpoint, int status);
  void add_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double s) { ttft_.observe(s); }
  void observe_tpot(double s) { tpot_.observe(s); }
  void observe_e2e(double s) { e2e_.observe(s); }
  // HTTP layer: gauges the server keeps current, and requests/connections refused by reason
  // (body_budget, connection_limit, fd_exhausted, worker_queue_full, saturated, body_too_large, ...).
  void set_open_connections(int64_t n) { open_connections_ = n; }
  void set_inflight_body_bytes(int64_t n) { inflight_body_bytes_ = n; }
  void count_rejection(const std::string& reason);
  void count_disconnect() { ++client_disconnects_; }
  // The full /metrics page; engine gauges come from `st`.
  std::string render(const engine::EngineStats& st) const;

  static const std::vector<double>& ttft_buckets();
  static const std::vector<double>& tpot_buckets();
  static const std::vector<double>& e2e_buckets();

 private:
  std::string model_label_;  // `model_name="..."`, escaped; empty: none
  double start_time_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0}, generation_tokens_{0};
  std::atomic<int64_t> open_connections_{0}, inflight_body_bytes_{0}, client_disconnects_{0};
  std::map<std::string, uint64_t> rejections_;
  Histogram ttft_, tpot_, e2e_;
};

// Prometheus number formatting ("+Inf", shortest round-trip otherwise).
std::string prom_number(double v);

}  // namespace k3::serve
