// The avx2int8 kernel tier: for CPUs with AVX2 + FMA + F16C and no AVX-512 (Zen 2/3, Haswell..Alder Lake
// without VNNI). MXFP4 weights (both layouts) and every GGUF block format run on int8 activations
// with AVX2's integer multiply-adds instead of converting every weight to fp32 (the avx2 tier's MXFP4 and
// K-quant dots are compute-bound: docs/perf/cpu.md, "Session 13" / "Session 14"), as llama.cpp's AVX2
// vec_dot_*_q8 kernels. Like avx512bf16 the products are NOT the exact fp32 products; every other format
// (BF16, F32, F16) runs the avx2 tier's exact kernels (weight_kernels.cpp's table); since session 16 every GGUF
// block format has int8 kernels here.
//
// - Activations: the avx512bf16 tier's quads (q8_quads_simd.h; docs/perf/cpu.md), same definition and same
//   layout, only without the +128 offset: per pair of 32-blocks 64 int8 (bytes 0-15 the even elements of
//   g0, 16-31 the even of g1, 32-47 the odd of g0, 48-63 the odd of g1), then 16 fp32 scales, one per quad
//   of 4 consecutive bytes; d = max|x| / 127 rounded up, q = round(x / d) in [-127, 127], a NaN / inf in
//   the quad gives d = NaN. AVX2 has no division with a rounding mode: d = a / 127 rounded to nearest is
//   bumped one ulp up when fma(d, 127, -a) < 0 (the exact sign of d 127 - a), which is the round-up
//   quotient bit for bit (quantise_quads8). CpuKernels.Int8QuadActivationsMatchScalarDefinition checks the
//   bytes and scales against a scalar definition (and the avx512bf16 tier's where the CPU has it).
// - Products: _mm256_maddubs_epi16(u8 a, s8 b) sums two u8 x s8 products into an int16 with SATURATION,
//   then _mm256_madd_epi16(., 1) sums two int16 into an int32: 4 products per int32 lane, the grouping of
//   vpdpbusd, so a quad's sum is one lane. The weights are signed (doubled E2M1: -12..12), so a = |w| and
//   b = sign(w) x q (_mm256_sign_epi8; w = 0 gives 0): |a b| <= 12 x 127, a pair sums to <= 3048 <= 32767,
//   no saturation, and the int32 quad sums are exact (|sum| <= 6096). (The VNNI kernels' q + 128 offset
//   would fit MXFP4 (2 x 12 x 255) but not Q8_0 (2 x 127 x 255 > 32767), and needs a correction term per
//   lane; the sign trick costs one vpsignb per token and vector and needs none.)
// - Per (row, token, pair of groups): f = cvt(lo) d_lo + cvt(hi) d_hi (the even and odd quads of the same
//   8 weight lanes: one fp32 product, one fma), then acc = fma(f, 0.5 x 2^(e8m0 - 127) per lane, acc); one
//   8-lane accumulator per (row, token), one horizontal sum at the end.
//
// - GGUF block formats: the same quads, in natural order per 32 values (quad j = values 4j..4j+3, as the
//   VNNI kernels' q8k layout), with the fp32 sums of each 16 unrounded activations for the sub-mins; the
//   weights come from the exact tiers' decoders (quant_decode_simd.h: 32 int8 quants and the sub-scale /
//   sub-min of each 16) into a Sink that multiplies them at once (SegSink): the same sign trick, |q| <= 128
//   (Q8_0's -128 the extreme: 2 x 128 x 127 = 32512 <= 32767), fp32 sub-scales per 16 lanes, the sub-mins
//   against the unrounded sums in a scalar fp32 accumulator (value = d q - m: sum = sum_q - sum_m).
//
// Batch invariance (weight_kernels.h): a token is converted by the same code whatever n is, and each (row,
// token) pair runs the same operations in the same order in every tile size (T = 1 is the dot).
#include "k3/backend/cpu/weight_kernels_avx2int8.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/backend/cpu/quant_decode_simd.h"
#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/core/format_dispatch.h"
#include "k3/backend/cpu/weight_simd.h"
#include "k3/backend/cpu/weight_simd512.h"  // kHalfE8m0 (plain constexpr table)

namespace k3::cpu {

namespace {

// ---- activations: int8 quads (the avx512bf16 tier's definition, q8_quads_simd.h, without the offset) ----

constexpr int64_t kQ8PairBytes = 128;  // 64 int8 + 16 fp32 quad scales per pair of 32-blocks
constexpr int64_t q8_stride(int64_t cols) { return (cols / kMxfp4Group + 1) / 2 * kQ8PairBytes; }

// 8 activations = 2 quads (one per 128-bit lane): q (int32 per lane) and d (the quad's scale in every lane
// of its quad). d = max|x| / 127 rounded up: nearest, plus one ulp when d 127 < max|x| exactly.
inline void quantise_quads8(__m256 v, __m256i& q, __m256& d) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 a = _mm256_and_ps(v, abs_mask);
  a = _mm256_max_ps(a, _mm256_permute_ps(a, 0xB1));  // max within pairs, then within the quad (128-bit lane)
  a = _mm256_max_ps(a, _mm256_permute_ps(a, 0x4E));
  __m256 poison = _mm256_mul_ps(v, _mm256_setzero_ps());  // NaN where x is NaN or inf, else +-0
  poison = _mm256_add_ps(poison, _mm256_permute_ps(poison, 0xB1));
  poison = _mm256_add_ps(poison, _mm256_permute_ps(poison, 0x4E));
  const __m256 k127 = _mm256_set1_ps(127.f);
  __m256 dn = _mm256_div_ps(a, k127);
  const __m256 below = _mm256_cmp_ps(_mm256_fmsub_ps(dn, k127, a), _mm256_setzero_ps(), _CMP_LT_OQ);
  dn = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(dn), _mm256_castps_si256(below)));  // +1 ulp
  d = _mm256_add_ps(dn, poison);
  // d > 0 divides; an all-zero quad (q = 0) and a NaN one (its outputs are NaN through d) divide by 1.
  const __m256 div = _mm256_blendv_ps(_mm256_set1_ps(1.f), d, _mm256_cmp_ps(d, _mm256_setzero_ps(), _CMP_GT_OQ));
  q = _mm256_cvtps_epi32(_mm256_div_ps(v, div));
}

// 32 activations as 4 vectors of 2 quads (v[k]: quads 2k in its low lane, 2k + 1 in its high lane) to the
// 32 bytes of quads 0..7 in order (saturated to int8 as vpmovsdb does: a NaN's 0x80000000 gives -128) and
// their 8 scales.
inline void quantise32(const __m256 v[4], __m256i& bytes, __m256& scales) {
  __m256i q[4];
  __m256 d[4];
  for (int k = 0; k < 4; ++k) quantise_quads8(v[k], q[k], d[k]);
  // packs work per 128-bit lane: dwords come out as quads 0 2 4 6 1 3 5 7.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  bytes = _mm256_permutevar8x32_epi32(b, order);
  const __m256 s = _mm256_shuffle_ps(_mm256_shuffle_ps(d[0], d[1], 0), _mm256_shuffle_ps(d[2], d[3], 0), _MM_SHUFFLE(2, 0, 2, 0));
  scales = _mm256_permutevar8x32_ps(s, order);
}

// One 32-block of a token: its even elements (quads 0-3) and odd elements (quads 4-7).
inline void quantise_group(const float* xg, __m256i& bytes, __m256& scales) {
  __m256 v[4];
  for (int h = 0; h < 2; ++h) {
    const __m256 a = _mm256_loadu_ps(xg + 16 * h), b = _mm256_loadu_ps(xg + 16 * h + 8);
    // shuffle_ps gives 64-bit pieces [a0 a2][b0 b2][a4 a6][b4 b6]; permute4x64 puts them in element order.
    v[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0))), 0xD8));
    v[2 + h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))), 0xD8));
  }
  quantise32(v, bytes, scales);
}

// n tokens to the pair layout (see the file comment); a missing g1 (cols % 64 == 32) has q = 0, d = 0.
void q8_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  const int64_t groups = cols / kMxfp4Group, ldq = q8_stride(cols);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t p = 0; p * 2 < groups; ++p) {
      uint8_t* o = out + t * ldq + p * kQ8PairBytes;
      float* d = reinterpret_cast<float*>(o + 64);
      for (int b = 0; b < 2; ++b) {
        __m256i bytes = _mm256_setzero_si256();
        __m256 scales = _mm256_setzero_ps();
        if (2 * p + b < groups) quantise_group(x + t * cols + (2 * p + b) * kMxfp4Group, bytes, scales);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * b), _mm256_castsi256_si128(bytes));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 + 16 * b), _mm256_extracti128_si256(bytes, 1));
        _mm_storeu_ps(d + 4 * b, _mm256_castps256_ps128(scales));
        _mm_storeu_ps(d + 8 + 4 * b, _mm256_extractf128_ps(scales, 1));
      }
    }
}

// ---- MXFP4 x int8 quads ----

// One pair of groups of a row, decoded: w_lo / w_hi the doubled E2M1 values (int8) of the even / odd
// elements in q8_tokens' byte order, a_lo / a_hi their magnitudes, wsc = 0.5 x 2^(e8m0 - 127) of g0 in
// lanes 0-3, of g1 in 4-7 (0 when g1 does not exist).
struct PairW {
  __m256i w_lo, w_hi, a_lo, a_hi;
  __m256 wsc;
};

inline __m256i e2m1x2_table256() { return _mm256_broadcastsi128_si256(simd::e2m1x2_table()); }

inline PairW finish_pair(__m256i lo, __m256i hi, uint8_t s0, uint8_t s1, bool two) {
  PairW p;
  p.w_lo = _mm256_shuffle_epi8(e2m1x2_table256(), lo);
  p.w_hi = _mm256_shuffle_epi8(e2m1x2_table256(), hi);
  p.a_lo = _mm256_abs_epi8(p.w_lo);
  p.a_hi = _mm256_abs_epi8(p.w_hi);
  p.wsc = _mm256_setr_m128(_mm_set1_ps(simd512::kHalfE8m0[s0]), _mm_set1_ps(two ? simd512::kHalfE8m0[s1] : 0.f));
  return p;
}

// HF layout (16 packed bytes per group, low nibble = even element; scales apart). A lone last group reads
// only its own 16 bytes (its partner's nibbles are 0: the weight 0).
inline PairW decode_pair(const uint8_t* packed, const uint8_t* scales, bool two) {
  const __m128i g0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i g1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + 16)) : _mm_setzero_si128();
  const __m256i b = _mm256_setr_m128i(g0, g1), m = _mm256_set1_epi8(0x0f);
  return finish_pair(_mm256_and_si256(b, m), _mm256_and_si256(_mm256_srli_epi16(b, 4), m), scales[0], two ? scales[1] : 0, two);
}

// ggml's layout (17-byte blocks {e8m0, qs[16]}, element j = low nibble of qs[j], j + 16 = its high nibble):
// the same w as decode_pair for the same values. Even elements: low then high nibbles of qs[0, 2, .. 14];
// odd: of qs[1, 3, .. 15].
inline PairW decode_pair_ggml(const uint8_t* blocks, bool two) {
  const __m128i g0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 1));
  const __m128i g1 = two ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 18)) : _mm_setzero_si128();
  const __m256i even_odd = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
  const __m256i b = _mm256_shuffle_epi8(_mm256_setr_m128i(g0, g1), even_odd), m = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_and_si256(b, m), hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), m);
  return finish_pair(_mm256_unpacklo_epi64(lo, hi), _mm256_unpackhi_epi64(lo, hi), blocks[0], two ? blocks[17] : 0, two);
}

// The exact int32 quad sums of w . q (4 products per lane): |w| x (sign(w) q) pairwise in int16 (no
// saturation, see the file comment), then pairs of int16 into int32.
inline __m256i quad_sums(__m256i a, __m256i w, __m256i q) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(q, w)), _mm256_set1_epi16(1));
}

// One row x T tokens (token t's converted row at xq + t * ldq) over all pairs: y[t * ldy].
template <WeightFormat F, int T>
__attribute__((always_inline)) inline void mxfp4_q8_tile(const uint8_t* packed, const uint8_t* scales, int64_t groups,
                                                         const uint8_t* xq, int64_t ldq, float* y, int64_t ldy) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const int64_t pairs = (groups + 1) / 2;
  for (int64_t p = 0; p < pairs; ++p) {
    const bool two = 2 * p + 1 < groups;
    const PairW w = F == WeightFormat::MXFP4_GGML ? decode_pair_ggml(packed + 34 * p, two)
                                                  : decode_pair(packed + 32 * p, scales + 2 * p, two);
    for (int t = 0; t < T; ++t) {
      const uint8_t* q = xq + t * ldq + p * kQ8PairBytes;
      const __m256i lo = quad_sums(w.a_lo, w.w_lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
      const __m256i hi = quad_sums(w.a_hi, w.w_hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32)));
      const float* d = reinterpret_cast<const float*>(q + 64);
      const __m256 f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hi), _mm256_loadu_ps(d + 8),
                                       _mm256_mul_ps(_mm256_cvtepi32_ps(lo), _mm256_loadu_ps(d)));
      acc[t] = _mm256_fmadd_ps(f, w.wsc, acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = simd::hsum(acc[t]);
}

// Row r of an MXFP4 matrix for T tokens (avx2int8_rows' K).
template <WeightFormat F>
struct Mxfp4Rows {
  template <int T>
  static void row(const WeightMatrix& W, int64_t r, const uint8_t* xq, int64_t ldq, float* y, int64_t ldy) {
    mxfp4_q8_tile<F, T>(W.row_data(r), W.scales ? W.row_scales(r) : nullptr, W.cols / kMxfp4Group, xq, ldq, y, ldy);
  }
};

// 6 tokens: 6 accumulators + 4 weight vectors, the scales, the ones and temporaries in 16 ymm (6 ran the
// expert GEMMs ~20% faster than 4 on Zen 3).
constexpr int kMxfp4T = 6;

// ---- GGUF block formats x int8 quads ----

// The converted activations of a block format, per 32 values ("segment", kSegBytes): the 32 int8 of
// quantise32 in natural order (quad j = values 4j..4j+3), their 8 quad scales, then the fp32 sums of the
// two halves' 16 UNROUNDED activations (for the sub-mins: the min part carries no activation rounding).
constexpr int64_t kSegBytes = 32 + 32 + 8;
constexpr int64_t seg_stride(int64_t cols) { return cols / 32 * kSegBytes; }

void seg_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < cols / 32; ++s) {
      const float* xs = x + t * cols + 32 * s;
      uint8_t* o = out + t * seg_stride(cols) + s * kSegBytes;
      const __m256 v[4] = {_mm256_loadu_ps(xs), _mm256_loadu_ps(xs + 8), _mm256_loadu_ps(xs + 16), _mm256_loadu_ps(xs + 24)};
      __m256i bytes;
      __m256 scales;
      quantise32(v, bytes, scales);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o), bytes);
      _mm256_storeu_ps(reinterpret_cast<float*>(o + 32), scales);
      const float sums[2] = {simd::hsum(_mm256_add_ps(v[0], v[1])), simd::hsum(_mm256_add_ps(v[2], v[3]))};
      std::memcpy(o + 64, sums, 8);
    }
}

// The Sink (quant_decode_simd.h) of one row x T tokens: each 32 decoded quants meet the tokens' segments
// at once. Quants of every format here are within [-128, 127] (Q8_0 the widest), so |w| <= 128 and a
// maddubs pair sums to <= 2 x 128 x 127 = 32512 <= 32767: exact. Per segment and token: the quad sums
// times their scales (fp32), one fma by the sub-scales (d0 in lanes 0-3 = values 0-15, d1 in 4-7); the
// sub-mins (kMin formats) go into a scalar accumulator with two fmas against the unrounded sums.
template <int T>
struct SegSink {
  const uint8_t* xq;  // the block's first segment of token 0; token t's at + t * ldq
  int64_t ldq;
  __m256 acc[T];
  float macc[T];

  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float m0, float d1, float m1) {
    const __m256i a = _mm256_sign_epi8(v, v);  // |v|; -128 gives the byte 0x80 = 128 as maddubs' u8
    const __m256 wsc = _mm256_setr_m128(_mm_set1_ps(d0), _mm_set1_ps(d1));
    const uint8_t* seg = xq + i / 32 * kSegBytes;
    for (int t = 0; t < T; ++t) {
      const uint8_t* q = seg + t * ldq;
      const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      // kMin quants are unsigned (the Sink contract): v is already |v| and carries no signs to move onto q,
      // so maddubs takes them as they are -- the same products, two instructions fewer per token.
      const __m256i p = kMin ? _mm256_madd_epi16(_mm256_maddubs_epi16(v, qv), _mm256_set1_epi16(1)) : quad_sums(a, v, qv);
      const __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(p), _mm256_loadu_ps(reinterpret_cast<const float*>(q + 32)));
      acc[t] = _mm256_fmadd_ps(f, wsc, acc[t]);
      if constexpr (kMin) {
        float s[2];
        std::memcpy(s, q + 64, 8);
        macc[t] = std::fma(m1, s[1], std::fma(m0, s[0], macc[t]));
      }
    }
  }
};

// One row x T tokens over all its blocks: y[t * ldy] = sum - mins. (Tiles of 4 rows at one token, to overlap
// the rows' accumulator chains, measured 2x SLOWER end to end on a Zen 3 core in session 15: the sinks'
// accumulators left the registers.)
template <WeightFormat F, int T>
__attribute__((always_inline)) inline void quant_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, int64_t ldq,
                                                      float* y, int64_t ldy) {
  constexpr int64_t BB = weight_layout(F).block_bytes, BE = weight_layout(F).block_elems;
  SegSink<T> s;
  s.ldq = ldq;
  for (int t = 0; t < T; ++t) s.acc[t] = _mm256_setzero_ps(), s.macc[t] = 0.f;
  for (int64_t b = 0; b < blocks; ++b) {
    s.xq = xq + b * (BE / 32) * kSegBytes;
    qsimd::decode_into<F>(row + b * BB, s);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = simd::hsum(s.acc[t]) - s.macc[t];
}

// Row r of a block-format matrix for T tokens (avx2int8_rows' K).
template <WeightFormat F>
struct QuantRows {
  template <int T>
  static void row(const WeightMatrix& W, int64_t r, const uint8_t* xq, int64_t ldq, float* y, int64_t ldy) {
    quant_tile<F, T>(W.row_data(r), W.cols / weight_layout(F).block_elems, xq, ldq, y, ldy);
  }
};

constexpr int kQuantT = 6;


template <WeightFormat F>
const RowKernels* kernels_of(const RowKernels& exact) {
  static const RowKernels k = act_path::kernels<Avx2Int8Path<Mxfp4Rows<F>, kMxfp4T, q8_stride, q8_tokens>>(exact);
  return &k;
}

template <WeightFormat F>
const RowKernels* quant_kernels() {
  static const RowKernels k = act_path::kernels<Avx2Int8Path<QuantRows<F>, kQuantT, seg_stride, seg_tokens>>(*avx2_quant_row_kernels(F));
  return &k;
}

}  // namespace

// Rows [r0, r1) x n converted tokens (ldq bytes apart): y[t * ldy + (r - r0)], tiles[m - 1] doing m tokens.
// Blocks of rows (~128 KiB of weights) stay in L2 while every token tile passes over them; a tile's converted
// tokens stream from L1/L2.
void avx2int8_run_tiles(const Avx2Int8TileFn* tiles, int64_t nt, const WeightMatrix& W, int64_t r0, int64_t r1,
                        const uint8_t* xq, int64_t ldq, int64_t n, float* y, int64_t ldy) {
  if (n == 1) {
    tiles[0](W, r0, r1, xq, ldq, y, ldy);
    return;
  }
  const int64_t block = std::max<int64_t>(1, (128 << 10) / std::max<int64_t>(1, row_data_bytes(W.format, W.cols)));
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += nt) {
      const int64_t m = std::min(nt, n - t0);
      tiles[m - 1](W, b0, b1, xq + t0 * ldq, ldq, y + t0 * ldy + (b0 - r0), ldy);
    }
  }
}

const RowKernels* avx2int8_row_kernels(WeightFormat f, const RowKernels& exact) {
  switch (f) {
    case WeightFormat::MXFP4: return kernels_of<WeightFormat::MXFP4>(exact);
    case WeightFormat::MXFP4_GGML: return kernels_of<WeightFormat::MXFP4_GGML>(exact);
    default: return nullptr;
  }
}

const RowKernels* avx2int8_quant_row_kernels(WeightFormat f) {
  // Q4_K, Q5_K, Q6_K on per-block activations (weight_kernels_avx2int8_k.cpp); every other block format on the
  // quads: its SIMD decoder hands 32 int8 quants to the Sink (|q| <= 128: Q8_0's -128 the extreme, Q3_K -4..3,
  // Q2_K 0..3 with mins, the i-quants' grid magnitudes, IQ4_XS / IQ4_NL's levels, the 32-element formats'
  // llama-quantize fallbacks), as the avx512bf16 tier's VNNI kernels take them.
  return with_gguf_block_format(
      f,
      [](auto c) -> const RowKernels* {
        constexpr WeightFormat F = decltype(c)::value;
        if constexpr (F == WeightFormat::Q4_K || F == WeightFormat::Q5_K || F == WeightFormat::Q6_K)
          return avx2int8_k_row_kernels(F);
        else
          return quant_kernels<F>();
      },
      avx2_quant_row_kernels(f));
}

}  // namespace k3::cpu
