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

void Sampler::apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> generated_tokens, const SamplingParams& p) {
  Scratch s;
  apply_penalties_impl(logits, prompt_tokens, generated_tokens, p, s);
}

void Sampler::apply_penalties_impl(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                                   std::span<const int32_t> generated_tokens,
                                   const SamplingParams& p, Scratch& s) {
  const bool rep = p.repetition_penalty != 1.0f;
  const bool openai = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (!rep && !openai) return;
  const size_t V = logits.size();
  check_ids(generated_tokens, V, "generated");
  if (rep) {
    check_ids(prompt_tokens, V, "prompt");
    if (s.seen.size() != V) s.seen.assign(V, 0);
    const float r = p.repetition_penalty;
    auto penalise = [&](int32_t t) {
      if (s.seen[t]) return;
      s.seen[t] = 1;
      float& l = logits[t];
      l = l > 0.0f ? l / r : l * r;
    };
    for (int32_t t : prompt_tokens) penalise(t);
    for (int32_t t : generated_tokens) penalise(t);
    for (int32_t t : prompt_tokens) s.seen[t] = 0;
    for (int32_t t : generated_tokens) s.seen[t] = 0;
  }
  if (openai) {
    if (s.counts.size() != V) s.counts.assign(V, 0);
    for (int32_t t : generated_tokens) ++s.counts[t];
    for (int32_t t : generated_tokens) {
      const uint32_t c = s.counts[t];
      if (c == 0) continue;  // already applied for this id
      logits[t] -= p.frequency_penalty * static_cast<float>(c) + p.presence_penalty;
      s.counts[t] = 0;
    }
  }
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                        std::span<const int32_t> generated_tokens) {
  const size_t V = logits.size();
  if (V == 0) throw k3::Error("Sampler: empty logits");
  if (V > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw k3::Error("Sampler: vocab too large");
  apply_penalties_impl(logits, prompt_tokens, generated_tokens, params_, scratch_);

  // Max / argmax (first maximum => ties go to the lowest id), rejecting NaN and +inf.
  float lmax = kNegInf;
  int32_t arg = -1;
  for (size_t i = 0; i < V; ++i) {
    const float l = logits[i];
    if (std::isnan(l)) throw k3::Error("Sampler: NaN logit at id " + std::to_string(i));
    if (l > lmax) {
      lmax = l;
      arg = static_cast<int32_t>(i);
    }
  }
  if (arg < 0) throw k3::Error("Sampler: all logits are -inf");
  if (std::isinf(lmax)) throw k3::Error("Sampler: +inf logit at id " + std::to_string(arg));
  if (params_.temperature == 0.0f) return arg;

  const float T = params_.temperature;
  const float min_w = params_.min_p;  // weights are exp((l - max)/T), so the max weight is 1
  const bool use_top_k = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < V;
  const bool use_top_p = params_.top_p < 1.0f;

  // Fast path: no truncation by rank, one O(V) pass, draw scanning ids in order.
  if (!use_top_k && !use_top_p) {
    w_.resize(V);
    double Z = 0.0;
    for (size_t i = 0; i < V; ++i) {
      float s = (logits[i] - lmax) / T;  // <= 0; stable for tiny T (underflows to -inf / weight 0)
      float w = std::exp(s);
      if (w < min_w) {
        w = 0.0f;
        s = kNegInf;
      }
      logits[i] = s;
      w_[i] = w;
      Z += w;
    }
    const double u = uniform01() * Z;
    double cum = 0.0;
    int32_t last = arg;
    for (size_t i = 0; i < V; ++i) {
      if (w_[i] == 0.0f) continue;
      cum += w_[i];
      last = static_cast<int32_t>(i);
      if (cum > u) return last;
    }
    return last;  // rounding at the very top of [0, Z)
  }

  // General path: candidate list idx_, in id order after top-k.
  idx_.clear();
  if (use_top_k) {
    const size_t k = static_cast<size_t>(params_.top_k);
    idx_.resize(V);
    std::iota(idx_.begin(), idx_.end(), 0);
    std::nth_element(idx_.begin(), idx_.begin() + (k - 1), idx_.end(), [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    const float kth = logits[idx_[k - 1]];
    idx_.clear();
    for (size_t i = 0; i < V; ++i) {
      if (logits[i] >= kth && logits[i] != kNegInf) {  // ties with the k-th are kept (HF/vLLM)
        logits[i] = (logits[i] - lmax) / T;
        idx_.push_back(static_cast<int32_t>(i));
      } else {
        logits[i] = kNegInf;
      }
    }
  } else {
    for (size_t i = 0; i < V; ++i) {
      if (logits[i] != kNegInf) {
        logits[i] = (logits[i] - lmax) / T;
        idx_.push_back(static_cast<int32_t>(i));
      }
    }
  }

  if (use_top_p) {
    double Z = 0.0;
    for (int32_t t : idx_) Z += std::exp(logits[t]);
    const double target = static_cast<double>(params_.top_p) * Z;
    auto by_prob = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    // Sort only as much of the head as needed: partial_sort a growing prefix (64, 256, ...);
    // the elements past a sorted prefix are never larger than it, so prefixes extend cleanly.
    const size_t n = idx_.size();
    size_t sorted = 0, keep = n, end = std::min<size_t>(n, 64);
    double cum = 0.0;
    for (bool done = false; !done;) {
      std::partial_sort(idx_.begin() + sorted, idx_.begin() + end, idx_.end(), by_prob);
      for (size_t j = sorted; j < end; ++j) {
        cum += std::exp(logits[idx_[j]]);
        if (cum >= target) {  // smallest prefix with cumulative prob >= top_p (>= 1 token)
          keep = j + 1;
          done = true;
          break;
        }
      }
      sorted = end;
      if (sorted == n) done = true;
      end = std::min(n, end * 4);
    }
    for (size_t j = keep; j < n; ++j) logits[idx_[j]] = kNegInf;
    idx_.resize(keep);
  }

  // min-p and the weights of the survivors. The most likely token (weight 1) always survives.
  w_.resize(idx_.size());
  size_t m = 0;
  double Z = 0.0;
  for (int32_t t : idx_) {
    const float w = std::exp(logits[t]);
    if (w < min_w || w == 0.0f) {
      logits[t] = kNegInf;
      continue;
    }
    idx_[m] = t;
    w_[m] = w;
    ++m;
    Z += w;
  }
  idx_.resize(m);
  if (m == 0) return arg;  // unreachable: the argmax has weight exactly 1
  const double u = uniform01() * Z;
  double cum = 0.0;
  for (size_t j = 0; j < m; ++j) {
    cum += w_[j];
    if (cum > u) return idx_[j];
  }
  return idx_[m - 1];
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
