#include "k3/quant/gguf_pack.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "k3/core/error.h"
#include "k3/quant/block_decode.h"
#include "k3/quant/iq_pack.h"
#include "k3/quant/scale_search.h"

namespace k3::quant {

namespace {

// f32 -> f16 bits, round to nearest even (F16C); a scale beyond f16's range is an error, not an inf.
uint16_t f16_bits(float v) {
  const uint16_t h = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
  if ((h & 0x7c00) == 0x7c00) throw Error("quantize_row: values too large for a GGUF block's f16 scale");
  return h;
}
// Stores v as f16 at p and returns the value it decodes to.
float put_f16(uint8_t* p, float v) {
  const uint16_t h = f16_bits(v);
  std::memcpy(p, &h, 2);
  return f16_to_f32(h);
}
const float* sub(const float* w, int off) { return w ? w + off : nullptr; }

void pack_q8_0(const float* x, const float* w, uint8_t* out) {
  int q[32];
  const float d = put_f16(out, fit_scale(x, w, 32, -127, 127, q));
  for (int i = 0; i < 32; ++i) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(d != 0 ? round_clamp(x[i] / d, -127, 127) : 0));
}

// Q4_K / Q5_K / Q2_K share the scale-and-min scheme: per sub-block (32 or 16 values) d_j and m_j fitted,
// then d_j ~ d * sc_j, m_j ~ dmin * mn_j with sc_j, mn_j integers in [0, smax], then the quants again.
struct ScaleMin {
  int sc[16], mn[16];
  float dl[16], ml[16];  // the decoded sub-scale and sub-min (d * sc_j, dmin * mn_j), as block_decode.h
};
int requant_min(float x, float dl, float ml, int qmax) { return dl > 0 ? round_clamp((x + ml) / dl, 0, qmax) : 0; }

// The weighted squared error of n values requantised under the decoded sub-scale dl and sub-min ml (each value
// dl * q - ml, as the decoders compute it).
double sub_error(const float* x, const float* w, int n, float dl, float ml, int qmax) {
  double e = 0;
  for (int i = 0; i < n; ++i) {
    const float v = dl * static_cast<float>(requant_min(x[i], dl, ml, qmax)) - ml;
    const double r = double(x[i]) - double(v);
    e += (w ? double(w[i]) : 1.0) * r * r;
  }
  return e;
}

// Sub-block j's integers on the block's (d, dmin) grid: from the nearest roundings of its fitted d_j / d and
// m_j / dmin, moves to the best of the pairs one step away (8 neighbours) while one fits the VALUES, requantised
// under it, better: a local optimum of the weighted error of the weights. Rounding each integer alone minimises the
// error of the scales, not of the weights (a sub-scale rounded down with its min rounded up can fit the values
// better). (Searching the block's d and dmin too, 7 x 7 steps of 2%, moved the KLD by < 0.2% on model 2 at 5x the
// time: not kept.)
void fit_sub_grid(const float* x, const float* w, int n, int qmax, int smax, float d, float dmin, float dj, float mj,
                  ScaleMin& s, int j) {
  int sc = d > 0 ? round_clamp(dj / d, 0, smax) : 0, mn = dmin > 0 ? round_clamp(mj / dmin, 0, smax) : 0;
  auto err_of = [&](int a, int b) { return sub_error(x, w, n, d * static_cast<float>(a), dmin * static_cast<float>(b), qmax); };
  double best = err_of(sc, mn);
  for (int moves = 0; moves < 16; ++moves) {  // each move lowers the error; a few suffice
    int bs = sc, bm = mn;
    for (int a = sc - 1; a <= sc + 1; ++a)
      for (int b = mn - 1; b <= mn + 1; ++b) {
        if (a < 0 || a > smax || b < 0 || b > smax || (a == sc && b == mn)) continue;
        const double e = err_of(a, b);
        if (e < best) best = e, bs = a, bm = b;
      }
    if (bs == sc && bm == mn) break;
    sc = bs, mn = bm;
  }
  s.sc[j] = sc, s.mn[j] = mn;
  s.dl[j] = d * static_cast<float>(sc), s.ml[j] = dmin * static_cast<float>(mn);
}

ScaleMin fit_scale_min_block(const float* x, const float* w, int nsub, int sub_n, int qmax, int smax, uint8_t* d_at,
                             uint8_t* dmin_at) {
  float ds[16], ms[16], dmax = 0, mmax = 0;
  int q[32];
  for (int j = 0; j < nsub; ++j) {
    ds[j] = fit_scale_min(x + j * sub_n, sub(w, j * sub_n), sub_n, qmax, q, &ms[j]);
    dmax = std::max(dmax, ds[j]), mmax = std::max(mmax, ms[j]);
  }
  const float d = put_f16(d_at, dmax / smax), dmin = put_f16(dmin_at, mmax / smax);
  ScaleMin s;
  for (int j = 0; j < nsub; ++j) fit_sub_grid(x + j * sub_n, sub(w, j * sub_n), sub_n, qmax, smax, d, dmin, ds[j], ms[j], s, j);
  return s;
}

// Q4_K / Q5_K (bits = 4 or 5): 8 sub-blocks of 32.
void pack_k45(const float* x, const float* w, uint8_t* out, int bits) {
  const int qmax = (1 << bits) - 1;
  const ScaleMin s = fit_scale_min_block(x, w, 8, 32, qmax, 63, out, out + 2);
  uint8_t* sc = out + 4;
  for (int j = 0; j < 4; ++j) {  // inverse of block_decode.h's k4_scale_min
    sc[j] = static_cast<uint8_t>(s.sc[j] | ((s.sc[j + 4] >> 4) << 6));
    sc[j + 4] = static_cast<uint8_t>(s.mn[j] | ((s.mn[j + 4] >> 4) << 6));
    sc[j + 8] = static_cast<uint8_t>((s.sc[j + 4] & 0xF) | ((s.mn[j + 4] & 0xF) << 4));
  }
  uint8_t* qh = out + 16;
  uint8_t* qs = bits == 4 ? out + 16 : out + 48;
  if (bits == 5) std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c)  // chunk c: sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles)
    for (int l = 0; l < 32; ++l) {
      const int lo = requant_min(x[64 * c + l], s.dl[2 * c], s.ml[2 * c], qmax);
      const int hi = requant_min(x[64 * c + 32 + l], s.dl[2 * c + 1], s.ml[2 * c + 1], qmax);
      qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      if (bits == 5) qh[l] = static_cast<uint8_t>(qh[l] | ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}
void pack_q4_k(const float* x, const float* w, uint8_t* out) { pack_k45(x, w, out, 4); }
void pack_q5_k(const float* x, const float* w, uint8_t* out) { pack_k45(x, w, out, 5); }

// Element e of a 256-block whose quants are 2-bit fields: byte 32 (e / 128) + e % 32, bit pair (e % 128) / 32.
int two_bit_byte(int e) { return 32 * (e / 128) + e % 32; }
int two_bit_shift(int e) { return 2 * ((e % 128) / 32); }

void pack_q2_k(const float* x, const float* w, uint8_t* out) {
  const ScaleMin s = fit_scale_min_block(x, w, 16, 16, 3, 15, out + 80, out + 82);
  for (int j = 0; j < 16; ++j) out[j] = static_cast<uint8_t>(s.sc[j] | (s.mn[j] << 4));
  uint8_t* qs = out + 16;
  std::memset(qs, 0, 64);
  for (int e = 0; e < 256; ++e)
    qs[two_bit_byte(e)] |= static_cast<uint8_t>(requant_min(x[e], s.dl[e / 16], s.ml[e / 16], 3) << two_bit_shift(e));
}

// Symmetric sub-scales (Q6_K, Q3_K, IQ4_XS): value = (d * s_j) * level(q), s_j integer in [smin, smax],
// level(q) = q (integer grids) or a codebook entry (IQ4_XS). Grid: nearest(v) -> index, level(index).
struct IntGrid {
  int lo, hi;
  int nearest(float v) const { return round_clamp(v, lo, hi); }
  float level(int q) const { return static_cast<float>(q); }
};
struct CodebookGrid {
  NearestLevel near{kIq4nlValues, 16};
  int nearest(float v) const { return near(v); }
  float level(int q) const { return static_cast<float>(kIq4nlValues[q]); }
};

struct SymBlock {
  float d = 0;   // the super-block scale as stored (f16-rounded)
  int s[16]{};   // sub-scales
  int q[256]{};  // grid indices
};

// The quants under (d, s) as decoded, and their weighted squared error.
template <class Grid>
double requant_sym(const float* x, const float* w, int nsub, int sub_n, const Grid& g, SymBlock& b) {
  double err = 0;
  for (int j = 0; j < nsub; ++j) {
    const float dl = b.d * static_cast<float>(b.s[j]);
    for (int i = j * sub_n; i < (j + 1) * sub_n; ++i) {
      b.q[i] = g.nearest(dl != 0 ? x[i] / dl : 0.0f);
      const double e = x[i] - double(dl * g.level(b.q[i]));
      err += (w ? w[i] : 1.0f) * e * e;
    }
  }
  return err;
}

// Fits d_j per sub-block (scale_search.h), d = max |d_j| / smax, s_j = round(d_j / d); then alternates
// least squares -- each s_j for the quants, then d for all of them -- and re-rounds the quants, keeping the
// best block by weighted error (the f16 rounding of d and the integer s_j make the first guess improvable).
template <class Grid>
SymBlock fit_sym_block(const float* x, const float* w, int nsub, int sub_n, int smin, int smax, const Grid& g,
                       float (*sub_fit)(const float*, const float*, int, int*)) {
  float ds[16], dabs = 0;
  int tq[32];
  for (int j = 0; j < nsub; ++j) {
    ds[j] = sub_fit(x + j * sub_n, sub(w, j * sub_n), sub_n, tq);
    dabs = std::max(dabs, std::fabs(ds[j]));
  }
  SymBlock best;
  best.d = f16_to_f32(f16_bits(dabs / smax));
  for (int j = 0; j < nsub; ++j) best.s[j] = best.d > 0 ? round_clamp(ds[j] / best.d, smin, smax) : 0;
  double best_err = requant_sym(x, w, nsub, sub_n, g, best);
  SymBlock b = best;
  for (int iter = 0; iter < 4 && best.d > 0; ++iter) {
    double sxy = 0, syy = 0;  // d for the current s_j and quants
    for (int j = 0; j < nsub; ++j) {
      double jxy = 0, jyy = 0;
      for (int i = j * sub_n; i < (j + 1) * sub_n; ++i) {
        const double l = g.level(b.q[i]), wi = w ? w[i] : 1.0f;
        jxy += wi * x[i] * l, jyy += wi * l * l;
      }
      if (jyy > 0) b.s[j] = round_clamp(static_cast<float>(jxy / jyy / b.d), smin, smax);
      sxy += double(b.s[j]) * jxy, syy += double(b.s[j]) * b.s[j] * jyy;
    }
    if (syy <= 0) break;
    b.d = f16_to_f32(f16_bits(static_cast<float>(sxy / syy)));
    if (b.d <= 0) break;
    const double err = requant_sym(x, w, nsub, sub_n, g, b);
    if (err < best_err) best_err = err, best = b;
  }
  return best;
}

float fit_q6(const float* x, const float* w, int n, int* q) { return fit_scale(x, w, n, -32, 31, q); }
float fit_q3(const float* x, const float* w, int n, int* q) { return fit_scale(x, w, n, -4, 3, q); }
float fit_iq4(const float* x, const float* w, int n, int* q) { return fit_scale_levels(x, w, n, kIq4nlValues, 16, q); }

void pack_q6_k(const float* x, const float* w, uint8_t* out) {
  const SymBlock b = fit_sym_block(x, w, 16, 16, -128, 127, IntGrid{-32, 31}, fit_q6);
  put_f16(out + 208, b.d);
  for (int j = 0; j < 16; ++j) out[192 + j] = static_cast<uint8_t>(static_cast<int8_t>(b.s[j]));
  uint8_t* ql = out;
  uint8_t* qh = out + 128;
  std::memset(out, 0, 192);
  for (int e = 0; e < 256; ++e) {
    const int q = b.q[e] + 32;
    const int h = e / 128, r = e % 128, k = r / 32, l = r % 32;  // k: which of the 4 quants of byte l
    ql[64 * h + l + 32 * (k & 1)] |= static_cast<uint8_t>((q & 0xF) << (4 * (k >> 1)));
    qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * k));
  }
}

void pack_q3_k(const float* x, const float* w, uint8_t* out) {
  const SymBlock b = fit_sym_block(x, w, 16, 16, -32, 31, IntGrid{-4, 3}, fit_q3);
  put_f16(out + 108, b.d);
  uint8_t* sc = out + 96;
  std::memset(out, 0, 108);
  for (int i = 0; i < 16; ++i) {  // inverse of block_decode.h's q3_k_scale
    const int u = b.s[i] + 32;
    sc[i < 8 ? i : i - 8] |= static_cast<uint8_t>((u & 0xF) << (i < 8 ? 0 : 4));
    sc[8 + i % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (i / 4)));
  }
  for (int e = 0; e < 256; ++e) {
    const int q = b.q[e] + 4;  // 0..7
    out[32 + two_bit_byte(e)] |= static_cast<uint8_t>((q & 3) << two_bit_shift(e));
    out[e % 32] |= static_cast<uint8_t>((q >> 2) << (4 * (e / 128) + (e % 128) / 32));
  }
}

void pack_iq4_xs(const float* x, const float* w, uint8_t* out) {
  const SymBlock b = fit_sym_block(x, w, 8, 32, -32, 31, CodebookGrid{}, fit_iq4);
  put_f16(out, b.d);
  unsigned scales_h = 0;
  std::memset(out + 4, 0, 132);
  for (int j = 0; j < 8; ++j) {
    const int ls = b.s[j] + 32;
    out[4 + j / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (j % 2)));
    scales_h |= static_cast<unsigned>(ls >> 4) << (2 * j);
    for (int i = 0; i < 32; ++i) out[8 + 16 * j + i % 16] |= static_cast<uint8_t>(b.q[32 * j + i] << (i < 16 ? 0 : 4));
  }
  out[2] = static_cast<uint8_t>(scales_h & 0xFF);
  out[3] = static_cast<uint8_t>(scales_h >> 8);
}

// The 32-element formats: one f16 scale (and Q4_1 / Q5_1 an f16 offset) per 32 values, the low nibble of
// qs[j] element j, the high one element j + 16, Q5's fifth bits in a 32-bit word (block_decode.h).
void put_nibbles(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    h |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  if (qh)
    for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(h >> (8 * k));
}

// Q4_0 / Q5_0: x = d (q - 2^(bits-1)), q in [0, 2^bits).
template <int kBits>
void pack_q45_0(const float* x, const float* w, uint8_t* out) {
  constexpr int half = 1 << (kBits - 1);
  int q[32];
  const float d = put_f16(out, fit_scale(x, w, 32, -half, half - 1, q));
  for (int i = 0; i < 32; ++i) q[i] = (d != 0 ? round_clamp(x[i] / d, -half, half - 1) : 0) + half;
  put_nibbles(q, out + (kBits == 5 ? 6 : 2), kBits == 5 ? out + 2 : nullptr);
}

// Q4_1 / Q5_1: x = d q + m, q in [0, 2^bits). fit_scale_min fits x ~ d q - m' with m' >= 0; a group whose
// values are all positive is shifted down to its minimum first, so its offset may be positive.
template <int kBits>
void pack_q45_1(const float* x, const float* w, uint8_t* out) {
  constexpr int qmax = (1 << kBits) - 1;
  const float shift = std::max(0.0f, *std::min_element(x, x + 32));
  float xs[32], mfit = 0;
  for (int i = 0; i < 32; ++i) xs[i] = x[i] - shift;
  int q[32];
  const float d = put_f16(out, fit_scale_min(xs, w, 32, qmax, q, &mfit));
  const float m = put_f16(out + 2, shift - mfit);
  for (int i = 0; i < 32; ++i) q[i] = d > 0 ? round_clamp((x[i] - m) / d, 0, qmax) : 0;
  put_nibbles(q, out + (kBits == 5 ? 8 : 4), kBits == 5 ? out + 4 : nullptr);
}

// IQ4_NL: x = d L[q] over IQ4_NL's 16 levels.
void pack_iq4_nl(const float* x, const float* w, uint8_t* out) {
  int q[32];
  const float d = put_f16(out, fit_iq4(x, w, 32, q));
  const NearestLevel nearest(kIq4nlValues, 16);
  for (int i = 0; i < 32; ++i) q[i] = d != 0 ? nearest(x[i] / d) : 0;
  put_nibbles(q, out + 2, nullptr);
}

}  // namespace

PackBlock block_packer(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8_0: return pack_q8_0;
    case WeightFormat::Q4_K: return pack_q4_k;
    case WeightFormat::Q5_K: return pack_q5_k;
    case WeightFormat::Q6_K: return pack_q6_k;
    case WeightFormat::Q3_K: return pack_q3_k;
    case WeightFormat::Q2_K: return pack_q2_k;
    case WeightFormat::IQ4_XS: return pack_iq4_xs;
    case WeightFormat::Q4_0: return pack_q45_0<4>;
    case WeightFormat::Q5_0: return pack_q45_0<5>;
    case WeightFormat::Q4_1: return pack_q45_1<4>;
    case WeightFormat::Q5_1: return pack_q45_1<5>;
    case WeightFormat::IQ4_NL: return pack_iq4_nl;
    default: return codebook_packer(f);  // the codebook i-quants (iq_pack.h), null for the rest
  }
}

}  // namespace k3::quant
