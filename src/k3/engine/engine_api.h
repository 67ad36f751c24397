// The interface between front ends (HTTP server, `k3 run`, benchmarks) and the serving engine.
// Front ends submit tokenised requests and receive per-step deltas through a callback; the engine
// (continuous batching over a hybrid cache) runs on its own thread and knows nothing of HTTP.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "k3/engine/sampling_params.h"
#include "k3/grammar/token_matcher.h"
#include "k3/runtime/expert_residency.h"
#include "k3/text/output_piece.h"

namespace k3::engine {

struct Request {
  std::string id;                // unique among live requests
  std::vector<int32_t> prompt;   // token ids, BOS included if wanted
  SamplingParams params;
  int top_logprobs = -1;         // -1: no logprobs; 0..20: logprob of the chosen token + this many alternatives
  bool skip_special_text = true;  // special tokens come as OutputPiece::special_id, never as text
  // Prefix-cache partition: cached prefixes are reused only between requests with the same salt
  // (vLLM's cache_salt; the server also folds the API key in). Empty: the shared partition.
  std::string cache_salt;
  // Structured outputs: every token sampled under this grammar's mask (each choice its own matcher).
  // Null: unconstrained. Constrained sequences are not speculated (their drafts would need the mask too).
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
};

// One unit of output in order (text/output_piece.h): text, or a special token output parsers act on.
using text::OutputPiece;

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // top alternatives (id, logprob), best first
};

// A delta: what one request gained in one engine step. The last delta has finished = true.
struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprob> logprobs;  // parallel to new_token_ids when requested
  std::vector<OutputPiece> pieces;
  bool finished = false;
  std::string finish_reason;  // "stop" | "length" | "abort" | "error" (with error set)
  std::string error;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
};

using OutputCallback = std::function<void(const RequestOutput&)>;

// A new field must be added to DataParallelEngine's sum too (data_parallel_engine.cpp, kSummed).
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t cache_bytes_total = 0, cache_bytes_used = 0;
  // Cache books (0 when the engine has no paged cache): pages referenced by live sequences, pages
  // held only by the prefix cache (evictable), KDA state slots of live sequences, prefix checkpoints.
  int64_t cache_pages_total = 0, cache_pages_used = 0, cache_pages_cached = 0;
  int64_t cache_slots_total = 0, cache_slots_used = 0, cache_checkpoints = 0;
  int64_t prefix_queries_tokens = 0, prefix_hit_tokens = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens_total = 0, generation_tokens_total = 0;
  // Speculative decoding (vLLM's spec_decode counters): verification steps that had drafts, draft tokens
  // proposed, draft tokens accepted, and accepted per draft position (index 0: the first draft).
  // num_speculative_tokens = 0: speculation off.
  int64_t num_speculative_tokens = 0;
  int64_t spec_num_drafts = 0, spec_num_draft_tokens = 0, spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  // Routed experts read from a file-backed mapping (runtime/expert_residency.h); nullopt otherwise.
  std::optional<ExpertCacheStats> expert_cache;
};

struct EngineLimits {
  int64_t max_model_len = 0;       // longest prompt + completion one sequence can ever hold
  int64_t max_num_seqs = 0;
  int64_t vocab_size = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Thread-safe. Throws k3::Error (before queueing) when the request can never be served, e.g. a
  // prompt longer than the cache can hold; the message states the limit. `on_output` runs on the
  // engine thread and must not block.
  virtual void submit(Request req, OutputCallback on_output) = 0;
  // Thread-safe; unknown ids are ignored. The request's pages and slots are freed at the next step
  // and a final output with finish_reason "abort" is delivered.
  virtual void cancel(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
  virtual EngineLimits limits() const = 0;
  // Stops accepting requests; drain = finish in-flight requests first, else abort them. Blocks.
  virtual void shutdown(bool drain) = 0;
};

}  // namespace k3::engine
