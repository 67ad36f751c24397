#include "k3/bench/offline.h"

#include <algorithm>
#include <span>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include "k3/bench/stats.h"
#include "k3/core/error.h"
#include "k3/core/thread_pool.h"
#include "k3/grammar/token_matcher.h"
#include "k3/model/weights.h"
#include "k3/plan/plan.h"
#include "k3/sampling/token_sampling.h"
#include "k3/runtime/model_runner.h"

namespace k3::bench {

nlohmann::json OfflineResult::to_json() const {
  std::vector<double> tps;
  const double toks = static_cast<double>(test.n * test.batch);
  for (double s : seconds) tps.push_back(s > 0 ? toks / s : 0);
  nlohmann::json j = {{"test", test.name},     {"n_prompt", test.prefill ? test.n : 0}, {"n_gen", test.prefill ? 0 : test.n},
          {"n_depth", test.depth}, {"n_batch", test.batch}, {"n_ubatch", !test.prefill ? int64_t{1} : test.ubatch > 0 ? std::min(test.ubatch, test.n) : test.n},
          {"reps", seconds.size()},
          {"mask_seconds", mask_seconds}, {"samples_s", seconds},  {"samples_ts", tps},                     {"avg_ts", tps_mean},
          {"stddev_ts", tps_std},  {"avg_s", mean(seconds)}};
  if (step_bytes > 0) {
    j["step_bytes"] = step_bytes;
    j["read_gb_s"] = read_gb_s;
    j["bandwidth_gb_s"] = bandwidth_gb_s;
    j["of_bandwidth"] = read_gb_s / bandwidth_gb_s;
  }
  if (flops_per_token > 0) {
    j["flops_per_token"] = flops_per_token;
    j["tflop_s"] = tflop_s;
    j["peak_tflops"] = peak_tflops;
    j["of_peak"] = tflop_s / peak_tflops;
  }
  if (io.have_disk) j["disk"] = {{"read_bytes", io.read_bytes}, {"gbps", io.disk_gbps()}, {"major_faults", io.major_faults}};
  if (io.have_experts)
    j["expert_cache"] = {{"lookups", io.expert_lookups}, {"hits", io.expert_hits}, {"missing_bytes", io.expert_missing_bytes}};
  return j;
}

void add_decode_roofline(OfflineResult& r, const ModelConfig& c, const CacheSpec& spec, double bandwidth_gb_s,
                         const plan::LoadedWeightBytes* loaded) {
  if (r.test.prefill || bandwidth_gb_s <= 0 || r.seconds.empty()) return;
  const double context = static_cast<double>(r.test.depth) + (static_cast<double>(r.test.n) + 1) / 2;
  r.step_bytes = plan::decode_step_bytes(c, spec, r.test.batch, context, -1, loaded).total();
  r.read_gb_s = r.step_bytes * static_cast<double>(r.test.n) / mean(r.seconds) / 1e9;
  r.bandwidth_gb_s = bandwidth_gb_s;
}

void add_prefill_roofline(OfflineResult& r, const ModelConfig& c, double peak_tflops) {
  if (!r.test.prefill || !(peak_tflops > 0) || r.seconds.empty()) return;
  r.flops_per_token = plan::prefill_flops_per_token(c, static_cast<double>(r.test.depth) + static_cast<double>(r.test.n) / 2);
  r.tflop_s = r.flops_per_token * r.tps_mean / 1e12;
  r.peak_tflops = peak_tflops;
}

plan::LoadedWeightBytes loaded_weight_bytes(const ModelWeights& w) {
  plan::LoadedWeightBytes b;
  // Every matrix but the routed experts', the head as its own matrix even when tied; less the token table.
  for_each_dense_matrix(w, [&](const WeightMatrix& m) { b.non_routed += static_cast<double>(m.bytes()); });
  b.non_routed -= static_cast<double>(w.embed.bytes());
  for (const LayerWeights& L : w.layers) {
    if (!L.is_kda) {  // kv_b is not among the walked matrices: the form the absorbed decode reads
      const MlaWeights& a = L.mla;
      b.non_routed += static_cast<double>(!a.k_b_blocks.empty() ? a.k_b_blocks.bytes() + a.v_b_blocks.bytes()
                                          : !a.kv_b_stored.empty() ? a.kv_b_stored.bytes()
                                                                   : a.kv_b_f32.bytes());
    }
    if (!L.is_moe || L.moe.experts.empty()) continue;
    double layer = 0;
    for (const GluMlp& e : L.moe.experts) layer += static_cast<double>(e.gate.bytes() + e.up.bytes() + e.down.bytes());
    b.per_expert += layer / static_cast<double>(L.moe.experts.size());
  }
  return b;
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

namespace {
constexpr int64_t kDepthChunk = 8192;  // tokens per forward when the depth context is built

// One sequence's cache after its depth context, untimed. In chunks, as a server prefills a long prompt: one forward
// of the whole depth sizes the step's activations and MoE workspace for every token at once (56 GB of MoE workspace
// for 128k tokens at K3's dimensions on the H200, session 15), where a chunk's are enough.
std::unique_ptr<SequenceCache> build_depth(const ModelRunner& m, const std::vector<int32_t>& ctx) {
  auto c = m.new_cache();
  std::vector<float> logits;
  ForwardOptions fo;
  fo.path = AttnPath::Prefill;
  const int64_t depth = static_cast<int64_t>(ctx.size());
  for (int64_t p = 0; p < depth; p += kDepthChunk) {
    const int64_t n = std::min(kDepthChunk, depth - p);
    m.forward(std::span<const int32_t>(ctx).subspan(static_cast<size_t>(p), static_cast<size_t>(n)), *c, logits, fo);
  }
  return c;
}

// The caches each run of a test starts from. At depth 0, fresh ones. At depth > 0 the contexts are built once and
// each run takes copies while a second set fits beside the first; where it does not, each run rebuilds them
// (untimed, as llama-bench does every run): the whole Kimi-Linear-48B at batch 256 and depth 512 on an H200 holds
// 98 GB of weights and 256 x 45 MB of KDA state per set (call s53-1 failed holding two sets). "Fits" reads the
// runner's memory_available(): free device memory on a GPU, the machine's RAM on the CPU (where runs take copies).
class DepthCaches {
 public:
  DepthCaches(const ModelRunner& m, const OfflineTest& t, std::vector<std::vector<int32_t>> ctxs)
      : m_(m), batch_(t.batch), ctxs_(std::move(ctxs)) {
    if (ctxs_.empty()) return;
    for (const auto& c : ctxs_) base_.push_back(build_depth(m_, c));
    const CacheSpec& s = m_.cache_spec();
    const int64_t set = batch_ * (s.slot_bytes() + s.bytes_per_token() * (t.depth + t.n));
    rebuild_ = m_.memory_available() < set + set / 8 + (int64_t{1} << 30);  // an eighth + 1 GiB for pages, workspace
    if (rebuild_)
      std::fprintf(stderr, "k3 bench: batch %lld at depth %lld: a second set of its caches (%.1f GB) does not fit "
                   "beside the first; each run rebuilds them (untimed)\n", (long long)batch_, (long long)t.depth, set / 1e9);
  }
  std::vector<std::unique_ptr<SequenceCache>> for_run() {
    std::vector<std::unique_ptr<SequenceCache>> st;
    if (ctxs_.empty()) {
      for (int64_t b = 0; b < batch_; ++b) st.push_back(m_.new_cache());
    } else if (!rebuild_) {
      for (const auto& c : base_) st.push_back(c->clone());
    } else if (!base_.empty()) {
      st = std::move(base_);  // the first run takes the contexts built for the check
      base_.clear();
    } else {
      for (const auto& c : ctxs_) st.push_back(build_depth(m_, c));
    }
    return st;
  }

 private:
  const ModelRunner& m_;
  int64_t batch_;
  std::vector<std::vector<int32_t>> ctxs_;
  std::vector<std::unique_ptr<SequenceCache>> base_;
  bool rebuild_ = false;
};

// One sequence's host sampling state of a --grammar tg test.
struct HostSampler {
  std::unique_ptr<grammar::TokenMatcher> matcher;
  std::vector<uint32_t> mask;
};

// Every sequence's mask of its next token, in parallel on the CPU pool (as BatchEngine does); the wall
// time is added to `mask_seconds`.
void fill_masks(std::vector<HostSampler>& hs, const OfflineSampling& s, double& mask_seconds) {
  if (!s.grammar) return;
  const auto t0 = std::chrono::steady_clock::now();
  k3::parallel_for(static_cast<int64_t>(hs.size()), hs.size() > 1, [&](int64_t b) {
    HostSampler& h = hs[static_cast<size_t>(b)];
    if (!h.matcher || h.matcher->terminated()) {
      h.matcher = s.grammar->new_matcher();
      h.mask.assign(static_cast<size_t>(s.grammar->mask_words()), 0);
    }
    h.matcher->fill_allowed(h.mask);
  });
  mask_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Samples row b of `logits` ([batch][V]) under its matcher's mask; the token is the sequence's next input.
int32_t sample_host(HostSampler& hs, const OfflineSampling& s, std::span<float> row, std::mt19937_64& rng) {
  sampling::RowSampling r;
  r.temperature = 1.0f;
  r.u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  if (s.grammar) r.allowed = hs.mask;  // filled by fill_masks
  const sampling::SampleResult res = sampling::sample_row(row, r);
  if (res.status != sampling::SampleStatus::Ok) throw Error("bench offline: sampling failed: " + sampling::describe(res));
  if (hs.matcher && !hs.matcher->accept(res.token)) throw Error("bench offline: the grammar refused its own mask's token");
  return res.token;
}
}  // namespace

OfflineResult run_offline_test(const ModelRunner& m, const OfflineTest& t, int reps, uint64_t seed, bool fresh_tokens,
                               bool warmup, const OfflineSampling* sampling, bool host_logits) {
  if (reps < 1) throw Error("-r must be >= 1");
  std::mt19937_64 rng(seed);
  const int32_t V = static_cast<int32_t>(m.config().vocab_size);
  auto rand_tokens = [&](int64_t n) {
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(V));
    return v;
  };
  std::vector<std::vector<int32_t>> ctxs;  // each sequence's depth context, the same tokens for every run
  for (int64_t b = 0; t.depth > 0 && b < t.batch; ++b) ctxs.push_back(rand_tokens(t.depth));
  DepthCaches depth(m, t, std::move(ctxs));
  std::vector<float> logits;
  std::vector<std::vector<int32_t>> inputs;
  for (int64_t b = 0; b < t.batch; ++b) inputs.push_back(rand_tokens(t.prefill ? t.n : t.n));
  OfflineResult r;
  r.test = t;
  DiskCounters disk0;
  std::optional<ExpertCacheStats> ex0;
  double warm_mask_s = 0;
  for (int rep = warmup ? -1 : 0; rep < reps; ++rep) {  // rep -1: warm-up
    if (rep == 0) {
      disk0 = read_disk_counters();
      ex0 = m.expert_cache_stats();
    }
    if (fresh_tokens && rep > (warmup ? -1 : 0))
      for (auto& in : inputs) in = rand_tokens(static_cast<int64_t>(in.size()));
    std::vector<std::unique_ptr<SequenceCache>> st = depth.for_run();
    std::vector<BatchItem> items(static_cast<size_t>(t.batch));
    const auto t0 = std::chrono::steady_clock::now();
    if (t.prefill) {
      ForwardOptions fo;
      fo.path = AttnPath::Prefill;
      const int64_t step = t.ubatch > 0 ? t.ubatch : t.n;
      for (int64_t p = 0; p < t.n; p += step) {  // only the last chunk's logits, as a server's prefill
        const int64_t n = std::min(step, t.n - p);
        for (int64_t b = 0; b < t.batch; ++b)
          items[b] = {std::span<const int32_t>(inputs[b]).subspan(static_cast<size_t>(p), static_cast<size_t>(n)), st[b].get(), p + n == t.n};
        m.forward_batch(items, logits, fo);
      }
    } else {
      ForwardOptions fo;
      fo.path = AttnPath::Decode;
      std::vector<HostSampler> hs(static_cast<size_t>(t.batch));
      std::mt19937_64 draw(seed + 1);
      const bool on_runner = sampling == nullptr && !host_logits;  // the engine's forward_sample
      std::vector<RowSample> greedy(static_cast<size_t>(t.batch));
      for (auto& g : greedy) g.sampling.temperature = 0.0f;
      std::vector<sampling::SampleResult> picked;
      std::vector<float> raw;
      for (int64_t i = 0; i < t.n; ++i) {
        for (int64_t b = 0; b < t.batch; ++b)
          items[b] = {std::span<const int32_t>(inputs[b].data() + i, 1), st[b].get(), true};
        if (on_runner)
          m.forward_sample(items, greedy, picked, raw, fo);
        else
          m.forward_batch(items, logits, fo);
        if (sampling && i + 1 < t.n) {
          fill_masks(hs, *sampling, rep >= 0 ? r.mask_seconds : warm_mask_s);
          for (int64_t b = 0; b < t.batch; ++b)
            inputs[b][i + 1] = sample_host(hs[b], *sampling, std::span<float>(logits.data() + b * V, V), draw);
        }
      }
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep >= 0) r.seconds.push_back(s);
  }
  const DiskCounters disk1 = read_disk_counters();
  const std::optional<ExpertCacheStats> ex1 = m.expert_cache_stats();
  for (double s : r.seconds) r.io.seconds += s;
  r.io.have_disk = disk0.read_bytes >= 0 && disk1.read_bytes >= 0;
  r.io.read_bytes = r.io.have_disk ? disk1.read_bytes - disk0.read_bytes : 0;
  r.io.major_faults = disk1.major_faults - disk0.major_faults;
  if (ex0 && ex1 && ex1->enabled) {
    r.io.have_experts = true;
    r.io.expert_lookups = ex1->lookups - ex0->lookups;
    r.io.expert_hits = ex1->hits - ex0->hits;
    r.io.expert_missing_bytes = ex1->missing_bytes - ex0->missing_bytes;
  }
  std::vector<double> tps;
  for (double s : r.seconds) tps.push_back(static_cast<double>(t.n * t.batch) / s);
  r.tps_mean = mean(tps);
  r.tps_std = tps.size() > 1 ? stddev(tps) * std::sqrt(tps.size() / (tps.size() - 1.0)) : 0.0;  // sample stddev
  return r;
}

std::string offline_io_table(const std::vector<OfflineResult>& rs) {
  std::string o =
      "| test | expert hit ratio | experts missing GB | read from disk GB | disk GB/s | major faults |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n";
  char buf[512];
  for (const auto& r : rs) {
    const OfflineIo& io = r.io;
    char hit[64] = "-", miss[64] = "-", rd[64] = "-", bw[64] = "-";
    if (io.have_experts) {
      std::snprintf(hit, sizeof hit, "%.3f (%lld/%lld)", io.expert_lookups ? double(io.expert_hits) / double(io.expert_lookups) : 0.0,
                    (long long)io.expert_hits, (long long)io.expert_lookups);
      std::snprintf(miss, sizeof miss, "%.2f", double(io.expert_missing_bytes) / 1e9);
    }
    if (io.have_disk) {
      std::snprintf(rd, sizeof rd, "%.2f", double(io.read_bytes) / 1e9);
      std::snprintf(bw, sizeof bw, "%.3f", io.disk_gbps());
    }
    std::snprintf(buf, sizeof buf, "| %s | %s | %s | %s | %s | %lld |\n", r.test.name.c_str(), hit, miss, rd, bw,
                  (long long)io.major_faults);
    o += buf;
  }
  return o;
}

std::string offline_table(const std::vector<OfflineResult>& rs, const std::string& model_name) {
  const bool bytes = std::any_of(rs.begin(), rs.end(), [](const OfflineResult& r) { return r.step_bytes > 0; });
  const bool flops = std::any_of(rs.begin(), rs.end(), [](const OfflineResult& r) { return r.flops_per_token > 0; });
  std::string o = "| model | test | depth | batch | t/s |";
  std::string rule = "| --- | --- | ---: | ---: | ---: |";
  if (bytes) o += " GB/step | GB/s | % of BW |", rule += " ---: | ---: | ---: |";
  if (flops) o += " GFLOP/token | TFLOP/s | % of peak |", rule += " ---: | ---: | ---: |";
  o += "\n" + rule + "\n";
  char buf[640];
  for (const auto& r : rs) {
    std::snprintf(buf, sizeof buf, "| %s | %s | %lld | %lld | %.2f ± %.2f |", model_name.c_str(), r.test.name.c_str(),
                  (long long)r.test.depth, (long long)r.test.batch, r.tps_mean, r.tps_std);
    o += buf;
    // A roofline's three cells, empty where the row has none (pp rows under a decode roofline and the reverse).
    auto cells = [&](bool have, const char* text) { o += have ? text : " | | |"; };
    if (bytes) {
      std::snprintf(buf, sizeof buf, " %.3f | %.1f | %.0f%% |", r.step_bytes / 1e9, r.read_gb_s, 100 * r.read_gb_s / std::max(r.bandwidth_gb_s, 1e-300));
      cells(r.step_bytes > 0, buf);
    }
    if (flops) {
      std::snprintf(buf, sizeof buf, " %.4g | %.4g | %.1f%% |", r.flops_per_token / 1e9, r.tflop_s, 100 * r.tflop_s / std::max(r.peak_tflops, 1e-300));
      cells(r.flops_per_token > 0, buf);
    }
    o += "\n";
  }
  return o;
}

}  // namespace k3::bench
