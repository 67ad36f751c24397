// The interface every backend's model implements: what the engine, the CLI and the benchmarks need
// from "a loaded model on some device". The CPU `Model` (model.h) and the CUDA `cuda::CudaModel`
// (backend/cuda/cuda_model.h) are the two implementations; callers never see which one they hold.
#pragma once
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "k3/model/config.h"
#include "k3/runtime/cache_memory.h"
#include "k3/runtime/cache_spec.h"
#include "k3/runtime/expert_residency.h"
#include "k3/runtime/sequence_cache.h"
#include "k3/sampling/token_sampling.h"

namespace k3 {

// Which form the attention layers use. Auto: prefill form for n > 1 tokens, decode form for n == 1.
// Decode forms everywhere make every token's result independent of batching and of how a prompt is
// split into chunks (the CPU serving engine relies on it: batch-invariant, prefix-cache-invariant).
enum class AttnPath { Auto, Prefill /*chunked KDA + MHA MLA*/, Decode /*KDA recurrence + absorbed MLA*/ };

struct ForwardOptions {
  AttnPath path = AttnPath::Auto;
  int kda_chunk = 0;  // KDA chunk of the prefill form; 0: the backend's choice (CPU 64, CUDA 32: fastest on an H200)
  bool all_logits = false;  // logits for every token ([n][V]) or only the last ([V])
  // Taps: hidden vectors of the target that a block drafter reads (docs/block-drafter.md). With tap_layers
  // non-empty, *taps is resized to [logits rows][T * H] (T = tap_layers.size(), rows in the order of the
  // logits) and gets, for each logits row, the vectors of tap_layers concatenated: tap id l < num_layers is
  // layer l's normed mixer input, l == num_layers the final-normed hidden state (lm_head's input). Needs
  // ModelRunner::supports_taps(); an id out of [0, num_layers] is a k3::Error.
  std::span<const int32_t> tap_layers;
  std::vector<float>* taps = nullptr;
};

// One sequence's part of a batched forward.
struct BatchItem {
  std::span<const int32_t> tokens;
  SequenceCache* cache = nullptr;  // from this runner's new_cache() or a cache over its cache_memory()
  bool want_logits = true;         // last-token logits (or all tokens' with ForwardOptions::all_logits)
  // With want_logits: the logits of the last n_logit_rows tokens (speculative verification scores the
  // pending token and every draft token in one pass); 1..tokens.size().
  int64_t n_logit_rows = 1;
  // > 0: the KDA state (recurrent + conv tails) after the first snapshot_after + j of the tokens is saved
  // into cache->kda_snapshot(., j) for j < n_snapshots, so that draft tokens after them can be rolled back
  // exactly (snapshot_after + n_snapshots <= tokens.size(); needs ModelRunner::supports_state_snapshots
  // and a cache that keeps that many snapshots).
  int64_t snapshot_after = 0, n_snapshots = 1;
};

// The logits rows an item yields in forward_batch / forward_sample.
int64_t logit_rows_of(const BatchItem& item, const ForwardOptions& opt);

// How one logits row of forward_sample becomes a token.
struct RowSample {
  sampling::RowSampling sampling;
  bool raw_logits = false;  // also return the row's raw logits (before penalties and masking): logprobs
};

// Throws k3::Error unless the item has tokens, every id in [0, vocab) (what every runner's forward checks).
void check_batch_tokens(const BatchItem& item, int64_t vocab);
// Whether n new tokens of one sequence take the prefill forms (chunked KDA, MHA MLA) under `path`.
inline bool takes_prefill_form(AttnPath path, int64_t n) {
  return path == AttnPath::Prefill || (path == AttnPath::Auto && n > 1);
}

// Throws k3::Error unless every tap id is in [0, num_layers] and, with tap ids, `opt.taps` is set.
void check_tap_layers(const ForwardOptions& opt, int64_t num_layers);
// A forward's taps as the graph leaves them, tap-major ([T][R][H]: tap t's rows at t * R), into the rows of
// ForwardOptions::taps ([R][T * H]).
void taps_to_rows(const float* tap_major, int64_t T, int64_t R, int64_t H, std::vector<float>& out);

// Throws k3::Error unless forward_sample's arguments fit: logit_rows_of rows per item, no all_logits.
void check_forward_sample_args(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                               const ForwardOptions& opt);

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  virtual const ModelConfig& config() const = 0;
  // The cache this runner reads and writes (dtypes chosen at load: --kv-cache-dtype,
  // --mamba-ssm-cache-dtype). Caches handed to forward_batch must have this spec.
  virtual const CacheSpec& cache_spec() const = 0;
  // "cpu", or e.g. "cuda:0 (NVIDIA H200)".
  virtual std::string device_name() const = 0;
  // A fresh, empty per-sequence cache in this runner's memory (CLI verbs, tests, offline benchmarks).
  virtual std::unique_ptr<SequenceCache> new_cache() const = 0;
  // Where the serving cache manager places its pages and state slots (host or device memory).
  virtual std::shared_ptr<CacheMemory> cache_memory() const = 0;
  // Bytes of memory the caches could still take: physical RAM on the CPU, free device memory on a GPU
  // (after the weights); a fractional --cache-memory is a share of it.
  virtual int64_t memory_available() const = 0;
  // Routed-expert residency counters (hit rate, prefetch, pinned set, process disk reads) where the runner
  // reads experts from a file-backed mapping (runtime/expert_residency.h); nullopt otherwise.
  virtual std::optional<ExpertCacheStats> expert_cache_stats() const { return std::nullopt; }
  // Sizes the runner's scratch for the largest step the engine will schedule (max_tokens tokens), the
  // way vLLM's start-up profile run does, so that the first request pays no allocation or library
  // warm-up and a fractional --cache-memory is taken from what is left. Default: nothing to size.
  virtual void warm_up(int64_t max_tokens) const { (void)max_tokens; }
  // The attention forms the serving engine asks for. The CPU backend is batch-invariant only in the
  // decode forms, so its engine runs prompts through them too (Decode); a backend whose numerics depend
  // on the batch anyway (the GPU: GEMV vs tensor-core GEMM) takes the faster prefill forms (Auto).
  virtual AttnPath engine_path() const { return AttnPath::Decode; }
  // Whether forward_batch honours BatchItem::snapshot_after (speculative decoding's exact rollback).
  virtual bool supports_state_snapshots() const { return false; }
  // Whether forward_batch / forward_sample honour ForwardOptions::tap_layers (a block drafter's inputs).
  virtual bool supports_taps() const { return false; }

  // One forward over several sequences, each appending its tokens. `logits` (host) receives, for each
  // item with want_logits in order, its last-token row [V] (or all its rows with all_logits).
  virtual void forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                             const ForwardOptions& opt = {}) const = 0;

  // The forward pass and the choice of each row's next token: rows[j] (one per want_logits item, in
  // order; ForwardOptions::all_logits is not allowed) says how row j is sampled, results[j] gets its
  // token or error status (sampling::sample_row semantics, bit for bit); an item with n_logit_rows > 1
  // takes that many consecutive rows. Only rows with raw_logits
  // copy their logits into `raw_logits` ([V] each, in order). The default samples on the host after
  // forward_batch; a GPU backend samples on the device, so only the ids cross to the host.
  virtual void forward_sample(const std::vector<BatchItem>& items, std::span<const RowSample> rows,
                              std::vector<sampling::SampleResult>& results, std::vector<float>& raw_logits,
                              const ForwardOptions& opt = {}) const;

  // Runs `tokens` after the sequence's past; resizes `logits` to [n][V] or [V].
  void forward(std::span<const int32_t> tokens, SequenceCache& st, std::vector<float>& logits,
               const ForwardOptions& opt = {}) const {
    forward_batch({BatchItem{tokens, &st, true}}, logits, opt);
  }
};

}  // namespace k3
