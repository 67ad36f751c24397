#include "k3/quant/iq_scales.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "k3/core/dtype.h"
#include "k3/core/error.h"

namespace k3::quant {

float round_to_f16(float v) {
  const uint16_t h = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
  if ((h & 0x7c00) == 0x7c00) throw Error("quantize_row: values too large for a GGUF block's f16 scale");
  return f16_to_f32(h);
}

void error_weights(const float* x, const float* importance, int n, float* w) {
  if (importance) {
    std::copy(importance, importance + n, w);
    return;
  }
  double sumsq = 0;
  for (int i = 0; i < n; ++i) sumsq += double(x[i]) * x[i];
  const float sigma2 = static_cast<float>(sumsq / n);
  for (int i = 0; i < n; ++i) w[i] = sigma2 + x[i] * x[i];
}

namespace {

// Candidate multipliers for a scale group: mu_ref times a geometric ladder. The best multiplier of a coarse
// codebook clips the largest values: ~0.55-0.95 mu_ref on Gaussian groups (IQ1's ternary points lowest),
// more spread under an imatrix; the ladder covers 0.4-1.25 and the refits below walk from its best rung.
constexpr int kRungs = 8;
constexpr float kLowest = 0.40f, kHighest = 1.25f;

struct GroupChoice {
  float mu = 0;
  GroupFit fit;
};

GroupChoice best_multiplier(ScaleGroupModel& m, int j) {
  GroupChoice best;
  const float ref = m.mu_ref(j);
  if (!(ref > 0)) {
    best.fit.err = 0;
    return best;
  }
  best.fit.err = INFINITY;
  const float ratio = std::pow(kHighest / kLowest, 1.0f / (kRungs - 1));
  float f = kLowest;
  double best_err = INFINITY;
  for (int r = 0; r < kRungs; ++r, f *= ratio) {
    const double err = m.error(j, ref * f);
    if (err < best_err) best_err = err, best.mu = ref * f;
  }
  const float* ratios;
  for (int r = 0, n = m.level_ratios(&ratios); r < n; ++r) {
    const double err = m.error(j, ref * ratios[r]);
    if (err < best_err) best_err = err, best.mu = ref * ratios[r];
  }
  best.fit = m.fit(j, best.mu, nullptr);
  // Least-squares refits: the multiplier for the chosen entries, then the entries for that multiplier.
  for (int it = 0; it < 3 && best.fit.q > 0; ++it) {
    const float mu = static_cast<float>(best.fit.p / best.fit.q);
    if (!(mu > 0) || mu == best.mu) break;
    const GroupFit g = m.fit(j, mu, nullptr);
    if (!(g.err < best.fit.err)) break;
    best = {mu, g};
  }
  return best;
}

// Sets s.q[j] to the better of the two codes nearest mu[j] / d for every group, and s.err to the total.
void choose_codes(ScaleGroupModel& m, SubScaleCode code, const float* mu, BlockScales& s) {
  s.err = 0;
  const float unit = s.d * code.c;  // multiplier of code q: unit (2q + 1)
  for (int j = 0; j < m.scale_groups(); ++j) {
    const float real = mu[j] > 0 ? 0.5f * (mu[j] / unit - 1) : 0.0f;
    // Clamped as a float first: a NaN or huge quotient (a refitted d far below mu) is no int.
    const int lo = !(real > 0) ? 0 : real >= static_cast<float>(code.qmax) ? code.qmax : static_cast<int>(real);
    const int hi = std::min(lo + 1, code.qmax);
    double best = INFINITY;
    for (int q = lo; q <= hi; ++q) {
      const double err = m.error(j, unit * static_cast<float>(2 * q + 1));
      if (err < best) best = err, s.q[j] = q;
    }
    s.err += best;
  }
}

}  // namespace

BlockScales fit_block_scales(ScaleGroupModel& m, SubScaleCode code) {
  const int groups = m.scale_groups();
  const float top = code.c * static_cast<float>(2 * code.qmax + 1);
  // Values too large for the f16 d are an error before any weight (sigma^2 + x^2 may be infinite then).
  float ref_max = 0;
  for (int j = 0; j < groups; ++j) ref_max = std::max(ref_max, m.mu_ref(j));
  round_to_f16(ref_max / top);
  float mu[16];
  float mu_max = 0;
  for (int j = 0; j < groups; ++j) {
    mu[j] = best_multiplier(m, j).mu;
    mu_max = std::max(mu_max, mu[j]);
  }
  BlockScales best;
  if (!(mu_max > 0)) return best;  // an all-zero block: d = 0 decodes to zeros whatever the entries
  // d from the largest multiplier, and slightly smaller: the odd codes (2q + 1) are coarse for the small
  // groups, and a smaller d can place them better at the price of clipping the largest group a little.
  best.err = INFINITY;
  for (const float shrink : {1.0f, 0.95f, 0.90f, 0.84f}) {
    BlockScales s;
    s.d = round_to_f16(mu_max / top * shrink);
    if (!(s.d > 0)) continue;
    choose_codes(m, code, mu, s);
    if (s.err < best.err) best = s;
  }
  if (best.err == INFINITY) return BlockScales{};  // every candidate d underflowed f16
  // d refitted in closed form for the chosen codes and entries: err(d) = sum_j (base_j - 2 d m_j P_j +
  // d^2 m_j^2 Q_j), m_j = c (2 q_j + 1); then the codes and entries again under it.
  double num = 0, den = 0;
  for (int j = 0; j < groups; ++j) {
    const double mj = code.c * (2.0 * best.q[j] + 1);
    const GroupFit g = m.fit(j, static_cast<float>(best.d * mj), nullptr);
    num += mj * g.p, den += mj * mj * g.q;
  }
  if (den > 0 && num > 0) {
    BlockScales s;
    s.d = round_to_f16(static_cast<float>(num / den));
    if (s.d > 0 && s.d != best.d) {
      choose_codes(m, code, mu, s);
      if (s.err < best.err) best = s;
    }
  }
  if (best.err == INFINITY) best = BlockScales{};  // every candidate d underflowed f16
  return best;
}

}  // namespace k3::quant
