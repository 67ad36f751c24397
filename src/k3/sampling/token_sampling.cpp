#include "k3/sampling/token_sampling.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <vector>

#include <immintrin.h>

#include "k3/core/thread_pool.h"

namespace k3::sampling {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct MaxOf {
  float value;
  int32_t arg;     // first index holding the maximum; -1 when every value is -inf
  int32_t nan_at;  // first NaN's index; -1 when none
};

// The scalar definition: the first i with x[i] > every earlier value (from -inf), stopping at a NaN.
MaxOf first_max_scalar(std::span<const float> x, int64_t from, float lmax, int32_t arg) {
  for (int64_t i = from; i < static_cast<int64_t>(x.size()); ++i) {
    const float l = x[static_cast<size_t>(i)];
    if (std::isnan(l)) return {lmax, arg, static_cast<int32_t>(i)};
    if (l > lmax) {
      lmax = l;
      arg = static_cast<int32_t>(i);
    }
  }
  return {lmax, arg, -1};
}

// first_max_scalar's result, eight lanes at a time: the maximum and "any NaN" in one pass, then the first
// index equal to the maximum (the first maximum is the first index holding its value); a row with a NaN
// is rescanned by the scalar loop for the first NaN's index. A 163840-id greedy row: ~260 us scalar (the
// NaN branch keeps the loop from vectorising) for a CPU decode step of a few ms.
MaxOf first_max(std::span<const float> x) {
  const int64_t n = static_cast<int64_t>(x.size()), n8 = n / 8 * 8;
  __m256 vmax = _mm256_set1_ps(kNegInf), unord = _mm256_setzero_ps();
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(x.data() + i);
    unord = _mm256_or_ps(unord, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    vmax = _mm256_max_ps(vmax, v);
  }
  if (_mm256_movemask_ps(unord) != 0) return first_max_scalar(x, 0, kNegInf, -1);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  float m = kNegInf;
  for (float l : lanes) m = std::max(m, l);
  const MaxOf tail = first_max_scalar(x, n8, m, -1);  // the tail may hold a NaN or a larger value
  if (tail.nan_at >= 0) return first_max_scalar(x, 0, kNegInf, -1);
  if (tail.arg >= 0) return tail;  // strictly larger than everything before: the first maximum
  if (m == kNegInf) return {m, -1, -1};
  const __m256 vm = _mm256_set1_ps(m);
  for (int64_t i = 0; i < n8; i += 8) {
    const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x.data() + i), vm, _CMP_EQ_OQ));
    if (mask != 0) {
      const int64_t at = i + std::countr_zero(static_cast<unsigned>(mask));
      return {x[static_cast<size_t>(at)], static_cast<int32_t>(at), -1};  // its own value (a zero keeps its sign)
    }
  }
  return {m, -1, -1};  // not reached: m is one of the first n8 values
}
}  // namespace

int fixed_point_bits(int64_t vocab) {
  int lg = 0;  // ceil(log2(vocab))
  while ((int64_t{1} << lg) < std::max<int64_t>(vocab, 1)) ++lg;
  return std::min(52, 62 - lg);
}

float weight_of(float l, float lmax, float T) {
  const float s = (l - lmax) / T;
  return static_cast<float>(std::exp(static_cast<double>(s)));
}

uint64_t top_p_target(float top_p, uint64_t Z) {
  const double t = std::ceil(static_cast<double>(top_p) * static_cast<double>(Z));
  if (!(t >= 1.0)) return 1;
  if (t >= static_cast<double>(Z)) return Z;
  return static_cast<uint64_t>(t);
}

uint64_t draw_position(double u, uint64_t Z) {
  if (Z == 0) return 0;
  const double r = std::floor(u * static_cast<double>(Z));
  if (!(r >= 0.0)) return 0;
  if (r >= static_cast<double>(Z)) return Z - 1;
  return std::min(static_cast<uint64_t>(r), Z - 1);
}

std::string describe(const SampleResult& r) {
  switch (r.status) {
    case SampleStatus::Ok: return "ok";
    case SampleStatus::NaN: return "NaN logit at id " + std::to_string(r.at);
    case SampleStatus::PosInf: return "+inf logit at id " + std::to_string(r.at);
    case SampleStatus::AllMasked: return "all logits are -inf";
    case SampleStatus::BadId: return "penalty / logit_bias token id " + std::to_string(r.at) + " is outside the vocab";
  }
  return "unknown sampling status";
}

// This file is compiled with -ffp-contract=off: `frequency * c + presence` must round twice, as the
// kernel's __fmul_rn/__fadd_rn do, whatever -march the host build uses.
SampleResult apply_penalties(std::span<float> logits, const RowSampling& r) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (r.repetition_penalty != 1.0f) {
    const float p = r.repetition_penalty;
    for (int32_t t : r.repetition_ids) {
      if (t < 0 || t >= V) return {-1, SampleStatus::BadId, t};
      float& l = logits[static_cast<size_t>(t)];
      l = l > 0.0f ? l / p : l * p;
    }
  }
  if (r.presence_penalty != 0.0f || r.frequency_penalty != 0.0f) {
    for (size_t j = 0; j < r.counted_ids.size(); ++j) {
      const int32_t t = r.counted_ids[j];
      if (t < 0 || t >= V) return {-1, SampleStatus::BadId, t};
      logits[static_cast<size_t>(t)] -= r.frequency_penalty * static_cast<float>(r.counts[j]) + r.presence_penalty;
    }
  }
  return {};
}

SampleResult apply_bias_and_mask(std::span<float> logits, const RowSampling& r) {
  const int64_t V = static_cast<int64_t>(logits.size());
  const size_t nb = std::min(r.bias_ids.size(), r.bias_values.size());
  for (size_t j = 0; j < nb; ++j) {
    const int32_t t = r.bias_ids[j];
    if (t < 0 || t >= V) return {-1, SampleStatus::BadId, t};
    logits[static_cast<size_t>(t)] += r.bias_values[j];
  }
  if (!r.allowed.empty()) {
    const int64_t covered = std::min<int64_t>(V, static_cast<int64_t>(r.allowed.size()) * 32);
    for (int64_t w = 0; w * 32 < covered; ++w) {
      const uint32_t bits = r.allowed[static_cast<size_t>(w)];
      if (bits == 0xFFFFFFFFu) continue;
      const int64_t end = std::min<int64_t>(covered, w * 32 + 32);
      for (int64_t i = w * 32; i < end; ++i)
        if (!((bits >> (i - w * 32)) & 1u)) logits[static_cast<size_t>(i)] = kNegInf;
    }
    for (int64_t i = covered; i < V; ++i) logits[static_cast<size_t>(i)] = kNegInf;
  }
  return {};
}

SampleResult sample_row(std::span<float> logits, const RowSampling& r) {
  const int64_t V = static_cast<int64_t>(logits.size());
  SampleResult res;
  if (V == 0) {
    res.status = SampleStatus::AllMasked;
    return res;
  }
  // 0. logit_bias and the grammar's mask; 1. penalties (-inf stays -inf under both).
  if (const SampleResult b = apply_bias_and_mask(logits, r); b.status != SampleStatus::Ok) return b;
  if (const SampleResult p = apply_penalties(logits, r); p.status != SampleStatus::Ok) return p;
  // 2. Ids nothing can render.
  for (int64_t i = std::max<int64_t>(r.n_tokenizable, 0); i < V; ++i) logits[static_cast<size_t>(i)] = kNegInf;
  // 3. Max / argmax (first maximum), rejecting NaN and +inf.
  const auto [lmax, arg, nan_at] = first_max(logits);
  if (nan_at >= 0) return {-1, SampleStatus::NaN, nan_at};
  if (arg < 0) return {-1, SampleStatus::AllMasked, -1};
  if (std::isinf(lmax)) return {-1, SampleStatus::PosInf, arg};
  if (r.greedy()) return {arg, SampleStatus::Ok, -1};

  // 4. Top-k: the k-th largest penalised logit over the whole row; ties with it are kept.
  const bool top_k = r.top_k > 0 && r.top_k < V;
  float kth = kNegInf;
  if (top_k) {
    // Counts per bucket of an order-preserving key (sign, exponent, 3 mantissa bits) locate the bucket
    // holding the k-th largest; nth_element runs over that bucket only. O(V).
    auto bucket = [](float x) {
      const uint32_t b = std::bit_cast<uint32_t>(x);
      return ((b & 0x80000000u) ? ~b : (b | 0x80000000u)) >> 20;
    };
    std::vector<uint32_t> count(4096, 0);
    for (int64_t i = 0; i < V; ++i) ++count[bucket(logits[static_cast<size_t>(i)])];
    int64_t need = r.top_k;
    uint32_t cut = 4095;
    for (; cut > 0; --cut) {
      if (count[cut] >= static_cast<uint64_t>(need)) break;
      need -= count[cut];
    }
    std::vector<float> in_cut;
    for (int64_t i = 0; i < V; ++i)
      if (bucket(logits[static_cast<size_t>(i)]) == cut) in_cut.push_back(logits[static_cast<size_t>(i)]);
    std::nth_element(in_cut.begin(), in_cut.begin() + (need - 1), in_cut.end(), std::greater<float>());
    kth = in_cut[static_cast<size_t>(need - 1)];
  }
  // 5. Weights. Filtered ids get w = 0 (and logit -inf on return).
  const int B = fixed_point_bits(V);
  const float T = r.temperature;
  // Below this s, exp(s) < 2^-(B+1): the fixed-point weight is 0 and the id can never survive, so the
  // exp is skipped (a shortcut only: the result is the same without it).
  const float s_floor = -static_cast<float>(B + 1) * 0.6931472f;
  std::vector<float> w(static_cast<size_t>(V));
  auto weigh = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float& l = logits[static_cast<size_t>(i)];
      if (l == kNegInf || (top_k && !(l >= kth)) || (l - lmax) / T < s_floor) {
        w[static_cast<size_t>(i)] = 0.0f;
        l = kNegInf;
        continue;
      }
      w[static_cast<size_t>(i)] = weight_of(l, lmax, T);
      l = (l - lmax) / T;
    }
  };
  // The exps dominate a sampled row (~1.4 ms at V = 163840 on one core): split large rows over the pool
  // (inline when the caller already runs inside it, e.g. one row per task). Every id's work is independent.
  if (V >= 32768)
    ThreadPool::global().parallel_for(V, 16384, [&](int64_t b, int64_t e, int) { weigh(b, e); });
  else
    weigh(0, V);
  // 6. Top-p: keep the smallest prefix, in (w desc, id asc) order, whose mass reaches the target. The
  //    mass per binade of w (exact fixed-point sums) locates the binade where the prefix ends: every id
  //    above it is kept, every id below dropped, and only that binade's ids are sorted. O(V) plus one
  //    binade's sort (the kernel finds the same set with a radix select).
  if (r.top_p < 1.0f) {
    auto binade = [](float x) { return static_cast<int>(std::bit_cast<uint32_t>(x) >> 23); };  // x >= 0
    std::array<uint64_t, 256> mass{};
    uint64_t Z = 0;
    for (int64_t i = 0; i < V; ++i) {
      const float wi = w[static_cast<size_t>(i)];
      if (wi <= 0.0f) continue;
      const uint64_t W = fixed_weight(wi, B);
      mass[static_cast<size_t>(binade(wi))] += W;
      Z += W;
    }
    const uint64_t target = top_p_target(r.top_p, Z);
    uint64_t above = 0;
    int cut = 255;
    for (; cut > 0; --cut) {
      if (above + mass[static_cast<size_t>(cut)] >= target) break;
      above += mass[static_cast<size_t>(cut)];
    }
    std::vector<int32_t> tie;  // the ids of the binade where the prefix ends
    for (int64_t i = 0; i < V; ++i) {
      const float wi = w[static_cast<size_t>(i)];
      if (wi > 0.0f && binade(wi) == cut) tie.push_back(static_cast<int32_t>(i));
    }
    std::sort(tie.begin(), tie.end(), [&](int32_t a, int32_t b) {
      return w[static_cast<size_t>(a)] > w[static_cast<size_t>(b)] || (w[static_cast<size_t>(a)] == w[static_cast<size_t>(b)] && a < b);
    });
    uint64_t cum = above;
    for (int32_t t : tie) {
      if (cum >= target) {  // the prefix before t already reaches the target: t goes
        w[static_cast<size_t>(t)] = 0.0f;
        logits[static_cast<size_t>(t)] = kNegInf;
        continue;
      }
      cum += fixed_weight(w[static_cast<size_t>(t)], B);
    }
    for (int64_t i = 0; i < V; ++i) {
      float& wi = w[static_cast<size_t>(i)];
      if (wi > 0.0f && binade(wi) < cut) {
        wi = 0.0f;
        logits[static_cast<size_t>(i)] = kNegInf;
      }
    }
  }
  // 7. Min-p, then the draw in id order over the survivors' fixed-point weights.
  uint64_t Z = 0;
  for (int64_t i = 0; i < V; ++i) {
    float& wi = w[static_cast<size_t>(i)];
    if (wi < r.min_p || fixed_weight(wi, B) == 0) {
      wi = 0.0f;
      logits[static_cast<size_t>(i)] = kNegInf;
    }
    Z += fixed_weight(wi, B);
  }
  if (Z == 0) return {arg, SampleStatus::Ok, -1};  // unreachable: the argmax has w = 1
  const uint64_t pos = draw_position(r.u, Z);
  uint64_t cum = 0;
  for (int64_t i = 0; i < V; ++i) {
    cum += fixed_weight(w[static_cast<size_t>(i)], B);
    if (cum > pos) return {static_cast<int32_t>(i), SampleStatus::Ok, -1};
  }
  return {arg, SampleStatus::Ok, -1};  // unreachable: pos < Z
}

}  // namespace k3::sampling
