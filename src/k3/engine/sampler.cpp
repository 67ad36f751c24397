#include "k3/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "k3/core/error.h"

namespace k3::engine {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_ids(std::span<const int32_t> ids, size_t vocab, const char* what) {
  for (int32_t t : ids)
    if (t < 0 || static_cast<size_t>(t) >= vocab)
      throw k3::Error(std::string("Sampler: ") + what + " token id " + std::to_string(t) +
                      " is outside the vocab [0, " + std::to_string(vocab) + ")");
}

// log(sum(exp(l))) in double; throws on NaN / empty / all -inf.
double log_sum_exp(std::span<const float> logits, const char* who) {
  if (logits.empty()) throw k3::Error(std::string(who) + ": empty logits");
  float m = kNegInf;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]))
      throw k3::Error(std::string(who) + ": NaN logit at id " + std::to_string(i));
    m = std::max(m, logits[i]);
  }
  if (m == kNegInf) throw k3::Error(std::string(who) + ": all logits are -inf");
  if (std::isinf(m)) throw k3::Error(std::string(who) + ": +inf logit");
  double s = 0.0;
  for (float l : logits) s += std::exp(static_cast<double>(l) - m);
  return m + std::log(s);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, uint64_t default_seed_if_none)
    : params_(params), rng_(params.seed.value_or(default_seed_if_none)) {
  params_.validate();
}

double Sampler::uniform01() {
  // Not std::uniform_real_distribution: its algorithm is implementation-defined, whereas
  // mt19937_64's output sequence is fixed by the standard, so this is portable bit-for-bit.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

double Sampler::peek_draw(size_t j) {
  while (pending_draws_.size() <= j) pending_draws_.push_back(uniform01());
  return pending_draws_[j];
}

void Sampler::consume_draws(int64_t n) {
  if (params_.temperature == 0.0f) return;  // greedy rows draw nothing
  for (int64_t i = 0; i < n; ++i) {
    if (pending_draws_.empty())
      uniform01();
    else
      pending_draws_.pop_front();
  }
}

void Sampler::build_penalty_lists(std::span<const int32_t> prompt_tokens, std::span<const int32_t> generated_tokens,
                                  std::span<const int32_t> extra_generated, size_t vocab, PenaltyLists& out) {
  out.rep_ids.clear();
  out.cnt_ids.clear();
  out.cnt.clear();
  const bool rep = params_.repetition_penalty != 1.0f;
  const bool openai = params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  if (!rep && !openai) return;
  check_ids(generated_tokens, vocab, "generated");
  check_ids(extra_generated, vocab, "draft");
  if (marks_.size() != vocab) marks_.assign(vocab, 0);
  if (rep) {
    check_ids(prompt_tokens, vocab, "prompt");
    for (auto span : {prompt_tokens, generated_tokens, extra_generated})
      for (int32_t t : span)
        if (!marks_[static_cast<size_t>(t)]) {
          marks_[static_cast<size_t>(t)] = 1;
          out.rep_ids.push_back(t);
        }
    for (int32_t t : out.rep_ids) marks_[static_cast<size_t>(t)] = 0;
  }
  if (openai) {
    for (auto span : {generated_tokens, extra_generated})
      for (int32_t t : span)
        if (marks_[static_cast<size_t>(t)]++ == 0) out.cnt_ids.push_back(t);
    for (int32_t t : out.cnt_ids) {
      out.cnt.push_back(static_cast<int32_t>(marks_[static_cast<size_t>(t)]));
      marks_[static_cast<size_t>(t)] = 0;
    }
  }
}

sampling::RowSampling Sampler::row_of(const PenaltyLists& lists, int64_t n_tokenizable, double u) const {
  sampling::RowSampling r;
  r.temperature = params_.temperature;
  r.top_k = params_.top_k;
  r.top_p = params_.top_p;
  r.min_p = params_.min_p;
  r.repetition_penalty = params_.repetition_penalty;
  r.presence_penalty = params_.presence_penalty;
  r.frequency_penalty = params_.frequency_penalty;
  r.repetition_ids = lists.rep_ids;
  r.counted_ids = lists.cnt_ids;
  r.counts = lists.cnt;
  r.n_tokenizable = n_tokenizable;
  r.bias_ids = params_.logit_bias_ids;
  r.bias_values = params_.logit_bias_values;
  r.u = u;
  return r;
}

sampling::RowSampling Sampler::next_row(std::span<const int32_t> prompt_tokens,
                                        std::span<const int32_t> generated_tokens, int64_t vocab,
                                        int64_t n_tokenizable) {
  if (lists_.empty()) lists_.resize(1);
  build_penalty_lists(prompt_tokens, generated_tokens, {}, static_cast<size_t>(vocab), lists_[0]);
  const bool greedy = params_.temperature == 0.0f;
  double u = 0.0;
  if (!greedy) {
    u = peek_draw(0);
    consume_draws(1);
  }
  return row_of(lists_[0], n_tokenizable, u);
}

std::span<const sampling::RowSampling> Sampler::next_rows(std::span<const int32_t> prompt_tokens,
                                                          std::span<const int32_t> generated_tokens,
                                                          std::span<const int32_t> drafts, int64_t vocab,
                                                          int64_t n_tokenizable) {
  const size_t n = drafts.size() + 1;
  if (lists_.size() < n) lists_.resize(n);
  rows_.clear();
  const bool greedy = params_.temperature == 0.0f;
  for (size_t j = 0; j < n; ++j) {
    build_penalty_lists(prompt_tokens, generated_tokens, drafts.first(j), static_cast<size_t>(vocab), lists_[j]);
    rows_.push_back(row_of(lists_[j], n_tokenizable, greedy ? 0.0 : peek_draw(j)));
  }
  return rows_;
}

int32_t Sampler::token_or_throw(const sampling::SampleResult& r) {
  if (r.status != sampling::SampleStatus::Ok) throw k3::Error("Sampler: " + sampling::describe(r));
  return r.token;
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                        std::span<const int32_t> generated_tokens) {
  const size_t V = logits.size();
  if (V == 0) throw k3::Error("Sampler: empty logits");
  if (V > static_cast<size_t>(std::numeric_limits<int32_t>::max())) throw k3::Error("Sampler: vocab too large");
  const auto n = static_cast<int64_t>(V);
  return token_or_throw(sampling::sample_row(logits, next_row(prompt_tokens, generated_tokens, n, n)));
}

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> generated_tokens, const SamplingParams& p) {
  SamplingParams q = p;
  q.temperature = 0.0f;  // no draw consumed; only the penalty lists are wanted
  Sampler s(q, 0);
  const auto n = static_cast<int64_t>(logits.size());
  token_or_throw(sampling::apply_penalties(logits, s.next_row(prompt_tokens, generated_tokens, n, n)));
}

std::vector<std::pair<int32_t, float>> Sampler::top_logprobs(std::span<const float> logits, int n) {
  const double lse = log_sum_exp(logits, "Sampler::top_logprobs");
  const size_t k = n <= 0 ? 0 : std::min(static_cast<size_t>(n), logits.size());
  std::vector<std::pair<int32_t, float>> out;
  if (k == 0) return out;
  std::vector<int32_t> idx(logits.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  out.reserve(k);
  for (size_t j = 0; j < k; ++j)
    out.emplace_back(idx[j], static_cast<float>(static_cast<double>(logits[idx[j]]) - lse));
  return out;
}

float Sampler::logprob_of(std::span<const float> logits, int32_t id) {
  if (id < 0 || static_cast<size_t>(id) >= logits.size())
    throw k3::Error("Sampler::logprob_of: token id " + std::to_string(id) + " is outside the vocab [0, " +
                    std::to_string(logits.size()) + ")");
  const double lse = log_sum_exp(logits, "Sampler::logprob_of");
  return static_cast<float>(static_cast<double>(logits[id]) - lse);
}

}  // namespace k3::engine
