// The avx512 kernel tier: dot, dequant and register-blocked gemm per weight format, 16-lane fp32 FMA with
// weights widened exactly in registers. Same contract as the avx2 tier (weight_kernels.h): within this
// tier, gemm's y[t][r] has the bits of dot(W, r, x_t); across tiers results differ by rounding only
// (different lane counts, so a different summation order).
//
// Batch invariance by construction: the single-token dot IS the 1x1 tile of the gemm (float formats) or
// the 1-token tile (MXFP4), and a tile's (row, token) pair owns its accumulators whatever the tile size.
//
// Every function here is compiled for AVX-512 (the pragmas below), everything else in the binary is not.
// GCC 12 warns "'__Y' (may be) used uninitialized" inside its own AVX-512 headers (the undefined-vector
// operand of masked intrinsics, a false positive); the warning's location is the intrinsic header, so it
// is silenced for this file before anything is included.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "k3/backend/cpu/weight_kernels_avx512.h"

#include <algorithm>
#include <array>
#include <utility>

#include "k3/backend/cpu/weight_simd512.h"

K3_AVX512_BEGIN

namespace k3::cpu {

using namespace simd512;

namespace {

// ---- float formats (f32, bf16, f16) ----

// A tile's share of the columns. The gemm cuts long rows into blocks of columns so that a token tile's
// activations stay in L1 while the rows pass over them (else every row re-reads T tokens x cols x 4
// bytes from L2: 96 KiB per row at T = 12, cols = 2048, and L2 bandwidth, not the FMA units, sets the
// pace). Between blocks the accumulators wait in `state` (stored and reloaded exactly), so a (row, token)
// pair sees the same accumulator, the same products in the same order and the same reduction as the
// single-token dot, whatever the blocking: only the loop nest changes (weight_kernels.h).
struct KSpan {
  int64_t k0, k1;   // columns [k0, k1); k0 a multiple of 32; k1 == cols for the last block
  bool first, last;  // first: start from zero (else reload state); last: finish and reduce into y
  __m512* state;     // R x T x 2 (float) or T (MXFP4) accumulators between blocks; unused by one-block calls
};
inline KSpan whole_row(int64_t cols) { return {0, cols, true, true, nullptr}; }

// R rows x T tokens; two 16-lane accumulators per (row, token): a0 takes lanes i..i+15 of each 32-step,
// a1 lanes i+16..i+31, then finish_dot. R = 2, T = 6: 24 accumulators + 2 weight vectors + 1 activation
// vector of the 32 zmm registers.
//
// The T tokens' activations come packed for the tile (pack_float_tokens): for each 32-column step from
// k0, T x 32 floats (token t at + t * 32), and in the last block the cols % 32 tail as T x 32 more. One
// token's packed layout is its plain row, so the dot passes x itself; the gemm packs once per token tile
// and column block, and then every activation address is one base pointer plus a constant.
template <int R, int T, class Wt, class Load>
inline void float_tile(const Wt* w, int64_t ldw, const float* xp, int64_t cols, float* y, int64_t ldy, Load load,
                       KSpan ks) {
  __m512 acc[R][T][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h) acc[r][t][h] = ks.first ? _mm512_setzero_ps() : ks.state[(r * T + t) * 2 + h];
  int64_t i = ks.k0;
  for (; i + 32 <= ks.k1; i += 32, xp += T * 32) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512 wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = load(w + r * ldw + i + 16 * h);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512 xv = _mm512_loadu_ps(xp + t * 32 + 16 * h);
        asm("" : "+v"(xv));  // one load per activation vector, not one folded into each fma (weight_gemm.cpp)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t][h] = _mm512_fmadd_ps(wv[r], xv, acc[r][t][h]);
      }
    }
  }
  if (!ks.last) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < 2; ++h) ks.state[(r * T + t) * 2 + h] = acc[r][t][h];
    return;
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      y[t * ldy + r] = finish_dot(acc[r][t][0], acc[r][t][1], w + r * ldw + i, xp + t * 32, 0, cols - i, load);
}

template <int R, class Wt, class Load, size_t... T>
constexpr auto float_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const Wt*, int64_t, const float*, int64_t, float*, int64_t, Load, KSpan);
  return std::array<Tile, sizeof...(T)>{float_tile<R, static_cast<int>(T) + 1, Wt, Load>...};
}

constexpr int64_t kFloatT = 6;
// Columns per block: a 6-token tile's activations, 6 x 1024 x 4 bytes = 24 KiB, half of L1.
constexpr int64_t kFloatKCols = 1024;
// Rows whose accumulators wait between column blocks: 128 x 6 x 2 zmm = 96 KiB of stack, in L2 (more rows
// per block = fewer packings of the token tile; 64 measured 2-8% slower).
constexpr int64_t kStateRows = 128;

// Tokens [0, m) of x (rows of cols floats), columns [k0, k1), into float_tile's packed layout.
void pack_float_tokens(const float* x, int64_t cols, int64_t m, int64_t k0, int64_t k1, float* xp) {
  int64_t i = k0;
  for (; i + 32 <= k1; i += 32)
    for (int64_t t = 0; t < m; ++t, xp += 32) {
      _mm512_storeu_ps(xp, _mm512_loadu_ps(x + t * cols + i));
      _mm512_storeu_ps(xp + 16, _mm512_loadu_ps(x + t * cols + i + 16));
    }
  if (i < k1)  // the tail of the last block (finish_dot reads only its cols % 32 values)
    for (int64_t t = 0; t < m; ++t, xp += 32) {
      const int64_t k = k1 - i;
      _mm512_storeu_ps(xp, _mm512_maskz_loadu_ps(first_lanes(std::min<int64_t>(k, 16)), x + t * cols + i));
      _mm512_storeu_ps(xp + 16, k > 16 ? _mm512_maskz_loadu_ps(first_lanes(k - 16), x + t * cols + i + 16)
                                       : _mm512_setzero_ps());
    }
}

// Blocks of rows whose weights (~512 KiB) stay in L2 while every token tile passes over them; within
// a block, each token tile runs over the row pairs one column block at a time (KSpan). Rows that fit in
// one column block need no parked accumulators, so their row blocks are not capped at kStateRows.
template <class Wt, class Load>
void float_gemm(const Wt* base, int64_t rows, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t n,
                float* y) {
  static constexpr auto tiles2 = float_tiles<2, Wt, Load>(std::make_index_sequence<kFloatT>());
  static constexpr auto tiles1 = float_tiles<1, Wt, Load>(std::make_index_sequence<kFloatT>());
  const int64_t row_bytes = cols * static_cast<int64_t>(sizeof(Wt));
  const int64_t kblocks = (cols + kFloatKCols - 1) / kFloatKCols;
  const int64_t block = std::clamp<int64_t>((512 << 10) / row_bytes / 2 * 2, 2, kblocks > 1 ? kStateRows : 1 << 20);
  __m512 state[kStateRows * kFloatT * 2];
  // The token tile's column block, packed where the tile reads it (fresh in L1: packing the whole call
  // once into one buffer was 15% slower, its blocks having gone to L2 by the time they are read).
  alignas(64) float xp[(kFloatKCols / 32 + 1) * kFloatT * 32];
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kFloatT) {
      const int64_t m = std::min(kFloatT, n - t0);
      float* yt = y + t0 * rows;
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const bool last = kb + 1 == kblocks;
        const int64_t k0 = kb * kFloatKCols, k1 = last ? cols : k0 + kFloatKCols;
        pack_float_tokens(x + t0 * cols, cols, m, k0, k1, xp);
        int64_t r = b0;
        for (; r + 2 <= b1; r += 2)
          tiles2[m - 1](base + r * cols, cols, xp, cols, yt + r, rows, Load{},
                        {k0, k1, kb == 0, last, state + (r - b0) % kStateRows * kFloatT * 2});
        if (r < b1)
          tiles1[m - 1](base + r * cols, cols, xp, cols, yt + r, rows, Load{},
                        {k0, k1, kb == 0, last, state + (r - b0) % kStateRows * kFloatT * 2});
      }
    }
  }
}

template <class Wt, class Load>
float float_dot(const WeightMatrix& W, int64_t r, const float* x) {
  float y;
  float_tile<1, 1>(static_cast<const Wt*>(W.data) + r * W.cols, W.cols, x, W.cols, &y, 1, Load{}, whole_row(W.cols));
  return y;
}

template <class Wt, class Load>
void float_gemm_of(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  float_gemm<Wt, Load>(static_cast<const Wt*>(W.data), W.rows, W.cols, r0, r1, x, n, y);
}

// Exact widening, 16 at a time, the last cols % 16 masked.
template <class Wt, class Load>
void float_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const Wt* p = static_cast<const Wt*>(W.data) + r * W.cols;
  int64_t i = 0;
  for (; i + 16 <= W.cols; i += 16) _mm512_storeu_ps(out + i, Load{}(p + i));
  if (i < W.cols) {
    const __mmask16 m = first_lanes(W.cols - i);
    _mm512_mask_storeu_ps(out + i, m, Load{}(p + i, m));
  }
}

// ---- MXFP4: one 16-lane accumulator per (row, token); a group decoded once for T tokens ----

// T tokens' activations for groups [k0/32, k1/32) packed group by group: group g of token t at
// xp + (g - k0/32) * T * 32 + t * 32. With one token that is the plain row, so the dot needs no copy; the
// gemm packs each token tile once per column block, and then every address in the tile is one base
// pointer plus a constant (12 token pointers and their offsets had spilled accumulators to the stack).
template <WeightFormat F, int T>
void mxfp4_tile(const uint8_t* packed, const uint8_t* scales, const float* xp, float* y, int64_t ldy, KSpan ks) {
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = ks.first ? _mm512_setzero_ps() : ks.state[t];
  __m512 w[2];
  const int64_t g0 = ks.k0 / kMxfp4Group, g1 = ks.k1 / kMxfp4Group;
  for (int64_t g = g0; g < g1; ++g, xp += T * kMxfp4Group) {
    const __m512 sc = mxfp4_scale(load_mxfp4_group<F>(packed, scales, g, w));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(mxfp4_group_dot(w, xp + t * kMxfp4Group), sc, acc[t]);
  }
  if (!ks.last) {
    for (int t = 0; t < T; ++t) ks.state[t] = acc[t];
    return;
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = _mm512_reduce_add_ps(acc[t]);
}

template <WeightFormat F, size_t... T>
constexpr auto mxfp4_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const uint8_t*, const uint8_t*, const float*, float*, int64_t, KSpan);
  return std::array<Tile, sizeof...(T)>{mxfp4_tile<F, static_cast<int>(T) + 1>...};
}

constexpr int64_t kMxfp4T = 12;  // 12 accumulators + 2 weights + scale + product: 16 of 32 registers
// Columns per block: 12 tokens x 512 x 4 bytes = 24 KiB of packed activations, half of L1.
constexpr int64_t kMxfp4KCols = 512;

template <WeightFormat F>
float mxfp4_dot(const WeightMatrix& W, int64_t r, const float* x) {
  float y;
  mxfp4_tile<F, 1>(W.row_data(r), W.row_scales(r), x, &y, 1, whole_row(W.cols));
  return y;
}

// Tokens [t0, t0 + m) x columns [k0, k1) into mxfp4_tile's layout for a tile of m tokens.
void pack_mxfp4_tokens(const float* x, int64_t cols, int64_t m, int64_t k0, int64_t k1, float* xp) {
  for (int64_t g = k0 / kMxfp4Group; g < k1 / kMxfp4Group; ++g)
    for (int64_t t = 0; t < m; ++t, xp += kMxfp4Group) {
      const float* src = x + t * cols + g * kMxfp4Group;
      _mm512_storeu_ps(xp, _mm512_loadu_ps(src));
      _mm512_storeu_ps(xp + 16, _mm512_loadu_ps(src + 16));
    }
}

template <WeightFormat F>
void mxfp4_gemm(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  static constexpr auto tiles = mxfp4_tiles<F>(std::make_index_sequence<kMxfp4T>());
  const int64_t cols = W.cols, rows = W.rows;
  const int64_t kblocks = (cols + kMxfp4KCols - 1) / kMxfp4KCols;
  // Rows that fit in one column block park no accumulators: their row blocks are not capped (fewer packings).
  const int64_t block = std::clamp<int64_t>((512 << 10) / std::max<int64_t>(1, row_data_bytes(W.format, cols)), 1,
                                            kblocks > 1 ? kStateRows : 1 << 20);
  __m512 state[kStateRows * kMxfp4T];
  alignas(64) float xp[kMxfp4T * kMxfp4KCols];  // the token tile's column block, packed (fresh in L1)
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kMxfp4T) {
      const int64_t m = std::min(kMxfp4T, n - t0);
      const auto tile = tiles[m - 1];
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const bool last = kb + 1 == kblocks;
        const int64_t k0 = kb * kMxfp4KCols, k1 = last ? cols : k0 + kMxfp4KCols;
        pack_mxfp4_tokens(x + t0 * cols, cols, m, k0, k1, xp);
        for (int64_t r = b0; r < b1; ++r)
          tile(W.row_data(r), W.row_scales(r), xp, y + t0 * rows + r, rows,
               {k0, k1, kb == 0, last, state + (r - b0) % kStateRows * kMxfp4T});
      }
    }
  }
}

template <WeightFormat F>
void mxfp4_dequant(const WeightMatrix& W, int64_t r, float* out) {
  const uint8_t* p = W.row_data(r);
  const uint8_t* s = W.row_scales(r);
  __m512 w[2];
  for (int64_t g = 0; g < W.cols / kMxfp4Group; ++g) {
    const __m512 sc = mxfp4_scale(load_mxfp4_group<F>(p, s, g, w));
    _mm512_storeu_ps(out + g * 32, _mm512_mul_ps(w[0], sc));
    _mm512_storeu_ps(out + g * 32 + 16, _mm512_mul_ps(w[1], sc));
  }
}

constexpr RowKernels kF32{float_dot<float, LoadF32>, float_dequant<float, LoadF32>, float_gemm_of<float, LoadF32>, nullptr};
constexpr RowKernels kF16{float_dot<uint16_t, LoadF16>, float_dequant<uint16_t, LoadF16>,
                          float_gemm_of<uint16_t, LoadF16>, nullptr};
constexpr RowKernels kBF16{float_dot<uint16_t, LoadBf16>, float_dequant<uint16_t, LoadBf16>,
                           float_gemm_of<uint16_t, LoadBf16>, nullptr};
constexpr RowKernels kMXFP4{mxfp4_dot<WeightFormat::MXFP4>, mxfp4_dequant<WeightFormat::MXFP4>,
                            mxfp4_gemm<WeightFormat::MXFP4>, nullptr};
constexpr RowKernels kMXFP4Ggml{mxfp4_dot<WeightFormat::MXFP4_GGML>, mxfp4_dequant<WeightFormat::MXFP4_GGML>,
                                mxfp4_gemm<WeightFormat::MXFP4_GGML>, nullptr};

}  // namespace

}  // namespace k3::cpu

K3_AVX512_END

namespace k3::cpu {

const RowKernels* avx512_row_kernels(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return &kF32;
    case WeightFormat::F16: return &kF16;
    case WeightFormat::BF16: return &kBF16;
    case WeightFormat::MXFP4: return &kMXFP4;
    case WeightFormat::MXFP4_GGML: return &kMXFP4Ggml;
    default: return nullptr;  // GGUF's block formats: weight_kernels_quant_avx512.cpp
  }
}

}  // namespace k3::cpu
