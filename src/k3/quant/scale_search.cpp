#include "k3/quant/scale_search.h"

#include <algorithm>
#include <cmath>

namespace k3::quant {

namespace {

inline float wt(const float* w, int i) { return w ? w[i] : 1.0f; }


// Coordinate descent on the quants for a fixed grid (level(k): the value of index k): with the scale
// refitted in closed form, the weighted error is sum w x^2 - sxl^2 / sll, so a change of one quant to
// the nearest grid point of x_i / d is kept when it raises sxl^2 / sll. A few passes; returns d.
template <class Level, class Nearest>
float refine_quants(const float* x, const float* w, int n, int* q, Level level, Nearest nearest) {
  double sxl = 0, sll = 0;
  for (int i = 0; i < n; ++i) {
    const double l = level(q[i]);
    sxl += double(wt(w, i)) * x[i] * l, sll += double(wt(w, i)) * l * l;
  }
  for (int pass = 0; pass < 5 && sll > 0; ++pass) {
    bool changed = false;
    for (int i = 0; i < n; ++i) {
      const int k = nearest(static_cast<float>(x[i] * sll / sxl));
      if (k == q[i]) continue;
      const double wi = wt(w, i), lo = level(q[i]), ln = level(k);
      const double nxl = sxl + wi * x[i] * (ln - lo), nll = sll + wi * (ln * ln - lo * lo);
      if (nll > 0 && nxl * nxl * sll > sxl * sxl * nll) sxl = nxl, sll = nll, q[i] = k, changed = true;
    }
    if (!changed) break;
  }
  return sll > 0 ? static_cast<float>(sxl / sll) : 0.0f;
}

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
  // The largest |x| maps near either end of the grid: a negative scale lets a positive maximum use the
  // longer side of an asymmetric grid (Q3_K's [-4, 3]), as llama.cpp's Q3_K does (a symmetric grid: one
  // end is enough). Fine grids need fewer candidates: a step moves few values to another integer.
  const int steps = qmax >= 100 ? 2 : 6, per_end = 2 * steps + 1;
  const int ends = qmin == -qmax ? 1 : 2;
  double best_err = INFINITY;
  float best_d = 0;
  int tq[256];
  for (int c = 0; c < ends * per_end; ++c) {
    const int k = c % per_end - steps, end = c < per_end ? qmax : qmin;
    const float iscale = static_cast<float>(end) * (1 + kStep * k) / vmax;  // vmax * iscale ~ end
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
  if (best_d == 0) return 0;
  return refine_quants(
      x, w, n, q, [](int k) { return double(k); }, [&](float v) { return round_clamp(v, qmin, qmax); });
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

int nearest_level(float v, const int8_t* levels, int nlevels) { return NearestLevel(levels, nlevels)(v); }

float fit_scale_levels(const float* x, const float* w, int n, const int8_t* levels, int nlevels, int* q) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax = x[i];
  const NearestLevel nearest(levels, nlevels);
  if (amax == 0) {
    for (int i = 0; i < n; ++i) q[i] = nearest(0);
    return 0;
  }
  // The largest |x| maps near either end of the codebook (a negative scale: the other end).
  double best_err = INFINITY;
  float best_d = 0;
  int tq[256];
  constexpr int steps = 6, per_end = 2 * steps + 1;  // half fit_scale's ladder: the refits below recover it
  for (int c = 0; c < 2 * per_end; ++c) {
    const int k = c % per_end - steps;
    const float end = c < per_end ? levels[nlevels - 1] : levels[0];
    const float d0 = vmax / (end * (1 + kStep * k));
    double sxq = 0, sqq = 0;
    for (int i = 0; i < n; ++i) {
      tq[i] = nearest(x[i] / d0);
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
  if (best_d == 0) return 0;
  return refine_quants(
      x, w, n, q, [&](int k) { return double(levels[k]); }, [&](float v) { return nearest(v); });
}

}  // namespace k3::quant
