// The serving engine: continuous batching over the hybrid cache. One engine thread loops
// schedule -> one batched forward -> sample -> deliver deltas; front ends submit and cancel from any
// thread. On the CPU every token's numerics are independent of batching and of prefix-cache hits (the
// model runs its batch-invariant decode forms: ModelRunner::engine_path), so outputs are the same alone,
// batched, cached or not; the GPU backend trades that for its faster prefill forms (docs/engine.md).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "k3/cache/hybrid_cache.h"
#include "k3/engine/engine_api.h"
#include "k3/engine/proposer.h"
#include "k3/engine/scheduler.h"
#include "k3/engine/speculative_config.h"
#include "k3/runtime/model_runner.h"
#include "k3/text/tokenizer.h"

namespace k3::engine {

struct BatchEngineOptions {
  cache::CacheOptions cache;
  SchedulerOptions sched;
  // Prompt + completion tokens per sequence. 0: the model's max_position_embeddings, capped by what the
  // cache can hold for one sequence. An explicit value may exceed the model's limit (a warning in
  // max_model_len_reason()), not the cache's (k3::Error).
  int64_t max_model_len = 0;
  // Speculative decoding (--speculative-config); nullopt: off. Needs a runner that supports state
  // snapshots (the CPU); the cache then keeps a second KDA state slot per running sequence.
  std::optional<SpeculativeConfig> speculative;
  // Method "draft_model": the loaded draft model (the caller owns it; it must outlive the engine).
  const ModelRunner* draft_model = nullptr;
  // Method "block_drafter": the loaded drafter (the caller owns it; it must outlive the engine).
  const drafter::BlockDrafter* block_drafter = nullptr;
  // With `speculative` set: this proposer instead of the one the method names (the caller owns it; it must
  // outlive the engine): a proposer of the embedder's, or a test's that checks what the engine hands it.
  Proposer* proposer = nullptr;
};

class BatchEngine final : public Engine {
 public:
  // The model and tokenizer must outlive the engine. Throws k3::Error if the cache budget cannot hold
  // max_num_seqs sequences. Starts the engine thread.
  BatchEngine(const ModelRunner& model, const text::Tokenizer& tok, BatchEngineOptions opt);
  ~BatchEngine() override;

  void submit(Request req, OutputCallback on_output) override;
  void cancel(const std::string& request_id) override;
  EngineStats stats() const override;
  EngineLimits limits() const override;
  void shutdown(bool drain) override;

  cache::CacheStats cache_stats() const;
  // How max_model_len was chosen, for the start-up line ("the model's max_position_embeddings", ...).
  const std::string& max_model_len_reason() const { return max_model_len_reason_; }

 private:
  void choose_max_model_len(int64_t model_max);
  void loop();
  void step();
  void propose_drafts();  // drafts for every sequence about to decode (speculative decoding)
  // Counts one verification of `drafted` drafts of which `accepted` were kept (engine thread, mu_ held).
  void count_verification_locked(int64_t drafted, int64_t accepted);
  void finish(Sequence* s, RequestOutput o);
  void update_cache_stats_locked();  // stats_ / cache_stats_ from the cache; engine thread, mu_ held

  const ModelRunner& model_;
  const text::Tokenizer& tok_;
  BatchEngineOptions opt_;
  std::string max_model_len_reason_;
  std::unique_ptr<cache::HybridCache> cache_;   // engine thread only
  std::unique_ptr<Scheduler> sched_;            // engine thread only
  std::unique_ptr<Proposer> own_proposer_;      // the method's (null with BatchEngineOptions::proposer)
  Proposer* proposer_ = nullptr;                // engine thread only; null: no speculation
  std::vector<DraftSlot> draft_slots_;          // propose_drafts' scratch
  // Taps for a proposer that reads the target's hidden states (Proposer::tap_layers): per running sequence
  // the row that produced its last token, and the token count it is for (engine thread only).
  struct TapRow {
    std::vector<float> ctx;
    size_t n_tokens = 0;
  };
  std::unordered_map<const Sequence*, TapRow> tap_rows_;
  std::vector<float> step_taps_;                // the step's taps [logits rows][T * H]
  size_t n_step_rows_ = 0;                      // logits rows of the step
  void keep_tap_row(const Sequence* s, int64_t row);  // step_taps_ row `row` becomes s's

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::unique_ptr<Sequence>> inbox_;
  std::set<std::string> cancels_;
  bool accepting_ = true, stop_ = false, drain_ = true;
  EngineStats stats_;
  cache::CacheStats cache_stats_;
  uint64_t seed_counter_;
  std::thread thread_;
};

}  // namespace k3::engine
