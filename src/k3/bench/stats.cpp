#include "k3/bench/stats.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <utility>

#include "k3/core/error.h"

namespace k3::bench {

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  q = std::clamp(q, 0.0, 100.0);
  const double pos = q / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double f = pos - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * f;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double stddev(const std::vector<double>& v) {
  if (v.empty()) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

Slo parse_goodput(const std::vector<std::string>& specs) {
  Slo slo;
  for (const auto& s : specs) {
    const auto c = s.find(':');
    if (c == std::string::npos) throw Error("--goodput expects KEY:MS (ttft, tpot, e2el), got '" + s + "'");
    const std::string key = s.substr(0, c);
    double v = 0;
    try {
      size_t used = 0;
      v = std::stod(s.substr(c + 1), &used);
      if (used != s.size() - c - 1) throw 0;
    } catch (...) {
      throw Error("--goodput: '" + s + "': the value must be a number of milliseconds");
    }
    if (!(v >= 0)) throw Error("--goodput: '" + s + "': the value must be >= 0");
    if (key == "ttft") slo.ttft_ms = v;
    else if (key == "tpot") slo.tpot_ms = v;
    else if (key == "e2el") slo.e2el_ms = v;
    else throw Error("--goodput: unknown metric '" + key + "' (ttft, tpot, e2el)");
  }
  return slo;
}

std::optional<double> tpot_of(const RequestOutcome& r) {
  if (r.output_tokens <= 1) return std::nullopt;
  return (r.e2e - r.ttft) / static_cast<double>(r.output_tokens - 1);
}

bool meets_slo(const RequestOutcome& r, const Slo& slo) {
  if (!r.success) return false;
  if (slo.ttft_ms && r.ttft * 1e3 > *slo.ttft_ms) return false;
  if (slo.e2el_ms && r.e2e * 1e3 > *slo.e2el_ms) return false;
  if (slo.tpot_ms) {
    auto t = tpot_of(r);
    if (t && *t * 1e3 > *slo.tpot_ms) return false;
  }
  return true;
}

Distribution distribution(const std::vector<double>& v) {
  Distribution d;
  d.count = static_cast<int64_t>(v.size());
  if (v.empty()) return d;
  d.mean = mean(v);
  d.std = stddev(v);
  d.median = percentile(v, 50);
  d.p90 = percentile(v, 90);
  d.p99 = percentile(v, 99);
  d.min = *std::min_element(v.begin(), v.end());
  d.max = *std::max_element(v.begin(), v.end());
  d.values = v;
  return d;
}

Summary summarize(const std::vector<RequestOutcome>& out, double duration_s, const Slo& slo) {
  Summary s;
  s.duration_s = duration_s;
  std::vector<double> ttft, tpot, itl, e2el;
  std::set<std::string> errs;
  for (const auto& r : out) {
    if (!r.success) {
      ++s.failed;
      if (errs.size() < 10) errs.insert(r.error);
      continue;
    }
    ++s.completed;
    s.total_input_tokens += r.prompt_tokens;
    s.total_output_tokens += r.output_tokens;
    s.total_chunks += r.chunks;
    ttft.push_back(r.ttft * 1e3);
    e2el.push_back(r.e2e * 1e3);
    if (auto t = tpot_of(r)) tpot.push_back(*t * 1e3);
    for (double g : r.itl) itl.push_back(g * 1e3);
    if (!slo.empty() && meets_slo(r, slo)) ++s.good_requests;
  }
  s.errors.assign(errs.begin(), errs.end());
  if (duration_s > 0) {
    s.request_throughput = s.completed / duration_s;
    s.output_throughput = s.total_output_tokens / duration_s;
    s.total_token_throughput = (s.total_input_tokens + s.total_output_tokens) / duration_s;
    if (!slo.empty()) s.request_goodput = s.good_requests / duration_s;
  }
  s.ttft_ms = distribution(ttft);
  s.tpot_ms = distribution(tpot);
  s.itl_ms = distribution(itl);
  s.e2el_ms = distribution(e2el);
  return s;
}

PercentileChoice parse_percentile_choice(const std::string& metrics, const std::string& percentiles) {
  PercentileChoice pc;
  pc.metrics.clear();
  pc.percentiles.clear();
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t a = 0;
    for (size_t b; (b = s.find(',', a)) != std::string::npos; a = b + 1) out.push_back(s.substr(a, b - a));
    out.push_back(s.substr(a));
    return out;
  };
  for (const auto& m : split(metrics)) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el")
      throw Error("--percentile-metrics: unknown metric '" + m + "' (ttft, tpot, itl, e2el, comma-separated)");
    if (std::find(pc.metrics.begin(), pc.metrics.end(), m) == pc.metrics.end()) pc.metrics.push_back(m);
  }
  for (const auto& t : split(percentiles)) {
    char* end = nullptr;
    errno = 0;
    const double p = t.empty() ? NAN : std::strtod(t.c_str(), &end);
    if (t.empty() || *end != '\0' || errno != 0 || !(p > 0 && p <= 100))
      throw Error("--metric-percentiles: '" + t + "' is not a percentile in (0, 100] (e.g. 50,90,99)");
    pc.percentiles.push_back(p);
  }
  return pc;
}

std::string percentile_word(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", p);
  return buf;
}

namespace {
const Distribution& metric_of(const Summary& s, const std::string& m) {
  return m == "ttft" ? s.ttft_ms : m == "tpot" ? s.tpot_ms : m == "itl" ? s.itl_ms : s.e2el_ms;
}
}  // namespace

nlohmann::json summary_json(const Summary& s, const PercentileChoice& pc) {
  nlohmann::json j;
  j["duration"] = s.duration_s;
  j["completed"] = s.completed;
  j["failed"] = s.failed;
  j["total_input_tokens"] = s.total_input_tokens;
  j["total_output_tokens"] = s.total_output_tokens;
  j["total_chunks"] = s.total_chunks;
  j["request_throughput"] = s.request_throughput;
  j["request_goodput"] = s.request_goodput ? nlohmann::json(*s.request_goodput) : nlohmann::json(nullptr);
  j["output_throughput"] = s.output_throughput;
  j["total_token_throughput"] = s.total_token_throughput;
  auto put = [&](const char* name, const Distribution& d) {
    const std::string n = name;
    j["mean_" + n + "_ms"] = d.mean;
    j["median_" + n + "_ms"] = d.median;
    j["std_" + n + "_ms"] = d.std;
    j["p90_" + n + "_ms"] = d.p90;
    j["p99_" + n + "_ms"] = d.p99;
  };
  put("ttft", s.ttft_ms);
  put("tpot", s.tpot_ms);
  put("itl", s.itl_ms);
  put("e2el", s.e2el_ms);
  for (const auto& m : pc.metrics)
    for (double q : pc.percentiles) j["p" + percentile_word(q) + "_" + m + "_ms"] = percentile(metric_of(s, m).values, q);
  j["errors"] = s.errors;
  return j;
}

std::string summary_table(const Summary& s, const std::string& title, const PercentileChoice& pc) {
  std::string o;
  char buf[256];
  auto line = [&](const char* k, double v, int prec) {
    std::snprintf(buf, sizeof buf, "%-40s%-10.*f\n", k, prec, v);
    o += buf;
  };
  auto head = [&](const std::string& t) {
    const int w = 50, pad = std::max(0, w - static_cast<int>(t.size()) - 2);
    o += std::string(pad / 2, '-') + " " + t + " " + std::string(pad - pad / 2, '-') + "\n";
  };
  o += std::string(50, '=') + "\n";
  {
    const int w = 50, pad = std::max(0, w - static_cast<int>(title.size()) - 2);
    o += std::string(pad / 2, '=') + " " + title + " " + std::string(pad - pad / 2, '=') + "\n";
  }
  line("Successful requests:", static_cast<double>(s.completed), 0);
  line("Failed requests:", static_cast<double>(s.failed), 0);
  line("Benchmark duration (s):", s.duration_s, 2);
  line("Total input tokens:", static_cast<double>(s.total_input_tokens), 0);
  line("Total generated tokens:", static_cast<double>(s.total_output_tokens), 0);
  line("Request throughput (req/s):", s.request_throughput, 2);
  if (s.request_goodput) line("Request goodput (req/s):", *s.request_goodput, 2);
  line("Output token throughput (tok/s):", s.output_throughput, 2);
  line("Total Token throughput (tok/s):", s.total_token_throughput, 2);
  auto dist = [&](const char* title2, const char* abbr, const Distribution& d) {
    head(title2);
    std::string a = abbr;
    line(("Mean " + a + " (ms):").c_str(), d.mean, 2);
    line(("Median " + a + " (ms):").c_str(), d.median, 2);
    for (double q : pc.percentiles) line(("P" + percentile_word(q) + " " + a + " (ms):").c_str(), percentile(d.values, q), 2);
  };
  // In vllm's order of the sections, whatever the flag's order.
  const std::pair<const char*, const char*> sections[] = {{"ttft", "Time to First Token"},
                                                          {"tpot", "Time per Output Token (excl. 1st token)"},
                                                          {"itl", "Inter-token Latency"},
                                                          {"e2el", "End-to-end Latency"}};
  for (const auto& [m, t] : sections) {
    if (std::find(pc.metrics.begin(), pc.metrics.end(), m) == pc.metrics.end()) continue;
    std::string abbr = m;
    for (auto& c : abbr) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    dist(t, abbr.c_str(), metric_of(s, m));
  }
  o += std::string(50, '=') + "\n";
  return o;
}

std::vector<double> arrival_times(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (!std::isfinite(rate)) return t;
  if (!(rate > 0)) throw Error("--request-rate must be > 0 (or inf)");
  if (!(burstiness > 0)) throw Error("--burstiness must be > 0");
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double acc = 0;
  for (auto& x : t) {
    x = acc;  // the first request goes at 0, as in vllm (yield, then sleep)
    acc += gap(rng);
  }
  return t;
}

}  // namespace k3::bench
