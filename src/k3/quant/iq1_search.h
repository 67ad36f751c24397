// The codebook side of IQ1_S and IQ1_M: 8 weights are mu (g + delta), g one of 2048 vectors of {-1, 0, 1}
// (iq_tables.h's kIq1sGrid), delta = +-1/8 (per 32 weights in IQ1_S, per 8 in IQ1_M).
//
// 2048 entries are too many to score each one per group and multiplier (IQ2's exhaustive search would be
// ~8x slower here), so the search uses a precomputed index over the 3^8 = 6561 ternary vectors instead:
// under a multiplier the unconstrained optimum rounds t = v / mu - delta coordinate by coordinate to
// {-1, 0, 1}; when that vector is a grid entry (about a third of them are) it is the exact optimum for any
// weights. Otherwise its candidate list -- the grid entries within squared distance dmin + 1 of it, dmin the
// nearest's -- is scored under the weights. (A one-step change costs w_i (1 - 2 |t_i - r_i|) and lies at
// distance 1; the list also holds the two-step changes, which the weights can make cheaper.)
#pragma once
#include <cstdint>

#include "k3/quant/iq_scales.h"

namespace k3::quant {

// Per point of 8 weights: the sums of w and of w x over every subset of each nibble of its coordinates.
struct Iq1PointSums {
  float w[2][16], wx[2][16];
};

// One 256-block's search. group_elems: weights per scale code (32 for IQ1_S, 16 for IQ1_M); delta_elems:
// weights per delta sign (32 or 8). Entries written by fit(): the 11-bit grid index, bit 11 set where
// that group's delta is negative.
class Iq1Search final : public ScaleGroupModel {
 public:
  Iq1Search(const float* x, const float* w, int group_elems, int delta_elems);
  int scale_groups() const override { return 256 / group_elems_; }
  float mu_ref(int j) const override;
  GroupFit fit(int j, float mu, int* entries) override;

 private:
  // The best entry for point pt (weights 8 pt .. 8 pt + 7) under (mu, delta); adds its P, Q to r.
  int best_point(int pt, float mu, float delta, GroupFit& r) const;
  const float* x_;
  const float* w_;
  int group_elems_, delta_elems_;
  Iq1PointSums sums_[32];
};

}  // namespace k3::quant
