// The codebook side of IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (the magnitude grids with separate sign
// bits): for a block's values, which grid entry each group of 4 or 8 weights takes under a multiplier.
//
// Exhaustive, not a neighbour list: the squared error of group g against entry k under multiplier mu is
//   sum_i w_i (v_i - mu G_ki)^2 = sum_i w_i v_i^2 - mu (2 A_gk - mu B_gk),
//   A_gk = sum_i w_i v_i G_ki,  B_gk = sum_i w_i G_ki^2,
// so A and B are computed once per block (D multiply-adds per entry and group, vectorised over entries)
// and every multiplier the scale search tries costs one fused multiply-add and a max per entry: the best
// entry under the weights is found exactly, which a list of neighbours of the rounded point does not
// guarantee, and on 256-1024 entries it is as fast.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "k3/core/weight_format.h"
#include "k3/quant/iq_scales.h"

namespace k3::quant {

// A grid of magnitudes (iq_tables.h) as floats, entry-minor so that a loop over entries vectorises.
struct MagnitudeGrid {
  int entries = 0, dims = 0;   // 256-1024 entries of 4 or 8 magnitudes
  float top = 0;               // the largest magnitude
  float ratios[8]{};           // top / level for the levels below top / 1.25 (iq_scales.h's level_ratios)
  int n_ratios = 0;
  std::vector<float> mag;      // [dims][entries]
  std::vector<float> mag_sq;   // its squares
  float at(int k, int i) const { return mag[static_cast<size_t>(i) * entries + k]; }
};

// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS or IQ3_S's grid (built once).
const MagnitudeGrid& magnitude_grid(WeightFormat f);

// One 256-block's search: v the signed targets (|x|, or -|x| where a sign had to be flipped for parity),
// w the error weights, scale groups of group_elems weights.
class MagnitudeSearch final : public ScaleGroupModel {
 public:
  MagnitudeSearch(const MagnitudeGrid& grid, const float* v, const float* w, int group_elems);
  int scale_groups() const override { return 256 / group_elems_; }
  float mu_ref(int j) const override;
  GroupFit fit(int j, float mu, int* entries) override;
  double error(int j, float mu) override;
  int level_ratios(const float** out) const override {
    *out = grid_.ratios;
    return grid_.n_ratios;
  }

 private:
  double base(int j) const;  // sum w v^2 over group j
  const MagnitudeGrid& grid_;
  const float* v_;
  const float* w_;
  int group_elems_;
  std::vector<float>& a2_;  // 2 A_gk per grid group g (thread-local storage, reused across blocks)
  std::vector<float>& b_;   // B_gk
};

}  // namespace k3::quant
