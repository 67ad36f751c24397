// One request inside the batching engine: its tokens (prompt + generated), its place in the cache,
// and the output side (sampler, streaming detokeniser, stop strings) that turns sampled ids into
// RequestOutput deltas.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "k3/cache/hybrid_cache.h"
#include "k3/engine/engine_api.h"
#include "k3/engine/sampler.h"
#include "k3/engine/stop_matcher.h"
#include "k3/model/config.h"
#include "k3/runtime/model_runner.h"
#include "k3/text/stream_decoder.h"
#include "k3/text/tokenizer.h"

namespace k3::engine {

class Sequence {
 public:
  Sequence(Request req, OutputCallback cb, const text::Tokenizer& tok, const ModelConfig& cfg,
           cache::HybridCache& cache, int64_t max_model_len, uint64_t default_seed);

  const Request& request() const { return req_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int64_t prompt_len() const { return n_prompt_; }
  // Tokens still to run through the model before the next token can be sampled.
  int64_t remaining() const { return static_cast<int64_t>(tokens_.size()) - cache_->n_past(); }
  cache::PagedSequence& cache() { return *cache_; }
  bool finished() const { return finished_; }
  int64_t cached_prompt_tokens() const { return cached_prompt_; }
  void set_cached_prompt_tokens(int64_t n) { cached_prompt_ = std::max(cached_prompt_, n); }
  int64_t admitted_order = 0;  // set by the scheduler; larger = admitted later

  // How the next token is to be sampled (the model runner samples it, on its device): parameters,
  // penalty lists, this request's next uniform draw; raw logits are asked for when logprobs are.
  // Valid until the next call.
  RowSample next_sample();
  // Takes the sampled token (raw: the row's raw logits when next_sample asked for them), updates the
  // text state, returns the delta. Finishes the sequence on a stop token, stop string or the length
  // budget. Throws k3::Error when sampling failed (NaN logits, ...).
  RequestOutput on_sampled(const sampling::SampleResult& r, std::span<float> raw);

  // Speculative decoding. drafts(): this step's proposed tokens (not part of tokens()). draft_room():
  // how many may be verified now (the output budget minus the token every step yields). decoding():
  // every prompt token is in the cache (speculation runs only then).
  std::vector<int32_t>& drafts() { return drafts_; }
  // Sampled under a grammar's mask: never given drafts (BatchEngine::propose_drafts).
  bool constrained() const { return matcher_ != nullptr; }
  // Fills the grammar's mask of the next token (when constrained and not yet filled since the last
  // token): BatchEngine calls it for a step's constrained sequences in parallel (distinct matchers share
  // only their compiled grammar, which xgrammar reads without locks) before next_samples() uses it.
  void prepare_mask();
  int64_t draft_room() const;
  bool decoding() const { return cache_->n_past() >= n_prompt_; }
  // The verification rows of this step: one after the last pending token, then one after each draft
  // (a plain decode step when there are none). Valid until the next call.
  std::span<const RowSample> next_samples();
  struct Verified {
    RequestOutput out;      // every token kept, as one delta
    int64_t accepted = 0;   // draft tokens confirmed (each kept token after the first equals its draft)
  };
  // Takes row j's token while it equals draft j (then row j+1's), i.e. the longest prefix of the drafts
  // the target model itself picks, plus the token after it: greedy, that is the longest matching
  // prefix + the bonus token; sampled, it is the rejection rule for a point-mass proposal (accept d
  // with probability p(d), else a draw from p without d, renormalised) -- and the very token the
  // same draw picks without speculation (docs/perf/speculative.md). Uses one PRNG draw per kept token.
  // raw: the rows' raw logits ([rows][V]) when next_samples asked for them, else empty.
  Verified on_verified(std::span<const sampling::SampleResult> results, std::span<float> raw, int64_t vocab);
  // A final delta for an aborted / failed sequence.
  RequestOutput finish_now(const std::string& reason, const std::string& error = {});
  void deliver(const RequestOutput& o) { cb_(o); }

  std::chrono::steady_clock::time_point arrival;

 private:
  RequestOutput base() const;
  void emit_text(RequestOutput& o, const std::string& text);
  void flush_text(RequestOutput& o);
  // The grammar's mask of the next token into `row` (when constrained), filled here unless prepared.
  void constrain(sampling::RowSampling& row);

  Request req_;
  OutputCallback cb_;
  const text::Tokenizer& tok_;
  std::unique_ptr<cache::PagedSequence> cache_;
  std::vector<int32_t> tokens_;
  int64_t n_prompt_ = 0, budget_ = 0, cached_prompt_ = 0;
  std::vector<int32_t> stop_ids_;
  int64_t vocab_ = 0;
  Sampler sampler_;
  std::vector<int32_t> drafts_;
  std::vector<RowSample> rows_;
  std::unique_ptr<grammar::TokenMatcher> matcher_;  // null: unconstrained
  std::vector<uint32_t> allowed_;                   // its mask of the next token
  bool mask_ready_ = false;                          // allowed_ is filled for the matcher's current state

  StopMatcher stops_;
  text::StreamDecoder detok_;
  bool finished_ = false;
};

}  // namespace k3::engine
