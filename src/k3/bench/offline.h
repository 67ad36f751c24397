// `k3 bench offline`: engine throughput without HTTP, llama-bench style. Drives
// k3::ModelRunner::forward_batch directly (one cache per sequence, any backend): "pp N" times one batched
// prefill of N tokens per sequence (AttnPath::Prefill), "tg N" times N batched one-token decode
// steps (AttnPath::Decode, the serving engine's path); both after `depth` tokens already in the cache.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "k3/plan/plan.h"

namespace k3 {
class ModelRunner;
struct ModelConfig;
struct CacheSpec;
struct ModelWeights;
}

namespace k3::grammar {
class CompiledGrammar;
}

namespace k3::bench {

struct OfflineTest {
  std::string name;  // "pp512", "tg128"
  bool prefill = true;
  int64_t n = 0, depth = 0, batch = 1;
  // pp tests: each sequence's prompt goes through in forwards of at most `ubatch` tokens (llama-bench's -ub,
  // a server's prefill chunks: the step's activations and MoE workspace sized for a chunk, not the prompt);
  // 0: the whole prompt in one forward.
  int64_t ubatch = 0;
};

// What the timed repetitions read: the process's storage reads and major faults (/proc/self/io,
// getrusage), and where the runner reports it, the routed-expert hit counts (runtime/expert_residency.h).
struct OfflineIo {
  bool have_disk = false, have_experts = false;
  int64_t read_bytes = 0, major_faults = 0;
  int64_t expert_lookups = 0, expert_hits = 0, expert_missing_bytes = 0;
  double seconds = 0;  // the timed repetitions together
  double disk_gbps() const { return seconds > 0 ? double(read_bytes) / seconds / 1e9 : 0.0; }
};

struct OfflineResult {
  OfflineTest test;
  std::vector<double> seconds;  // per repetition
  double tps_mean = 0, tps_std = 0;
  // tg tests with a known memory bandwidth (add_decode_roofline): the bytes one step must read, the rate
  // the measured steps read them at (step_bytes x steps / s), and that rate over `bandwidth_gb_s`.
  double step_bytes = 0, read_gb_s = 0, bandwidth_gb_s = 0;
  // pp tests with a known peak rate (add_prefill_roofline): the FLOPs of one prompt token, the rate the timed runs
  // reached (flops_per_token x tok/s) and `peak_tflops`, the device's dense bf16 tensor rate.
  double flops_per_token = 0, tflop_s = 0, peak_tflops = 0;
  OfflineIo io;
  // --grammar tests: wall seconds of the timed repetitions spent filling grammar masks (the matchers'
  // work; applying the mask is part of sampling).
  double mask_seconds = 0;
  nlohmann::json to_json() const;
};

// The test matrix: every pp and tg size x depth x batch (pp/tg sizes of 0 are skipped).
std::vector<OfflineTest> offline_tests(const std::vector<int64_t>& pp, const std::vector<int64_t>& tg,
                                       const std::vector<int64_t>& depths, const std::vector<int64_t>& batches);

// tg tests with host sampling (`k3 bench offline --grammar`): after each step every row is sampled on the
// host (temperature 1, seeded draws) -- under `grammar`'s mask when set, one matcher per sequence, renewed
// when it ends -- and the sampled token is the sequence's next input. What the mask costs a decode step.
struct OfflineSampling {
  std::shared_ptr<const grammar::CompiledGrammar> grammar;  // null: sampling without a mask
};

// One warm-up run, then `reps` timed runs; tokens are uniform random ids (seeded). `fresh_tokens`: every
// run draws new tokens (so the warm-up does not load the routed experts the timed runs use: what a
// model bigger than RAM sees on new requests).
// `warmup` false: no warm-up run (with a cold page cache, the first timed run is the cold start).
// tg steps without `sampling` pick each row's token greedily through ModelRunner::forward_sample, the
// serving engine's path (on a GPU the sampling runs on the device and only the ids cross to the host);
// `host_logits`: forward_batch instead, every row's logits downloaded to the host, as llama.cpp's
// llama_decode does (`k3 bench offline --host-logits`). The inputs stay the seeded random ids either way.
OfflineResult run_offline_test(const ModelRunner& m, const OfflineTest& t, int reps, uint64_t seed,
                               bool fresh_tokens = false, bool warmup = true, const OfflineSampling* sampling = nullptr,
                               bool host_logits = false);

// Fills r's roofline fields for a tg test (pp tests are left alone): step_bytes from
// plan::decode_step_bytes at the mean context of the run (depth + (n + 1) / 2 rows per MLA layer) with the
// expected distinct experts of r.test.batch uniform picks; bandwidth_gb_s: measured read bandwidth (> 0).
// `loaded`: the weight bytes as loaded (loaded_weight_bytes), else the config's.
void add_decode_roofline(OfflineResult& r, const ModelConfig& c, const CacheSpec& spec, double bandwidth_gb_s,
                         const plan::LoadedWeightBytes* loaded = nullptr);

// Fills r's compute-roofline fields for a pp test (tg tests are left alone): flops_per_token from
// plan::prefill_flops_per_token at the prompt's mean position (depth + n / 2), tflop_s at r's mean tok/s, against
// `peak_tflops` (> 0: the dense bf16 tensor-core rate the user gives, e.g. ~989 for an H100 / H200 SXM).
void add_prefill_roofline(OfflineResult& r, const ModelConfig& c, double peak_tflops);

// The weight bytes a decode token reads from `w` as bound (each matrix in its own format: a GGUF's blocks): every
// matrix but the token table (one row a token; a head tied to it is read whole) and the routed experts, the MLA
// layers' kv_b in the form the absorbed decode reads (a GGUF's quantised halves, else the stored kv_b), and one
// expert of each MoE layer (the layer's mean). Vectors (norms, biases, conv taps) are not counted: < 0.1%.
plan::LoadedWeightBytes loaded_weight_bytes(const ModelWeights& w);

// llama-bench's markdown table (plus GB/step, GB/s and % of the bandwidth where a decode roofline was added, and
// TFLOP/s and % of peak where a prefill one was).
std::string offline_table(const std::vector<OfflineResult>& rs, const std::string& model_name);
// The I/O table of the same tests: expert hit ratio, bytes read from storage, disk GB/s, major faults.
std::string offline_io_table(const std::vector<OfflineResult>& rs);

}  // namespace k3::bench
