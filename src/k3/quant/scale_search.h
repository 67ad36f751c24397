// The per-group scale searches behind the GGUF quantisers (gguf_quant.cpp): weighted least squares over
// a group of values, the published approach of llama.cpp's K-quants (make_qx_quants / make_qkx2_quants)
// implemented here from its description: try a ladder of candidate scales around max / nmax, round the
// values to integers under each, refit the scale (and min) in closed form for those integers, and keep
// the candidate with the smallest weighted squared error.
#pragma once
#include <cmath>
#include <cstdint>

namespace k3::quant {

// nearbyint(v) clamped to [lo, hi], clamped in float first: a NaN or out-of-int-range v (a zero or
// denormal scale's quotient) is not convertible to int (undefined behaviour, found by fuzz_quant_blocks
// under UBSan); NaN goes to lo.
inline int round_clamp(float v, int lo, int hi) {
  if (!(v > static_cast<float>(lo))) return lo;
  if (v >= static_cast<float>(hi)) return hi;
  return static_cast<int>(std::nearbyint(v));
}

// x ~ d * q, q integer in [qmin, qmax] (qmin < 0 < qmax). Writes q (as int) and returns d, which may be
// negative (the largest |x| then uses the other end of an asymmetric grid); 0 for an all-zero group.
// w: per-value weights (> 0), or null for 1.
float fit_scale(const float* x, const float* w, int n, int qmin, int qmax, int* q);

// x ~ d * q - m, q integer in [0, qmax], d >= 0, m >= 0 (the group's minimum maps to a non-positive
// offset, as the K formats store it). Writes q, *min_out = m, returns d.
float fit_scale_min(const float* x, const float* w, int n, int qmax, int* q, float* min_out);

// x ~ d * levels[q], q in [0, nlevels) over a sorted non-uniform codebook (IQ4_NL's 16 values); returns d
// (of either sign, as fit_scale).
float fit_scale_levels(const float* x, const float* w, int n, const int8_t* levels, int nlevels, int* q);

// The index of the level nearest v (levels sorted ascending, at most 16; a tie goes to the lower level).
int nearest_level(float v, const int8_t* levels, int nlevels);

// The same with the midpoints between neighbouring levels computed once: the number of midpoints below v,
// counted without branches (a search's comparisons on random data mispredict).
struct NearestLevel {
  float mid[16];
  int n;
  NearestLevel(const int8_t* levels, int nlevels) : mid{}, n(nlevels - 1) {
    for (int j = 0; j < n; ++j) mid[j] = 0.5f * static_cast<float>(levels[j] + levels[j + 1]);
  }
  int operator()(float v) const {
    int k = 0;
    for (int j = 0; j < n; ++j) k += v > mid[j];
    return k;
  }
};

}  // namespace k3::quant
