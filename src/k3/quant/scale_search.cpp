#include "k3/quant/scale_search.h"

#include <algorithm>
#include <cmath>

namespace k3::quant {

namespace {

inline float wt(const float* w, int i) { return w ? w[i] : 1.0f; }

inline int round_clamp(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi); }

// Candidate inverse scales: nmax / amax times 1 + step * k, k in [-kSteps, kSteps].
constexpr int kSteps = 12;
constexpr float kStep = 0.02f;

}  // namespace

float fit_scale(const float* x, const float* w, int n, int qmin, int qmax, int* q) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax = x[i];
  if (amax == 0) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    return 0;
  }
  // The largest value maps to the end of the range that has room for it (qmin may be -qmax - 1).
  const float nmax = vmax < 0 ? static_cast<float>(-qmin) : static_cast<float>(qmax);
  double best_err = INFINITY;
  float best_d = 0;
  int tq[256];
  for (int k = -kSteps; k <= kSteps; ++k) {
    const float iscale = nmax * (1 + kStep * k) / amax;  // the largest |x| maps to about nmax
    double sxq = 0, sqq = 0;
    for (int i = 0; i < n; ++i) {
      tq[i] = round_clamp(x[i] * iscale, qmin, qmax);
      sxq += double(wt(w, i)) * x[i] * tq[i];
      sqq += double(wt(w, i)) * tq[i] * tq[i];
    }
    if (sqq == 0) continue;
    const float d = static_cast<float>(sxq / sqq);
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = x[i] - double(d) * tq[i];
      err += wt(w, i) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_d = d;
      std::copy(tq, tq + n, q);
    }
  }
  return best_d;
}

float fit_scale_min(const float* x, const float* w, int n, int qmax, int* q, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  lo = std::min(lo, 0.0f);  // m = -lo >= 0
  if (hi <= lo) {
    for (int i = 0; i < n; ++i) q[i] = 0;
    *min_out = -lo;
    return 0;
  }
  double best_err = INFINITY;
  float best_d = 0, best_m = -lo;
  int tq[256];
  for (int k = -kSteps; k <= kSteps; ++k) {
    const float iscale = qmax * (1 + kStep * k) / (hi - lo);
    double sw = 0, sq = 0, sx = 0, sqq = 0, sxq = 0;
    for (int i = 0; i < n; ++i) {
      tq[i] = round_clamp(iscale * (x[i] - lo), 0, qmax);
      const double wi = wt(w, i);
      sw += wi, sq += wi * tq[i], sx += wi * x[i], sqq += wi * tq[i] * tq[i], sxq += wi * x[i] * tq[i];
    }
    // Least squares of x ~ d q + b over (d, b); b = -m must be <= 0, else refit d alone with b = 0.
    const double det = sw * sqq - sq * sq;
    double d, b;
    if (det > 0) {
      d = (sw * sxq - sq * sx) / det;
      b = (sqq * sx - sq * sxq) / det;
    } else {
      d = 0, b = sx / sw;
    }
    if (b > 0) b = 0, d = sqq > 0 ? sxq / sqq : 0;
    if (d < 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = x[i] - (d * tq[i] + b);
      err += wt(w, i) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_d = static_cast<float>(d);
      best_m = static_cast<float>(-b);
      std::copy(tq, tq + n, q);
    }
  }
  if (best_err == INFINITY)
    for (int i = 0; i < n; ++i) q[i] = 0;
  *min_out = best_m;
  return best_d;
}

int nearest_level(float v, const int8_t* levels, int nlevels) {
  int best = 0;
  float bd = std::fabs(v - levels[0]);
  for (int j = 1; j < nlevels; ++j)
    if (const float dj = std::fabs(v - levels[j]); dj < bd) bd = dj, best = j;
  return best;
}

float fit_scale_levels(const float* x, const float* w, int n, const int8_t* levels, int nlevels, int* q) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax = x[i];
  if (amax == 0) {
    for (int i = 0; i < n; ++i) q[i] = nearest_level(0, levels, nlevels);
    return 0;
  }
  // The largest value maps near the codebook's end of its sign (levels[0] < 0 < levels[nlevels - 1]).
  const float end = vmax < 0 ? levels[0] : levels[nlevels - 1];
  double best_err = INFINITY;
  float best_d = 0;
  int tq[256];
  for (int k = -kSteps; k <= kSteps; ++k) {
    const float d0 = vmax / (end * (1 + kStep * k));
    double sxq = 0, sqq = 0;
    for (int i = 0; i < n; ++i) {
      tq[i] = nearest_level(x[i] / d0, levels, nlevels);
      const double l = levels[tq[i]];
      sxq += double(wt(w, i)) * x[i] * l;
      sqq += double(wt(w, i)) * l * l;
    }
    const float d = static_cast<float>(sxq / sqq);
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = x[i] - double(d) * levels[tq[i]];
      err += wt(w, i) * e * e;
    }
    if (err < best_err) {
      best_err = err;
      best_d = d;
      std::copy(tq, tq + n, q);
    }
  }
  return best_d;
}

}  // namespace k3::quant
