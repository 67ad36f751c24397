// The avx512bf16 tier's kernels of GGUF's block formats (Q8_0, the K formats, IQ4_XS, the codebook
// i-quants): int8 weights x int8 activations with vpdpbusd (AVX512_VNNI), the activations converted once
// per matmul call (act_convert_path.h), as llama.cpp's CPU backend does (its vec_dot_*_q8_K / q8_0).
// Like the tier's MXFP4 kernels the products are NOT the exact fp32 products (docs/perf/cpu.md):
//
// - Activations: int8 with one fp32 scale per QUAD of 4 consecutive values (the 4 bytes one vpdpbusd lane
//   sums; q8_quads_simd.h): d = max|x| / 127 rounded up, q = round(x / d), |d q - x| <= d/2 (1 + 2^-16).
//   llama.cpp keeps one scale per 256 (Q8_K) or per 32 (Q8_0) and applies the weights' sub-scales in
//   int16/int32; here every int32 lane is scaled in fp32 anyway (the sub-scales differ per 16 or 32 lanes),
//   so a scale per quad costs the kernel nothing, and an outlier coarsens 3 neighbours instead of 255.
// - Weights: each block's decoder (quant_decode_simd.h, the exact tiers' decoders) hands 32 int8 quants
//   with their fp32 sub-scale and sub-min per 16 values (value = dl * q - ml); two such halves make one
//   64-value chunk: w (int8), wsc (dl per lane), and corr = -128 x (sum of each lane's 4 quants), which
//   cancels the +128 of the unsigned activation bytes (vpdpbusd is u8 x s8), shared by a tile's tokens.
// - Per (row, token, chunk): one vpdpbusd (the exact int32 quad sums q_x . q_w), int -> float, times the
//   quads' d (fp32), one fma by dl into the token's 16-lane accumulator. Formats with sub-mins (Q4_K,
//   Q5_K, Q2_K): after each 256-block, one fnmadd of the 16 ml by the fp32 sums of the UNROUNDED
//   activations over each 16 values (computed once per token in prepare), so the min part carries no
//   activation rounding at all. One reduction per (row, token) at the end.
//
// Batch invariance (weight_kernels.h): a token is converted by the same code whatever n is, and each
// (row, token) pair runs the same operations in the same order in every tile size (T = 1 is the dot);
// column blocks park the accumulators exactly. A NaN / inf activation poisons its quad's d (NaN output).
//
// Only the functions between K3_AVX512BF16_BEGIN/END are compiled for the tier; the drivers are plain code.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/backend/cpu/weight_kernels_avx512bf16.h"
#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/backend/cpu/weight_simd512.h"
#include "k3/core/dtype.h"
#include "k3/core/weight_format.h"
#include "k3/quant/iq_tables.h"

namespace k3::cpu {

namespace {

// The converted activations of one token, unit by unit. A unit is 64 values (Q8_0: one pair of its
// 32-blocks; the last pair of a row of odd block count has q = 0, d = 0 in its second half) or 256
// (the K and i-quant formats' blocks). Per 64 values ("chunk"): 64 bytes q + 128 in natural order, then
// the 16 quads' scales (fp32); a 256-unit adds the 16 fp32 sums of each 16 unrounded activations.
constexpr int64_t kChunkBytes = 128;
constexpr int64_t kUnit256Bytes = 4 * kChunkBytes + 64;

constexpr bool is_q8_0(WeightFormat f) { return f == WeightFormat::Q8_0; }
constexpr int64_t unit_elems(WeightFormat f) { return is_q8_0(f) ? 64 : 256; }
constexpr int64_t unit_bytes(WeightFormat f) { return is_q8_0(f) ? kChunkBytes : kUnit256Bytes; }
constexpr int64_t units(WeightFormat f, int64_t cols) { return (cols + unit_elems(f) - 1) / unit_elems(f); }
// Formats whose values carry a sub-min (value = dl q - ml).
constexpr bool has_min(WeightFormat f) {
  return f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q2_K;
}

}  // namespace

}  // namespace k3::cpu

K3_AVX512BF16_BEGIN

// Inside the target region: the static inline decoders and the quad quantiser are compiled for the tier
// in this file only.
#include "k3/backend/cpu/q8_quads_simd.h"
#include "k3/backend/cpu/quant_decode_simd.h"

namespace k3::cpu {

namespace {

// ---- activations ----

// Tokens of a 256-unit format: per unit 4 chunks of quads, then the 16 sums of 16 (fp32, each the same
// 16-lane reduction whatever n).
void q8k_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  const int64_t nu = cols / 256;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t u = 0; u < nu; ++u) {
      const float* xu = x + t * cols + u * 256;
      uint8_t* o = out + (t * nu + u) * kUnit256Bytes;
      for (int c = 0; c < 4; ++c)
        for (int k = 0; k < 4; ++k)
          q8::quantise_quads(_mm512_loadu_ps(xu + 64 * c + 16 * k), o + kChunkBytes * c + 16 * k,
                             reinterpret_cast<float*>(o + kChunkBytes * c + 64) + 4 * k);
      float* sums = reinterpret_cast<float*>(o + 4 * kChunkBytes);
      for (int k = 0; k < 16; ++k) sums[k] = _mm512_reduce_add_ps(_mm512_loadu_ps(xu + 16 * k));
    }
}

// Tokens of Q8_0 (cols a multiple of 32): chunks of 64, a missing second half as q = 0, d = 0.
void q8_0_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  const int64_t nu = units(WeightFormat::Q8_0, cols);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t u = 0; u < nu; ++u) {
      uint8_t* o = out + (t * nu + u) * kChunkBytes;
      float* d = reinterpret_cast<float*>(o + 64);
      for (int k = 0; k < 4; ++k) {
        const int64_t i = u * 64 + 16 * k;
        if (i < cols) {
          q8::quantise_quads(_mm512_loadu_ps(x + t * cols + i), o + 16 * k, d + 4 * k);
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * k), _mm_set1_epi8(static_cast<char>(0x80)));
          _mm_storeu_ps(d + 4 * k, _mm_setzero_ps());
        }
      }
    }
}

// ---- weights x activations ----

// The decoders' Sink (quant_decode_simd.h) of one row x T tokens: it pairs the 32-value halves into
// 64-value chunks and runs each chunk against the T tokens at once (so a row's weights are decoded once
// per tile of tokens). xq: the unit's activations, token t at xq + t * UB.
template <int T, int64_t UB>
struct Q8Sink {
  __m512 acc[T];
  const uint8_t* xq;
  int base = 0;          // where the decoder's element 0 sits in the unit (Q8_0's second block: 32)
  __m256i half;          // the chunk's first 32 quants, waiting for the second
  float hd0, hd1;        // their sub-scales (values 0-15, 16-31)
  alignas(64) float mins[16];  // the unit's 16 sub-mins, one per 16 values (formats with mins)

  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float m0, float d1, float m1) {
    i += base;
    if constexpr (kMin) mins[i / 16] = m0, mins[i / 16 + 1] = m1;
    if ((i & 32) == 0) {
      half = v, hd0 = d0, hd1 = d1;
      return;
    }
    chunk(i - 32, _mm512_inserti64x4(_mm512_castsi256_si512(half), v, 1), _mm_setr_ps(hd0, hd1, d0, d1));
  }

  // Values [c0, c0 + 64) of the unit: w their quants, dl4 the sub-scales of each 16.
  __attribute__((always_inline)) void chunk(int c0, __m512i w, __m128 dl4) {
    const __m512 wsc = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                             _mm512_castps128_ps512(dl4));
    const __m512i corr = _mm512_sub_epi32(
        _mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w));
    const uint8_t* q = xq + c0 / 64 * kChunkBytes;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512i dp = _mm512_dpbusd_epi32(corr, _mm512_loadu_si512(q + t * UB), w);
      const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dp), _mm512_loadu_ps(reinterpret_cast<const float*>(q + t * UB + 64)));
      acc[t] = _mm512_fmadd_ps(f, wsc, acc[t]);
    }
  }

  // After a 256-unit of a format with mins: acc -= ml . (sums of the unrounded activations).
  __attribute__((always_inline)) void apply_mins() {
    const __m512 m = _mm512_load_ps(mins);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fnmadd_ps(m, _mm512_loadu_ps(reinterpret_cast<const float*>(xq + t * UB + 4 * kChunkBytes)), acc[t]);
  }
};

// A tile's share of the units: [u0, u1); between blocks the accumulators wait in `state` (exactly).
struct UnitSpan {
  int64_t u0, u1;
  bool first, last;
  __m512* state;  // T accumulators between blocks
};

// One row x T tokens over units [u0, u1) of a token tile packed unit by unit (unit u of token t at
// xq + (u - u0) * T * UB + t * UB; with one token that is the plain converted row).
template <WeightFormat F, int T>
void q8_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, float* y, int64_t ldy, UnitSpan us) {
  constexpr int64_t UB = unit_bytes(F), BB = weight_layout(F).block_bytes;
  Q8Sink<T, UB> s;
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) s.acc[t] = us.first ? _mm512_setzero_ps() : us.state[t];
  for (int64_t u = us.u0; u < us.u1; ++u, xq += T * UB) {
    s.xq = xq;
    if constexpr (is_q8_0(F)) {
      s.base = 0;
      qsimd::decode_into<F>(row + 2 * u * BB, s);
      if (2 * u + 1 < blocks) {
        s.base = 32;
        qsimd::decode_into<F>(row + (2 * u + 1) * BB, s);
      } else {  // the row's last block has no partner: zero weights (and its activations are q = 0, d = 0)
        s.base = 0;
        s.template put32q<false>(32, _mm256_setzero_si256(), 0.f, 0.f, 0.f, 0.f);
      }
    } else {
      qsimd::decode_into<F>(row + u * BB, s);
      if constexpr (has_min(F)) s.apply_mins();
    }
  }
  if (!us.last) {
    for (int t = 0; t < T; ++t) us.state[t] = s.acc[t];
    return;
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = _mm512_reduce_add_ps(s.acc[t]);
}

template <WeightFormat F, size_t... T>
constexpr auto q8_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const uint8_t*, int64_t, const uint8_t*, float*, int64_t, UnitSpan);
  return std::array<Tile, sizeof...(T)>{q8_tile<F, static_cast<int>(T) + 1>...};
}

constexpr int64_t kQ8T = 12;             // 12 accumulators + weights, correction, scales, temporaries
constexpr int64_t kTileActBytes = 24 << 10;  // packed activations of a token tile per column block: half of L1
constexpr int64_t kQ8StateRows = 64;     // rows whose accumulators wait between column blocks: 48 KiB

// Rows [r0, r1) x n converted tokens: y[t * ldy + (r - r0)]. Blocks of rows (~256 KiB of weights) stay in
// L2 while every token tile passes over them, one column block of units at a time (packed, fresh in L1).
template <WeightFormat F>
void q8_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t n, float* y, int64_t ldy) {
  static constexpr auto tiles = q8_tiles<F>(std::make_index_sequence<kQ8T>());
  constexpr int64_t UB = unit_bytes(F);
  const int64_t cols = W.cols, nu = units(F, cols), ldq = nu * UB, blocks = cols / weight_layout(F).block_elems;
  if (n == 1) {  // one token (decode): its converted row is the packed layout, nothing to block or copy
    for (int64_t r = r0; r < r1; ++r) tiles[0](W.row_data(r), blocks, xq, y + (r - r0), ldy, {0, nu, true, true, nullptr});
    return;
  }
  constexpr int64_t kBlockUnits = std::max<int64_t>(1, kTileActBytes / (kQ8T * UB));
  const int64_t block = std::clamp<int64_t>((256 << 10) / std::max<int64_t>(1, row_data_bytes(F, cols)), 1, kQ8StateRows);
  const int64_t kblocks = (nu + kBlockUnits - 1) / kBlockUnits;
  __m512 state[kQ8StateRows * kQ8T];
  alignas(64) uint8_t xp[kQ8T * kBlockUnits * UB];
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kQ8T) {
      const int64_t m = std::min(kQ8T, n - t0);
      const auto tile = tiles[m - 1];
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t u0 = kb * kBlockUnits, u1 = std::min(nu, u0 + kBlockUnits);
        const uint8_t* xt = m == 1 ? xq + t0 * ldq + u0 * UB : xp;  // one token: its row is the packed layout
        uint8_t* o = xp;
        for (int64_t u = u0; u < u1 && m > 1; ++u)
          for (int64_t t = 0; t < m; ++t, o += UB) std::memcpy(o, xq + (t0 + t) * ldq + u * UB, UB);
        for (int64_t r = b0; r < b1; ++r)
          tile(W.row_data(r), blocks, xt, y + t0 * ldy + (r - r0), ldy,
               {u0, u1, kb == 0, kb + 1 == kblocks, state + (r - b0) * kQ8T});
      }
    }
  }
}

}  // namespace

}  // namespace k3::cpu

K3_AVX512BF16_END

// ---- plain code: the Paths (act_convert_path.h builds the RowKernels entries) ----

namespace k3::cpu {

namespace {

template <WeightFormat F>
struct QuantPath {
  static int64_t stride_bytes(int64_t cols) { return units(F, cols) * unit_bytes(F); }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) {
    if constexpr (is_q8_0(F))
      q8_0_tokens(x, n, cols, out);
    else
      q8k_tokens(x, n, cols, out);
  }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    q8_rows<F>(W, r0, r1, act, n, y, ldy);
  }
};

template <WeightFormat F>
const RowKernels* quant_kernels() {
  static const RowKernels k = act_path::kernels<QuantPath<F>>(*avx512_quant_row_kernels(F));
  return &k;
}

}  // namespace

const RowKernels* avx512bf16_quant_row_kernels(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8_0: return quant_kernels<WeightFormat::Q8_0>();
    case WeightFormat::Q4_K: return quant_kernels<WeightFormat::Q4_K>();
    case WeightFormat::Q5_K: return quant_kernels<WeightFormat::Q5_K>();
    case WeightFormat::Q6_K: return quant_kernels<WeightFormat::Q6_K>();
    case WeightFormat::Q3_K: return quant_kernels<WeightFormat::Q3_K>();
    case WeightFormat::Q2_K: return quant_kernels<WeightFormat::Q2_K>();
    case WeightFormat::IQ4_XS: return quant_kernels<WeightFormat::IQ4_XS>();
    case WeightFormat::IQ3_XXS: return quant_kernels<WeightFormat::IQ3_XXS>();
    case WeightFormat::IQ3_S: return quant_kernels<WeightFormat::IQ3_S>();
    case WeightFormat::IQ2_XXS: return quant_kernels<WeightFormat::IQ2_XXS>();
    case WeightFormat::IQ2_XS: return quant_kernels<WeightFormat::IQ2_XS>();
    case WeightFormat::IQ2_S: return quant_kernels<WeightFormat::IQ2_S>();
    case WeightFormat::IQ1_S: return quant_kernels<WeightFormat::IQ1_S>();
    case WeightFormat::IQ1_M: return quant_kernels<WeightFormat::IQ1_M>();
    default: return nullptr;
  }
}

}  // namespace k3::cpu
