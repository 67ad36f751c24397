#include "k3/quant/iq1_search.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "k3/quant/block_decode_iq.h"
#include "k3/quant/iq_tables.h"

namespace k3::quant {

namespace {

constexpr int kKeys = 6561;  // 3^8 ternary vectors; digit i of a key is g_i + 1
constexpr int kPow3[8] = {1, 3, 9, 27, 81, 243, 729, 2187};

// The grid as int8 vectors, which ternary vectors are entries, and the candidate lists of the others.
struct TernaryIndex {
  int8_t g[2048][8];
  float gf[2048][8];                  // the same as floats (no int -> float conversion in the hot loop)
  uint8_t pos[2048], neg[2048];       // the entry's +1 and -1 coordinates as bit masks
  int16_t entry[kKeys];               // the entry whose vector is the key, or -1
  uint32_t first[kKeys + 1];          // the off-grid key's candidates: cand[first[key], first[key + 1])
  std::vector<uint16_t> cand;

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
        gf[k][i] = g[k][i];
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
}

float Iq1Search::mu_ref(int j) const {
  float amax = 0;
  for (int i = j * group_elems_; i < (j + 1) * group_elems_; ++i) amax = std::max(amax, std::fabs(x_[i]));
  return amax / (1 + kIq1Delta);
}

int Iq1Search::best_point(const float* x, const float* w, float mu, float delta, GroupFit& r) const {
  const TernaryIndex& ix = ternary_index();
  const float inv = 1 / mu;
  float t[8];
  int key = 0;
  for (int i = 0; i < 8; ++i) {
    t[i] = x[i] * inv - delta;
    key += (1 + (t[i] > 0.5f) - (t[i] < -0.5f)) * kPow3[i];
  }
  int k = ix.entry[key];
  if (k < 0) {
    // sum w (t - g)^2 = sum w t^2 + sum_{g=+1} (w - 2 w t) + sum_{g=-1} (w + 2 w t): the sums over the
    // +1 and -1 coordinates from subset-sum tables of each nibble, four lookups per candidate (the lists
    // hold ~18 entries on average).
    float up[2][16], down[2][16];
    for (int h = 0; h < 2; ++h) {
      up[h][0] = down[h][0] = 0;
      for (int m = 1; m < 16; ++m) {
        const int i = 4 * h + std::countr_zero(static_cast<unsigned>(m));
        const float wt2 = 2 * w[i] * t[i];
        up[h][m] = up[h][m & (m - 1)] + (w[i] - wt2);
        down[h][m] = down[h][m & (m - 1)] + (w[i] + wt2);
      }
    }
    float best = INFINITY;
    k = ix.cand[ix.first[key]];  // kept when every cost is NaN (a multiplier that over- or underflowed)
    for (uint32_t c = ix.first[key]; c < ix.first[key + 1]; ++c) {
      const int e = ix.cand[c];
      const unsigned p = ix.pos[e], n = ix.neg[e];
      const float cost = up[0][p & 15] + up[1][p >> 4] + down[0][n & 15] + down[1][n >> 4];
      if (cost < best) best = cost, k = e;
    }
  }
  float p = 0, q = 0;  // 8 terms: float is exact enough, the sums over the block are double
  for (int i = 0; i < 8; ++i) {
    const float l = ix.gf[k][i] + delta;
    p += w[i] * x[i] * l, q += w[i] * l * l;
  }
  r.p += p, r.q += q;
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
      for (int g = 0; g < delta_elems_ / 8; ++g) k[g] = best_point(x_ + u + 8 * g, w_ + u + 8 * g, mu, delta, r) | (negative << 11);
      r.err = base - 2 * double(mu) * r.p + double(mu) * mu * r.q;
      if (r.err < best.err) best = r, std::copy(k, k + 4, best_k);
    }
    total.err += best.err, total.p += best.p, total.q += best.q;
    if (entries) entries = std::copy(best_k, best_k + delta_elems_ / 8, entries);
  }
  return total;
}

}  // namespace k3::quant
