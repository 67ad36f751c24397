// Token sampler of one request: its parameters, its PRNG stream and its penalty bookkeeping; the
// algorithm itself (penalties -> greedy | temperature -> top-k -> top-p -> min-p -> draw) is
// sampling/token_sampling.h, shared with the GPU kernel.
// Conventions follow vLLM / OpenAI; see docs/sampling.md for the exact rules and differences.
#pragma once
#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "k3/engine/sampling_params.h"
#include "k3/sampling/token_sampling.h"

namespace k3::engine {

// One Sampler per request (it owns the request's PRNG stream). Not thread-safe; different
// requests' samplers are independent, so the drawn tokens depend only on the seed and on the
// sequence of logits passed to sample(), never on threads or timing.
// Sets logits[id] = -inf for every id >= n_tokenizable: ids of a model vocabulary padded past the
// tokenizer's (the model can score them, nothing can render them) are never sampled.
inline void mask_untokenizable(std::span<float> logits, int64_t n_tokenizable) {
  for (size_t i = static_cast<size_t>(n_tokenizable > 0 ? n_tokenizable : 0); i < logits.size(); ++i)
    logits[i] = -std::numeric_limits<float>::infinity();
}

class Sampler {
 public:
  // Validates `params` (throws k3::Error). The PRNG is seeded with params.seed if set, else with
  // default_seed_if_none.
  Sampler(const SamplingParams& params, uint64_t default_seed_if_none);

  // Describes the next token's sampling as a sampling::RowSampling (what the model runner's
  // forward_sample takes): the parameters, the penalty lists of prompt/generated (held by this
  // Sampler until the next call) and the uniform draw. Consumes one PRNG draw unless greedy.
  // `vocab`: the model's vocabulary size (penalty ids are checked against it; throws k3::Error).
  sampling::RowSampling next_row(std::span<const int32_t> prompt_tokens, std::span<const int32_t> generated_tokens,
                                 int64_t vocab, int64_t n_tokenizable);

  // Speculative verification: the rows that pick the next token and the one after each draft token,
  // row j as next_row would describe it after drafts[0..j) were generated (penalties count them), with
  // the j-th uniform draw from now. The draws are only looked at: consume_draws(m) takes the m used by
  // the m tokens actually kept, so the PRNG stream -- and with it every seeded output -- is the same
  // with speculation on or off. Rows are valid until the next call.
  std::span<const sampling::RowSampling> next_rows(std::span<const int32_t> prompt_tokens,
                                                   std::span<const int32_t> generated_tokens,
                                                   std::span<const int32_t> drafts, int64_t vocab,
                                                   int64_t n_tokenizable);
  void consume_draws(int64_t n);

  // Picks the next token on the host: next_row() + sampling::sample_row(). `logits` (one per vocab
  // id) is modified in place: on return it holds the penalised logits (greedy) or the processed ones,
  // (l - max)/T with -inf for every token filtered out by top-k / top-p / min-p. Token ids in
  // prompt/generated must be in [0, V). Throws k3::Error on an empty vocab, NaN or +inf logits, or all
  // logits -inf.
  int32_t sample(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                 std::span<const int32_t> generated_tokens);

  // Throws k3::Error("Sampler: ...") unless r is Ok; returns the token.
  static int32_t token_or_throw(const sampling::SampleResult& r);

  // Applies only the penalties of `p` to `logits`, in place (no-op when all are neutral):
  //   repetition (HF/CTRL): for every distinct id in prompt ∪ generated:
  //                         l = l > 0 ? l / r : l * r
  //   then OpenAI, over generated tokens only, with c = count of the id in generated:
  //                         l -= frequency * c + presence * (c > 0)
  static void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> generated_tokens, const SamplingParams& p);

  // Log-softmax of the raw logits, the n most likely ids (ties: lower id first), descending.
  static std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int n);
  // Log-softmax of the raw logits at `id`.
  static float logprob_of(std::span<const float> logits, int32_t id);

  const SamplingParams& params() const { return params_; }

 private:
  struct PenaltyLists {
    std::vector<int32_t> rep_ids, cnt_ids, cnt;
  };
  // The penalty lists of `params_` for prompt/generated + extra (drafts treated as generated).
  void build_penalty_lists(std::span<const int32_t> prompt_tokens, std::span<const int32_t> generated_tokens,
                           std::span<const int32_t> extra_generated, size_t vocab, PenaltyLists& out);
  sampling::RowSampling row_of(const PenaltyLists& lists, int64_t n_tokenizable, double u) const;
  double uniform01();      // [0, 1) with 53 random bits, straight from the stream
  double peek_draw(size_t j);  // the j-th draw from now (drawn ahead into pending_draws_)

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::deque<double> pending_draws_;  // drawn by peek_draw, not yet consumed
  std::vector<PenaltyLists> lists_;   // one per row of the last next_row / next_rows
  std::vector<sampling::RowSampling> rows_;
  std::vector<uint32_t> marks_;  // per-id scratch, kept all-zero between calls
};

}  // namespace k3::engine
