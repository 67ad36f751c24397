#include "k3/quant/iq_codebook.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "k3/core/error.h"
#include "k3/quant/iq_tables.h"

namespace k3::quant {

namespace {

template <class Entry>
MagnitudeGrid make_grid(const Entry* table, int entries, int dims) {
  MagnitudeGrid g;
  g.entries = entries, g.dims = dims;
  g.mag.resize(static_cast<size_t>(entries) * dims);
  g.mag_sq.resize(g.mag.size());
  for (int k = 0; k < entries; ++k)
    for (int i = 0; i < dims; ++i) {
      const float m = static_cast<float>((static_cast<uint64_t>(table[k]) >> (8 * i)) & 0xFF);
      g.mag[static_cast<size_t>(i) * entries + k] = m;
      g.mag_sq[static_cast<size_t>(i) * entries + k] = m * m;
      g.top = std::max(g.top, m);
    }
  // The levels the ladder of iq_scales.cpp does not reach (it spans 0.4-1.25 mu_ref).
  std::vector<float> levels(g.mag.begin(), g.mag.end());
  std::sort(levels.begin(), levels.end());
  levels.erase(std::unique(levels.begin(), levels.end()), levels.end());
  for (float l : levels)
    if (g.top / l > 1.25f && g.n_ratios < 8) g.ratios[g.n_ratios++] = g.top / l;
  return g;
}

// max_k 2 A_k - mu B_k, 32 entries per step in four independent chains (one chain of compare-and-blend
// with the index is latency-bound: ~3x slower).
float best_value(const float* a2, const float* b, int n, float mu) {
  const __m256 vmu = _mm256_set1_ps(mu);
  __m256 m[4];
  for (auto& v : m) v = _mm256_set1_ps(-INFINITY);
  for (int i = 0; i < n; i += 32)
    for (int c = 0; c < 4; ++c)
      m[c] = _mm256_max_ps(m[c], _mm256_fnmadd_ps(vmu, _mm256_loadu_ps(b + i + 8 * c), _mm256_loadu_ps(a2 + i + 8 * c)));
  __m256 top = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
  top = _mm256_max_ps(top, _mm256_permute2f128_ps(top, top, 1));
  top = _mm256_max_ps(top, _mm256_shuffle_ps(top, top, 0x4E));
  top = _mm256_max_ps(top, _mm256_shuffle_ps(top, top, 0xB1));
  return _mm256_cvtss_f32(top);
}

// The first entry reaching best_value (ties: the lowest index, so the choice does not depend on the lane
// layout), each value recomputed bit for bit.
int best_entry(const float* a2, const float* b, int n, float mu) {
  const __m256 vmu = _mm256_set1_ps(mu), top = _mm256_set1_ps(best_value(a2, b, n, mu));
  for (int i = 0; i < n; i += 8) {
    const __m256 v = _mm256_fnmadd_ps(vmu, _mm256_loadu_ps(b + i), _mm256_loadu_ps(a2 + i));
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(v, top, _CMP_EQ_OQ));
    if (hit) return i + std::countr_zero(static_cast<unsigned>(hit));
  }
  return 0;  // unreachable for finite values (the maximum is one of them)
}

}  // namespace

const MagnitudeGrid& magnitude_grid(WeightFormat f) {
  static const MagnitudeGrid iq2xxs = make_grid(kIq2xxsGrid, 256, 8), iq2xs = make_grid(kIq2xsGrid, 512, 8),
                             iq2s = make_grid(kIq2sGrid, 1024, 8), iq3xxs = make_grid(kIq3xxsGrid, 256, 4),
                             iq3s = make_grid(kIq3sGrid, 512, 4);
  switch (f) {
    case WeightFormat::IQ2_XXS: return iq2xxs;
    case WeightFormat::IQ2_XS: return iq2xs;
    case WeightFormat::IQ2_S: return iq2s;
    case WeightFormat::IQ3_XXS: return iq3xxs;
    case WeightFormat::IQ3_S: return iq3s;
    default: throw Error(std::string("magnitude_grid: ") + weight_format_name(f) + " has no magnitude grid");
  }
}

namespace {
std::vector<float>& scratch(int which) {
  thread_local std::vector<float> buf[2];
  return buf[which];
}
}  // namespace

MagnitudeSearch::MagnitudeSearch(const MagnitudeGrid& grid, const float* v, const float* w, int group_elems)
    : grid_(grid), v_(v), w_(w), group_elems_(group_elems), a2_(scratch(0)), b_(scratch(1)) {
  const int n = grid.entries, dims = grid.dims, points = 256 / dims;
  a2_.resize(static_cast<size_t>(points) * n);
  b_.resize(a2_.size());
  // Eight entries at a time, every point of the block for them before the next eight: the grid's chunk
  // stays in L1 (IQ2_S's whole grid, 64 KB with the squares, does not), the points' weights are broadcasts.
  float wv2[256], wsq[256];
  for (int i = 0; i < 256; ++i) wv2[i] = 2 * w[i] * v[i], wsq[i] = w[i];
  for (int k = 0; k < n; k += 8) {
    __m256 mag[8], mag_sq[8];
    for (int i = 0; i < dims; ++i) {
      mag[i] = _mm256_loadu_ps(grid.mag.data() + static_cast<size_t>(i) * n + k);
      mag_sq[i] = _mm256_loadu_ps(grid.mag_sq.data() + static_cast<size_t>(i) * n + k);
    }
    for (int g = 0; g < points; ++g) {
      __m256 sa = _mm256_setzero_ps(), sb = _mm256_setzero_ps();
      for (int i = 0; i < dims; ++i) {
        sa = _mm256_fmadd_ps(_mm256_broadcast_ss(wv2 + g * dims + i), mag[i], sa);
        sb = _mm256_fmadd_ps(_mm256_broadcast_ss(wsq + g * dims + i), mag_sq[i], sb);
      }
      _mm256_storeu_ps(a2_.data() + static_cast<size_t>(g) * n + k, sa);
      _mm256_storeu_ps(b_.data() + static_cast<size_t>(g) * n + k, sb);
    }
  }
}

float MagnitudeSearch::mu_ref(int j) const {
  float vmax = 0;
  for (int i = j * group_elems_; i < (j + 1) * group_elems_; ++i) vmax = std::max(vmax, v_[i]);
  return vmax / grid_.top;
}

double MagnitudeSearch::base(int j) const {
  double sum = 0;
  for (int i = j * group_elems_; i < (j + 1) * group_elems_; ++i) sum += double(w_[i]) * v_[i] * v_[i];
  return sum;
}

GroupFit MagnitudeSearch::fit(int j, float mu, int* entries) {
  const int n = grid_.entries, dims = grid_.dims;
  GroupFit r;
  for (int g = j * group_elems_ / dims; g < (j + 1) * group_elems_ / dims; ++g) {
    const float* a2 = a2_.data() + static_cast<size_t>(g) * n;
    const float* b = b_.data() + static_cast<size_t>(g) * n;
    const int k = best_entry(a2, b, n, mu);
    if (entries) *entries++ = k;
    r.p += 0.5 * a2[k], r.q += b[k];
  }
  r.err = base(j) - 2 * double(mu) * r.p + double(mu) * mu * r.q;
  return r;
}

double MagnitudeSearch::error(int j, float mu) {
  const int n = grid_.entries, dims = grid_.dims;
  double gain = 0;  // sum over points of mu max_k (2 A_k - mu B_k)
  for (int g = j * group_elems_ / dims; g < (j + 1) * group_elems_ / dims; ++g)
    gain += best_value(a2_.data() + static_cast<size_t>(g) * n, b_.data() + static_cast<size_t>(g) * n, n, mu);
  return base(j) - double(mu) * gain;
}

}  // namespace k3::quant
