#include "k3/quant/iq_pack.h"

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstring>

#include "k3/quant/block_decode_iq.h"
#include "k3/quant/iq1_search.h"
#include "k3/quant/iq_codebook.h"
#include "k3/quant/iq_scales.h"

namespace k3::quant {

namespace {

// The sign byte of each 8 weights (bit i: weight i is stored negated) and the targets the magnitude
// search fits: |x|. With even_parity (the 7-bit sign codes of IQ2_XXS, IQ2_XS, IQ3_XXS, whose 8th bit is
// implied by an even number of negated weights) an odd count must flip one weight to the wrong sign; its
// target becomes -|x|, which the smallest magnitude a then approximates at cost ~ w (|x| + a)^2 instead of
// ~ w (|x| - a)^2 when |x| is small: an extra 4 a w |x|, so the weight with the least w |x| is flipped.
void fold_signs(const float* x, const float* w, bool even_parity, float* v, uint8_t* signs) {
  for (int u = 0; u < 32; ++u) {
    unsigned s = 0;
    for (int i = 0; i < 8; ++i) {
      v[8 * u + i] = std::fabs(x[8 * u + i]);
      s |= static_cast<unsigned>(std::signbit(x[8 * u + i])) << i;
    }
    if (even_parity && std::popcount(s) % 2 == 1) {
      int cheapest = 0;
      for (int i = 1; i < 8; ++i)
        if (w[8 * u + i] * v[8 * u + i] < w[8 * u + cheapest] * v[8 * u + cheapest]) cheapest = i;
      s ^= 1u << cheapest;
      v[8 * u + cheapest] = -v[8 * u + cheapest];
    }
    signs[u] = static_cast<uint8_t>(s);
  }
}

uint16_t f16_of(float exact_f16_value) { return _cvtss_sh(exact_f16_value, _MM_FROUND_TO_NEAREST_INT); }
void put_u16(uint8_t* p, unsigned v) { p[0] = static_cast<uint8_t>(v), p[1] = static_cast<uint8_t>(v >> 8); }
void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// A block of a magnitude-grid format, searched: its scales and, per scale group, the grid entries (in the
// order of the group's points).
struct GridBlock {
  float w[256], v[256];
  uint8_t signs[32];
  BlockScales scales;
  int entries[64];  // one per point of 4 or 8 weights
};

void search_grid_block(WeightFormat f, const float* x, const float* importance, int group_elems, bool even_parity,
                       SubScaleCode code, GridBlock& b) {
  error_weights(x, importance, 256, b.w);
  fold_signs(x, b.w, even_parity, b.v, b.signs);
  const MagnitudeGrid& grid = magnitude_grid(f);
  MagnitudeSearch search(grid, b.v, b.w, group_elems);
  b.scales = fit_block_scales(search, code);
  const int per_group = group_elems / grid.dims;
  for (int j = 0; j < search.scale_groups(); ++j) {
    const float mu = b.scales.d * code.c * static_cast<float>(2 * b.scales.q[j] + 1);
    if (mu > 0) search.fit(j, mu, b.entries + j * per_group);
    else std::fill(b.entries + j * per_group, b.entries + (j + 1) * per_group, 0);
  }
}

// The u32 of IQ2_XXS / IQ3_XXS per 32 weights: four 7-bit sign codes (bits 0..27) and the 4-bit scale q on top.
uint32_t scale_and_sign_codes(const GridBlock& b, int ib) {
  uint32_t aux = static_cast<uint32_t>(b.scales.q[ib]) << 28;
  for (int l = 0; l < 4; ++l) aux |= static_cast<uint32_t>(b.signs[4 * ib + l] & 127) << (7 * l);
  return aux;
}

// IQ2_XXS: value = d (0.5 + q) / 4 g = d (2q + 1) / 8 g; per 32 weights 4 one-byte indices and a u32 of four
// 7-bit sign codes and the 4-bit q.
void pack_iq2_xxs(const float* x, const float* w, uint8_t* out) {
  GridBlock b;
  search_grid_block(WeightFormat::IQ2_XXS, x, w, 32, true, {1.0f / 8, 15}, b);
  put_u16(out, f16_of(b.scales.d));
  for (int ib = 0; ib < 8; ++ib) {
    for (int l = 0; l < 4; ++l) out[2 + 8 * ib + l] = static_cast<uint8_t>(b.entries[4 * ib + l]);
    put_u32(out + 2 + 8 * ib + 4, scale_and_sign_codes(b, ib));
  }
}

// IQ2_XS: q per 16 weights; per 8 weights a u16 of the 9-bit index and the 7-bit sign code.
void pack_iq2_xs(const float* x, const float* w, uint8_t* out) {
  GridBlock b;
  search_grid_block(WeightFormat::IQ2_XS, x, w, 16, true, {1.0f / 8, 15}, b);
  put_u16(out, f16_of(b.scales.d));
  for (int u = 0; u < 32; ++u) put_u16(out + 2 + 2 * u, static_cast<unsigned>(b.entries[u]) | ((b.signs[u] & 127u) << 9));
  for (int ib = 0; ib < 8; ++ib) out[66 + ib] = static_cast<uint8_t>(b.scales.q[2 * ib] | (b.scales.q[2 * ib + 1] << 4));
}

// IQ2_S: free sign bytes; 10-bit indices as a low byte and 2 bits of qh.
void pack_iq2_s(const float* x, const float* w, uint8_t* out) {
  GridBlock b;
  search_grid_block(WeightFormat::IQ2_S, x, w, 16, false, {1.0f / 8, 15}, b);
  put_u16(out, f16_of(b.scales.d));
  std::memset(out + 66, 0, 8);
  for (int u = 0; u < 32; ++u) {
    out[2 + u] = static_cast<uint8_t>(b.entries[u]);
    out[34 + u] = b.signs[u];
    out[66 + u / 4] |= static_cast<uint8_t>((b.entries[u] >> 8) << (2 * (u % 4)));
  }
  for (int ib = 0; ib < 8; ++ib) out[74 + ib] = static_cast<uint8_t>(b.scales.q[2 * ib] | (b.scales.q[2 * ib + 1] << 4));
}

// IQ3_XXS: value = d (0.5 + q) / 2 g; per 32 weights 8 one-byte indices of 4 weights, then (at 66) a u32 of
// four 7-bit sign codes (8 weights each) and q.
void pack_iq3_xxs(const float* x, const float* w, uint8_t* out) {
  GridBlock b;
  search_grid_block(WeightFormat::IQ3_XXS, x, w, 32, true, {1.0f / 4, 15}, b);
  put_u16(out, f16_of(b.scales.d));
  for (int ib = 0; ib < 8; ++ib) {
    for (int m = 0; m < 8; ++m) out[2 + 8 * ib + m] = static_cast<uint8_t>(b.entries[8 * ib + m]);
    put_u32(out + 66 + 4 * ib, scale_and_sign_codes(b, ib));
  }
}

// IQ3_S: value = d (1 + 2q) g; 9-bit indices of 4 weights (low byte + a bit of qh), free sign bytes, q as
// nibbles.
void pack_iq3_s(const float* x, const float* w, uint8_t* out) {
  GridBlock b;
  search_grid_block(WeightFormat::IQ3_S, x, w, 32, false, {1.0f, 15}, b);
  put_u16(out, f16_of(b.scales.d));
  std::memset(out + 66, 0, 8);
  std::memset(out + 106, 0, 4);
  for (int p = 0; p < 64; ++p) {
    out[2 + p] = static_cast<uint8_t>(b.entries[p]);
    out[66 + p / 8] |= static_cast<uint8_t>((b.entries[p] >> 8) << (p % 8));
  }
  std::memcpy(out + 74, b.signs, 32);
  for (int ib = 0; ib < 8; ++ib) out[106 + ib / 2] |= static_cast<uint8_t>(b.scales.q[ib] << (4 * (ib % 2)));
}

// IQ1_S / IQ1_M: value = d (2q + 1) (g +- 1/8).
struct Iq1Block {
  float w[256];
  BlockScales scales;
  int entries[32];  // 11-bit index | delta negative << 11, per 8 weights
};

void search_iq1_block(const float* x, const float* importance, int group_elems, int delta_elems, Iq1Block& b) {
  error_weights(x, importance, 256, b.w);
  Iq1Search search(x, b.w, group_elems, delta_elems);
  b.scales = fit_block_scales(search, {1.0f, 7});
  const int per_group = group_elems / 8;
  for (int j = 0; j < search.scale_groups(); ++j) {
    const float mu = b.scales.d * static_cast<float>(2 * b.scales.q[j] + 1);
    if (mu > 0) search.fit(j, mu, b.entries + j * per_group);
    else std::fill(b.entries + j * per_group, b.entries + (j + 1) * per_group, 0);
  }
}

// IQ1_S: per 32 weights 4 low index bytes and a u16: 3 high bits per index, q in bits 12-14, delta sign 15.
void pack_iq1_s(const float* x, const float* w, uint8_t* out) {
  Iq1Block b;
  search_iq1_block(x, w, 32, 32, b);
  put_u16(out, f16_of(b.scales.d));
  for (int ib = 0; ib < 8; ++ib) {
    unsigned qh = static_cast<unsigned>(b.scales.q[ib]) << 12 | ((b.entries[4 * ib] >> 11) & 1u) << 15;
    for (int l = 0; l < 4; ++l) {
      out[2 + 4 * ib + l] = static_cast<uint8_t>(b.entries[4 * ib + l]);
      qh |= ((b.entries[4 * ib + l] >> 8) & 7u) << (3 * l);
    }
    put_u16(out + 34 + 2 * ib, qh);
  }
}

// IQ1_M: q per 16 weights (3 bits each, packed in 4 u16 at 48 whose top nibbles hold d's f16 bits), a delta
// sign per 8 weights beside its 3 high index bits in a nibble of qh.
void pack_iq1_m(const float* x, const float* w, uint8_t* out) {
  Iq1Block b;
  search_iq1_block(x, w, 16, 8, b);
  std::memset(out + 32, 0, 24);
  for (int u = 0; u < 32; ++u) {
    out[u] = static_cast<uint8_t>(b.entries[u]);
    const unsigned nibble = ((b.entries[u] >> 8) & 7u) | ((b.entries[u] >> 11) & 1u) << 3;
    out[32 + u / 2] |= static_cast<uint8_t>(nibble << (4 * (u % 2)));
  }
  unsigned sc[4] = {};
  const unsigned h = f16_of(b.scales.d);
  for (int ib = 0; ib < 8; ++ib)
    sc[ib / 2] |= static_cast<unsigned>(b.scales.q[2 * ib] | (b.scales.q[2 * ib + 1] << 3)) << (6 * (ib % 2));
  for (int i = 0; i < 4; ++i) put_u16(out + 48 + 2 * i, sc[i] | ((h >> (4 * i)) & 0xF) << 12);
}

}  // namespace

PackBlock codebook_packer(WeightFormat f) {
  switch (f) {
    case WeightFormat::IQ2_XXS: return pack_iq2_xxs;
    case WeightFormat::IQ2_XS: return pack_iq2_xs;
    case WeightFormat::IQ2_S: return pack_iq2_s;
    case WeightFormat::IQ3_XXS: return pack_iq3_xxs;
    case WeightFormat::IQ3_S: return pack_iq3_s;
    case WeightFormat::IQ1_S: return pack_iq1_s;
    case WeightFormat::IQ1_M: return pack_iq1_m;
    default: return nullptr;
  }
}

}  // namespace k3::quant
