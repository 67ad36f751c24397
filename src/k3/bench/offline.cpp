#include "k3/bench/offline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "k3/bench/stats.h"
#include "k3/core/error.h"
#include "k3/plan/plan.h"
#include "k3/runtime/model_runner.h"

namespace k3::bench {

nlohmann::json OfflineResult::to_json() const {
  std::vector<double> tps;
  const double toks = static_cast<double>(test.n * test.batch);
  for (double s : seconds) tps.push_back(s > 0 ? toks / s : 0);
  nlohmann::json j = {{"test", test.name},     {"n_prompt", test.prefill ? test.n : 0}, {"n_gen", test.prefill ? 0 : test.n},
          {"n_depth", test.depth}, {"n_batch", test.batch},                 {"reps", seconds.size()},
          {"samples_s", seconds},  {"samples_ts", tps},                     {"avg_ts", tps_mean},
          {"stddev_ts", tps_std},  {"avg_s", mean(seconds)}};
  if (step_bytes > 0) {
    j["step_bytes"] = step_bytes;
    j["read_gb_s"] = read_gb_s;
    j["bandwidth_gb_s"] = bandwidth_gb_s;
    j["of_bandwidth"] = read_gb_s / bandwidth_gb_s;
  }
  return j;
}

void add_decode_roofline(OfflineResult& r, const ModelConfig& c, const CacheSpec& spec, double bandwidth_gb_s) {
  if (r.test.prefill || bandwidth_gb_s <= 0 || r.seconds.empty()) return;
  const double context = static_cast<double>(r.test.depth) + (static_cast<double>(r.test.n) + 1) / 2;
  r.step_bytes = plan::decode_step_bytes(c, spec, r.test.batch, context).total();
  r.read_gb_s = r.step_bytes * static_cast<double>(r.test.n) / mean(r.seconds) / 1e9;
  r.bandwidth_gb_s = bandwidth_gb_s;
}

std::vector<OfflineTest> offline_tests(const std::vector<int64_t>& pp, const std::vector<int64_t>& tg,
                                       const std::vector<int64_t>& depths, const std::vector<int64_t>& batches) {
  std::vector<OfflineTest> out;
  for (int64_t b : batches) {
    if (b < 1) throw Error("-b: batch sizes must be >= 1");
    for (int64_t d : depths) {
      if (d < 0) throw Error("-d: depths must be >= 0");
      for (int64_t n : pp)
        if (n > 0) out.push_back({"pp" + std::to_string(n), true, n, d, b});
      for (int64_t n : tg)
        if (n > 0) out.push_back({"tg" + std::to_string(n), false, n, d, b});
    }
  }
  return out;
}

OfflineResult run_offline_test(const ModelRunner& m, const OfflineTest& t, int reps, uint64_t seed) {
  if (reps < 1) throw Error("-r must be >= 1");
  std::mt19937_64 rng(seed);
  const int32_t V = static_cast<int32_t>(m.config().vocab_size);
  auto rand_tokens = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    return v;
  };
  // The depth context, built once (untimed) and copied for each run.
  std::vector<std::unique_ptr<SequenceCache>> base;
  std::vector<float> logits;
  for (int64_t b = 0; b < t.batch; ++b) {
    base.push_back(m.new_cache());
    if (t.depth > 0) {
      auto ctx = rand_tokens(t.depth);
      ForwardOptions fo;
      fo.path = AttnPath::Prefill;
      m.forward(ctx, *base.back(), logits, fo);
    }
  }
  std::vector<std::vector<int32_t>> inputs;
  for (int64_t b = 0; b < t.batch; ++b) inputs.push_back(rand_tokens(t.prefill ? t.n : t.n));
  OfflineResult r;
  r.test = t;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    std::vector<std::unique_ptr<SequenceCache>> st;
    for (const auto& b : base) st.push_back(b->clone());
    std::vector<BatchItem> items(static_cast<size_t>(t.batch));
    const auto t0 = std::chrono::steady_clock::now();
    if (t.prefill) {
      ForwardOptions fo;
      fo.path = AttnPath::Prefill;
      for (int64_t b = 0; b < t.batch; ++b) items[b] = {inputs[b], st[b].get(), true};
      m.forward_batch(items, logits, fo);
    } else {
      ForwardOptions fo;
      fo.path = AttnPath::Decode;
      for (int64_t i = 0; i < t.n; ++i) {
        for (int64_t b = 0; b < t.batch; ++b)
          items[b] = {std::span<const int32_t>(inputs[b].data() + i, 1), st[b].get(), true};
        m.forward_batch(items, logits, fo);
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 0) r.seconds.push_back(s);
  }
  std::vector<double> tps;
  for (double s : r.seconds) tps.push_back(static_cast<double>(t.n * t.batch) / s);
  r.tps_mean = mean(tps);
  r.tps_std = tps.size() > 1 ? stddev(tps) * std::sqrt(tps.size() / (tps.size() - 1.0)) : 0.0;  // sample stddev
  return r;
}

std::string offline_table(const std::vector<OfflineResult>& rs, const std::string& model_name) {
  const bool roofline = std::any_of(rs.begin(), rs.end(), [](const OfflineResult& r) { return r.step_bytes > 0; });
  std::string o = roofline ? "| model | test | depth | batch | t/s | GB/step | GB/s | % of BW |\n"
                             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n"
                           : "| model | test | depth | batch | t/s |\n| --- | --- | ---: | ---: | ---: |\n";
  char buf[640];
  for (const auto& r : rs) {
    std::snprintf(buf, sizeof buf, "| %s | %s | %lld | %lld | %.2f ± %.2f |", model_name.c_str(), r.test.name.c_str(),
                  (long long)r.test.depth, (long long)r.test.batch, r.tps_mean, r.tps_std);
    o += buf;
    if (roofline) {
      if (r.step_bytes > 0)
        std::snprintf(buf, sizeof buf, " %.3f | %.1f | %.0f%% |", r.step_bytes / 1e9, r.read_gb_s,
                      100 * r.read_gb_s / r.bandwidth_gb_s);
      else
        std::snprintf(buf, sizeof buf, " | | |");
      o += buf;
    }
    o += "\n";
  }
  return o;
}

}  // namespace k3::bench
