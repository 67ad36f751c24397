#include "k3/quant/iq1_search.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "k3/core/error.h"
#include "k3/quant/block_decode_iq.h"
#include "k3/quant/iq_tables.h"

namespace k3::quant {

namespace {

constexpr int kKeys = 6561;  // 3^8 ternary vectors; digit i of a key is g_i + 1
constexpr int kPow3[8] = {1, 3, 9, 27, 81, 243, 729, 2187};
constexpr uint32_t kMaxCandidates = 72;  // the longest list is 68 (kIq1sGrid's, dmin + 1): best_candidate's buffer

// The grid as int8 vectors, which ternary vectors are entries, and the candidate lists of the others.
struct TernaryIndex {
  int8_t g[2048][8];
  uint8_t pos[2048], neg[2048];       // the entry's +1 and -1 coordinates as bit masks
  int16_t entry[kKeys];               // the entry whose vector is the key, or -1
  uint32_t first[kKeys + 1];          // the off-grid key's candidates: cand[first[key], first[key + 1])
  std::vector<uint16_t> cand;
  // The same lists for eight-lane scoring, each padded to whole 8s with its first entry: one word per
  // candidate, the nibbles of its +1 mask (bits 0-3, 4-7), of its -1 mask (8-11, 12-15), the entry (16-26).
  uint32_t first8[kKeys + 1];
  std::vector<uint32_t> cand8;

  // Whether an entry lies within squared distance `budget` of r, coordinates i.. still free (key: the
  // digits chosen so far); with collect, appends every such entry to cand instead of stopping at one.
  bool within(const int* r, int i, int budget, int key, bool collect) {
    if (i == 8) {
      if (entry[key] < 0) return false;
      if (collect) cand.push_back(static_cast<uint16_t>(entry[key]));
      return true;
    }
    bool found = false;
    for (int gi = -1; gi <= 1; ++gi) {
      const int cost = (gi - r[i]) * (gi - r[i]);
      if (cost > budget) continue;
      found |= within(r, i + 1, budget - cost, key + (gi + 1) * kPow3[i], collect);
      if (found && !collect) return true;
    }
    return found;
  }

  TernaryIndex() {
    std::fill(entry, entry + kKeys, int16_t{-1});
    std::fill(pos, pos + 2048, uint8_t{0});
    std::fill(neg, neg + 2048, uint8_t{0});
    for (int k = 0; k < 2048; ++k) {
      int key = 0;
      for (int i = 7; i >= 0; --i) {
        g[k][i] = static_cast<int8_t>((kIq1sGrid[k] >> (8 * i)) & 0xFF);
        pos[k] = static_cast<uint8_t>(pos[k] | (g[k][i] > 0) << i);
        neg[k] = static_cast<uint8_t>(neg[k] | (g[k][i] < 0) << i);
        key = 3 * key + g[k][i] + 1;
      }
      entry[key] = static_cast<int16_t>(k);
    }
    // Off-grid keys: the entries within dmin + 1, found by walking the ternary vectors around the key
    // (a few hundred) rather than scoring all 2048 entries per key: built in milliseconds.
    for (int key = 0; key < kKeys; ++key) {
      first[key] = static_cast<uint32_t>(cand.size());
      if (entry[key] >= 0) continue;
      int r[8];
      for (int i = 0, v = key; i < 8; ++i, v /= 3) r[i] = v % 3 - 1;
      int dmin = 1;
      while (!within(r, 0, dmin, 0, false)) ++dmin;
      within(r, 0, dmin + 1, 0, true);
    }
    first[kKeys] = static_cast<uint32_t>(cand.size());
    for (int key = 0; key < kKeys; ++key) {
      first8[key] = static_cast<uint32_t>(cand8.size());
      const uint32_t n = first[key + 1] - first[key];
      if (n > kMaxCandidates) throw Error("iq1 index: a candidate list of " + std::to_string(n) + " entries");  // never (68)
      for (uint32_t i = 0; i < (n + 7) / 8 * 8; ++i) {
        const unsigned e = cand[first[key] + (i < n ? i : 0)];
        cand8.push_back(pos[e] | neg[e] << 8 | e << 16);
      }
    }
    first8[kKeys] = static_cast<uint32_t>(cand8.size());
  }
};

const TernaryIndex& ternary_index() {
  static const TernaryIndex index;
  return index;
}

}  // namespace

Iq1Search::Iq1Search(const float* x, const float* w, int group_elems, int delta_elems)
    : x_(x), w_(w), group_elems_(group_elems), delta_elems_(delta_elems) {
  ternary_index();  // built before the first timing-sensitive call
  // Per point of 8, the sums of w and of w x over every subset of each nibble of its coordinates: with
  // them a candidate's error and P, Q are a few lookups (best_point), and none depends on the multiplier.
  // (Full 256-entry tables per point cost more to build than they save.)
  for (int pt = 0; pt < 32; ++pt)
    for (int h = 0; h < 2; ++h) {
      Iq1PointSums& s = sums_[pt];
      s.w[h][0] = s.wx[h][0] = 0;
      for (int m = 1; m < 16; ++m) {
        const int i = 8 * pt + 4 * h + std::countr_zero(static_cast<unsigned>(m));
        s.w[h][m] = s.w[h][m & (m - 1)] + w[i];
        s.wx[h][m] = s.wx[h][m & (m - 1)] + w[i] * x[i];
      }
    }
}

float Iq1Search::mu_ref(int j) const {
  float amax = 0;
  for (int i = j * group_elems_; i < (j + 1) * group_elems_; ++i) amax = std::max(amax, std::fabs(x_[i]));
  return amax / (1 + kIq1Delta);
}

namespace {
// sum_{i in m} 3^i for every byte m: the ternary key of a vector with +1 at `pos`, -1 at `neg` is
// 3280 (all zeros) + kPow3Sum[pos] - kPow3Sum[neg].
struct Pow3Sums {
  int v[256];
  constexpr Pow3Sums() : v{} {
    for (int m = 0; m < 256; ++m)
      for (int i = 0; i < 8; ++i) v[m] += (m >> i & 1) * kPow3[i];
  }
};
constexpr Pow3Sums kPow3Sum;
}  // namespace

namespace {

// Entries 0-15 of a 16-float table (lo: 0-7, hi: 8-15) at eight nibble indices.
inline __m256 lookup16(__m256 lo, __m256 hi, __m256i idx) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, idx), _mm256_permutevar8x32_ps(hi, idx),
                          _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> the sign bit blendv reads
}

// One nibble's cost table: f W + g WX over its 16 subsets (two registers).
struct Table16 {
  __m256 lo, hi;
  Table16(const float* w, const float* wx, float f, float g)
      : lo(_mm256_fmadd_ps(_mm256_set1_ps(g), _mm256_loadu_ps(wx), _mm256_mul_ps(_mm256_set1_ps(f), _mm256_loadu_ps(w)))),
        hi(_mm256_fmadd_ps(_mm256_set1_ps(g), _mm256_loadu_ps(wx + 8), _mm256_mul_ps(_mm256_set1_ps(f), _mm256_loadu_ps(w + 8)))) {}
};

// The best of an off-grid key's candidate list for a point with sums s under (mu, delta).
int best_candidate(const TernaryIndex& ix, int key, const Iq1PointSums& s, float mu, float delta) {
  // sum w (t - g)^2 = sum w t^2 + sum_{g=+1} (w - 2 w t) + sum_{g=-1} (w + 2 w t), t = x / mu - delta: the +1
  // coordinates cost (1 + 2 delta) W - (2 / mu) WX, the -1 ones (1 - 2 delta) W + (2 / mu) WX, W and WX the
  // subset sums of each nibble. Per nibble and sign a 16-entry table, eight candidates scored per step with
  // register permutes (the lists hold ~18 entries: a scalar loop was most of IQ1's time).
  const float a = 1 + 2 * delta, b = 1 - 2 * delta, c = 2 / mu;
  const Table16 up_lo(s.w[0], s.wx[0], a, -c), up_hi(s.w[1], s.wx[1], a, -c);
  const Table16 down_lo(s.w[0], s.wx[0], b, c), down_hi(s.w[1], s.wx[1], b, c);
  const __m256i nibble = _mm256_set1_epi32(15);
  const uint32_t* words = ix.cand8.data() + ix.first8[key];
  const int n = static_cast<int>(ix.first8[key + 1] - ix.first8[key]);
  alignas(32) float cost[kMaxCandidates];
  __m256 low = _mm256_set1_ps(INFINITY);
  for (int i = 0; i < n; i += 8) {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i));
    const __m256 v = _mm256_add_ps(
        _mm256_add_ps(lookup16(up_lo.lo, up_lo.hi, _mm256_and_si256(w, nibble)),
                      lookup16(up_hi.lo, up_hi.hi, _mm256_and_si256(_mm256_srli_epi32(w, 4), nibble))),
        _mm256_add_ps(lookup16(down_lo.lo, down_lo.hi, _mm256_and_si256(_mm256_srli_epi32(w, 8), nibble)),
                      lookup16(down_hi.lo, down_hi.hi, _mm256_and_si256(_mm256_srli_epi32(w, 12), nibble))));
    _mm256_store_ps(cost + i, v);
    low = _mm256_min_ps(low, v);
  }
  low = _mm256_min_ps(low, _mm256_permute2f128_ps(low, low, 1));
  low = _mm256_min_ps(low, _mm256_shuffle_ps(low, low, 0x4E));
  low = _mm256_min_ps(low, _mm256_shuffle_ps(low, low, 0xB1));
  const float best = _mm256_cvtss_f32(low);
  for (int i = 0; i < n; ++i)  // the first candidate at the minimum (as one running minimum keeps)
    if (cost[i] == best) return static_cast<int>(words[i] >> 16);
  return static_cast<int>(words[0] >> 16);  // every cost NaN (a multiplier that over- or underflowed)
}

}  // namespace

int Iq1Search::best_point(int pt, float mu, float delta, GroupFit& r) const {
  const TernaryIndex& ix = ternary_index();
  const Iq1PointSums& s = sums_[pt];
  auto w_of = [&](unsigned m) { return s.w[0][m & 15] + s.w[1][m >> 4]; };
  auto wx_of = [&](unsigned m) { return s.wx[0][m & 15] + s.wx[1][m >> 4]; };
  // t = x / mu - delta rounded to {-1, 0, 1}, eight lanes at once.
  const __m256 t = _mm256_fmsub_ps(_mm256_loadu_ps(x_ + 8 * pt), _mm256_set1_ps(1 / mu), _mm256_set1_ps(delta));
  const int up = _mm256_movemask_ps(_mm256_cmp_ps(t, _mm256_set1_ps(0.5f), _CMP_GT_OQ));
  const int down = _mm256_movemask_ps(_mm256_cmp_ps(t, _mm256_set1_ps(-0.5f), _CMP_LT_OQ));
  const int key = 3280 + kPow3Sum.v[up] - kPow3Sum.v[down];
  int k = ix.entry[key];
  if (k < 0) k = best_candidate(ix, key, s, mu, delta);
  // P = sum w x (g + delta), Q = sum w (g + delta)^2 over the 8, from the same sums.
  const unsigned p = ix.pos[k], n = ix.neg[k];
  const float wp = w_of(p), wn = w_of(n);
  r.p += delta * wx_of(255) + wx_of(p) - wx_of(n);
  r.q += delta * delta * w_of(255) + 2 * delta * (wp - wn) + wp + wn;
  return k;
}

GroupFit Iq1Search::fit(int j, float mu, int* entries) {
  GroupFit total;
  // Each delta unit (the weights sharing a delta sign) takes the better sign.
  for (int u = j * group_elems_; u < (j + 1) * group_elems_; u += delta_elems_) {
    double base = 0;
    for (int i = u; i < u + delta_elems_; ++i) base += double(w_[i]) * x_[i] * x_[i];
    GroupFit best;
    best.err = INFINITY;
    int best_k[4] = {}, k[4];
    for (const int negative : {0, 1}) {
      const float delta = negative ? -kIq1Delta : kIq1Delta;
      GroupFit r;
      for (int g = 0; g < delta_elems_ / 8; ++g) k[g] = best_point(u / 8 + g, mu, delta, r) | (negative << 11);
      r.err = base - 2 * double(mu) * r.p + double(mu) * mu * r.q;
      if (r.err < best.err) best = r, std::copy(k, k + 4, best_k);
    }
    total.err += best.err, total.p += best.p, total.q += best.q;
    if (entries) entries = std::copy(best_k, best_k + delta_elems_ / 8, entries);
  }
  return total;
}

}  // namespace k3::quant
