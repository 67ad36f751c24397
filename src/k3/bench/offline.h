// `k3 bench offline`: engine throughput without HTTP, llama-bench style. Drives
// k3::ModelRunner::forward_batch directly (one cache per sequence, any backend): "pp N" times one batched
// prefill of N tokens per sequence (AttnPath::Prefill), "tg N" times N batched one-token decode
// steps (AttnPath::Decode, the serving engine's path); both after `depth` tokens already in the cache.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace k3 {
class ModelRunner;
}

namespace k3::bench {

struct OfflineTest {
  std::string name;  // "pp512", "tg128"
  bool prefill = true;
  int64_t n = 0, depth = 0, batch = 1;
};

struct OfflineResult {
  OfflineTest test;
  std::vector<double> seconds;  // per repetition
  double tps_mean = 0, tps_std = 0;
  nlohmann::json to_json() const;
};

// The test matrix: every pp and tg size x depth x batch (pp/tg sizes of 0 are skipped).
std::vector<OfflineTest> offline_tests(const std::vector<int64_t>& pp, const std::vector<int64_t>& tg,
                                       const std::vector<int64_t>& depths, const std::vector<int64_t>& batches);

// One warm-up run, then `reps` timed runs; tokens are uniform random ids (seeded).
OfflineResult run_offline_test(const ModelRunner& m, const OfflineTest& t, int reps, uint64_t seed);

// llama-bench's markdown table.
std::string offline_table(const std::vector<OfflineResult>& rs, const std::string& model_name);

}  // namespace k3::bench
