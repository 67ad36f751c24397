// The scales of a codebook i-quant block (IQ2_*, IQ3_*, IQ1_*), independent of the codebook: every one of
// these formats stores value = d * c (2 q_j + 1) * point, d an f16 per 256-block, q_j a 3- or 4-bit code
// per scale group (16 or 32 weights), point a codebook entry chosen per 4 or 8 weights. The codebook side
// (which entry is nearest for a given multiplier) is a ScaleGroupModel; this file searches the multipliers.
//
// Why this shape: for a fixed multiplier mu the best entries are found group by group, and for fixed
// entries the best multiplier is a closed-form least-squares fit (mu = P / Q below). So each scale group
// gets a ladder of candidate multipliers with least-squares refits (scale_search.h's approach for the
// K-quants, over codebooks here), then d is chosen among a few candidates by the whole block's error with
// every q_j set to the better of its two nearest codes, then refitted in closed form.
#pragma once
#include <cstdint>

namespace k3::quant {

// The best entries of one scale group under a multiplier, and what its error would be under another
// multiplier m with those entries kept: err(m) = base - 2 m P + m^2 Q (weighted squared error).
struct GroupFit {
  double err = 0, p = 0, q = 0;
};

// The codebook side of a block (one per format: iq_codebook.h, iq1_search.h), built from the block's values.
class ScaleGroupModel {
 public:
  virtual ~ScaleGroupModel() = default;
  virtual int scale_groups() const = 0;
  // The multiplier that maps group j's largest |value| onto the codebook's largest magnitude (0: all zero).
  virtual float mu_ref(int j) const = 0;
  // Group j's best entries under multiplier mu > 0; entries: one code per codebook point of the group
  // (format-specific: a grid index, for IQ1 with the delta's sign in bit 11), or null.
  virtual GroupFit fit(int j, float mu, int* entries) = 0;
  // Further multipliers to try, as multiples of mu_ref: the group's largest value on a lower level of
  // the codebook (top / level). A sparse grid may hold its flat patterns only on low levels: a constant
  // group is exact in IQ3_S only on its level 1 (15 mu_ref). n: how many at out (at most 8).
  virtual int level_ratios(const float** out) const {
    *out = nullptr;
    return 0;
  }
  // fit(j, mu).err alone (a model may find it faster: no argmax).
  virtual double error(int j, float mu) { return fit(j, mu, nullptr).err; }
};

// How a format stores the sub-scales: multiplier = d * c * (2 q + 1), q in [0, qmax].
struct SubScaleCode {
  float c;
  int qmax;
};

struct BlockScales {
  float d = 0;    // the f16 super-block scale, as decoded
  int q[16]{};    // the sub-scale code of each scale group
  double err = 0;
};

// The block's scales (d already rounded to f16: what the packer stores; d = 0 for an all-zero block).
// Throws k3::Error when d overflows f16.
BlockScales fit_block_scales(ScaleGroupModel& model, SubScaleCode code);

// f32 -> the value of its nearest f16 (round to nearest even); throws k3::Error past f16's range.
float round_to_f16(float v);

// The weight of each value's squared error: the importance when given (an imatrix's, as for the other
// formats), otherwise sigma^2 + x^2 (sigma^2: the block's mean square). Why not 1: these codebooks are too
// coarse to place every value well, and without an imatrix the large weights of a row are the better guess
// of what matters (llama.cpp's choice for its i-quants without an imatrix is of the same kind); sigma^2
// keeps small values from being ignored.
void error_weights(const float* x, const float* importance, int n, float* w);

}  // namespace k3::quant
