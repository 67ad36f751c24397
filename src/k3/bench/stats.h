// Statistics of `k3 bench serve` (docs/bench.md): percentiles, per-request outcomes -> the
// vllm-bench-serve style summary (throughputs, goodput, TTFT/TPOT/ITL/E2E distributions), and the
// request arrival process (Poisson / gamma with a burstiness shape, seeded).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace k3::bench {

// Linear-interpolation percentile of `v` (numpy's default, q in [0, 100]); 0 for an empty input.
double percentile(std::vector<double> v, double q);
double mean(const std::vector<double>& v);
double stddev(const std::vector<double>& v);  // population stddev (numpy default, as vllm)

// What one request measured (times in seconds, relative to its send time).
struct RequestOutcome {
  bool success = false;
  std::string error;
  int64_t prompt_tokens = 0;  // from the server's usage
  int64_t output_tokens = 0;  // usage.completion_tokens
  double ttft = 0;            // send -> first chunk with choices
  double e2e = 0;             // send -> last chunk with choices
  std::vector<double> itl;    // gaps between consecutive chunks with choices
  int64_t chunks = 0;         // SSE events with choices
};

// Service-level objectives for goodput, milliseconds; unset = no constraint.
struct Slo {
  std::optional<double> ttft_ms, tpot_ms, e2el_ms;
  bool empty() const { return !ttft_ms && !tpot_ms && !e2el_ms; }
};
// "ttft:500 tpot:50 e2el:2000" (tokens given as separate strings, as on the command line).
Slo parse_goodput(const std::vector<std::string>& specs);

// TPOT of one request: (e2e - ttft) / (output_tokens - 1); nullopt when output_tokens <= 1.
std::optional<double> tpot_of(const RequestOutcome& r);
// Does a successful request meet every SLO (TPOT counts as met when undefined)?
bool meets_slo(const RequestOutcome& r, const Slo& slo);

struct Distribution {
  double mean = 0, median = 0, std = 0, p90 = 0, p99 = 0, min = 0, max = 0;
  int64_t count = 0;
  std::vector<double> values;  // as given (for the percentiles the user picks)
};
Distribution distribution(const std::vector<double>& v);  // of the values as given

struct Summary {
  double duration_s = 0;
  int64_t completed = 0, failed = 0;
  int64_t total_input_tokens = 0, total_output_tokens = 0, total_chunks = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  std::optional<double> request_goodput;  // requests/s meeting the SLOs (only with an SLO)
  int64_t good_requests = 0;
  Distribution ttft_ms, tpot_ms, itl_ms, e2el_ms;
  std::vector<std::string> errors;  // up to 10 distinct messages
};
Summary summarize(const std::vector<RequestOutcome>& out, double duration_s, const Slo& slo);

// vllm bench's --percentile-metrics (which of ttft, tpot, itl, e2el the table shows; default ttft,tpot,itl)
// and --metric-percentiles (default 99): the table and the result's p{P}_{metric}_ms keys.
struct PercentileChoice {
  std::vector<std::string> metrics = {"ttft", "tpot", "itl"};
  std::vector<double> percentiles = {99};
};
// "ttft,e2el" / "50,90,99.9"; a metric not among the four or a percentile outside (0, 100] -> k3::Error.
PercentileChoice parse_percentile_choice(const std::string& metrics, const std::string& percentiles);
// vllm's spelling of a percentile in keys and labels: 99 -> "99", 99.9 -> "99.9".
std::string percentile_word(double p);

// vllm's result keys (completed, request_throughput, mean_ttft_ms, p99_itl_ms, ...): mean, median, std,
// p90, p99 of all four metrics, plus p{P}_{metric}_ms for the chosen metrics and percentiles.
nlohmann::json summary_json(const Summary& s, const PercentileChoice& pc = {});
// The vllm-style printed table: mean, median and the chosen percentiles of the chosen metrics.
std::string summary_table(const Summary& s, const std::string& title, const PercentileChoice& pc = {});

// Send offsets (seconds from the start) of n requests. rate = inf: all at 0. Otherwise the gaps are
// gamma(shape = burstiness, scale = 1 / (rate * burstiness)): mean 1/rate; burstiness 1 = Poisson.
std::vector<double> arrival_times(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace k3::bench
