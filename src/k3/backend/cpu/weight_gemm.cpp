// Register-blocked multi-token matmul kernels (AVX2+FMA), bit-identical per output to the single-token
// dot of weight_kernels.cpp (the batch-invariance contract of weight_kernels.h).
//
// What makes them faster than n dots is only sharing: a tile of R rows x T tokens converts each weight
// vector once for T tokens (bf16/f16 widening, MXFP4 E2M1 decode + scale) and loads each activation
// vector once for R rows, so the FMA units, not loads and conversions, set the pace. What keeps them
// exact is that each (row, token) pair still owns the same accumulators as the dot, fed the same products
// in the same order and reduced by the same hsum and scalar tail: only the loop nest around that changed.
#include "k3/backend/cpu/weight_gemm.h"

#include <algorithm>

#include "k3/backend/cpu/weight_simd.h"

namespace k3::cpu {

using namespace simd;

namespace {

// ---- float formats (f32, bf16, f16): dot_loop's arithmetic, R rows x T tokens at once ----

// Two accumulators per (row, token), exactly dot_loop's a0 (lanes i..i+7 of each 16-step) and a1 (i+8..
// i+15). R = 2, T = 3 uses 12 accumulators + 2 weight vectors + 1 activation vector: 15 of the 16 ymm
// registers, and 12 independent FMA chains hide the FMA latency.
template <int R, int T, class Wt, class Load, class Scalar>
inline void float_tile(const Wt* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* y, int64_t ldy,
                       Load load8, Scalar to_f32) {
  __m256 acc[R][T][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t][0] = acc[r][t][1] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= cols; i += 16) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m256 wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = load8(w + r * ldw + i + 8 * h);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m256 xv = _mm256_loadu_ps(x + t * ldx + i + 8 * h);
        // Keep the activation vector in a register: left alone, GCC folds its load into each of the R
        // fmas, and the loop then waits on loads (16 per 12 fmas) instead of on the FMA units.
        asm("" : "+x"(xv));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t][h] = _mm256_fmadd_ps(wv[r], xv, acc[r][t][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      float s = hsum(_mm256_add_ps(acc[r][t][0], acc[r][t][1]));
      for (int64_t j = i; j < cols; ++j) s = std::fma(to_f32(w[r * ldw + j]), x[t * ldx + j], s);
      y[t * ldy + r] = s;
    }
}

// The tile for the m (1..3) tokens left at t0.
template <int R, class Wt, class Load, class Scalar>
inline void float_tile_m(int64_t m, const Wt* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* y,
                         int64_t ldy, Load load8, Scalar to_f32) {
  if (m >= 3)
    float_tile<R, 3>(w, ldw, x, ldx, cols, y, ldy, load8, to_f32);
  else if (m == 2)
    float_tile<R, 2>(w, ldw, x, ldx, cols, y, ldy, load8, to_f32);
  else
    float_tile<R, 1>(w, ldw, x, ldx, cols, y, ldy, load8, to_f32);
}

// Loop nest: blocks of rows whose weights (~256 KiB) stay in L2 while every token passes over them; in a
// block, a tile's 3 activation rows stay in L1 while the block's row pairs pass under them.
template <class Wt, class Load, class Scalar>
void float_gemm(const Wt* base, int64_t rows, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t n,
                float* y, Load load8, Scalar to_f32) {
  constexpr int64_t kBlockBytes = 256 << 10;
  const int64_t block = std::max<int64_t>(2, kBlockBytes / (cols * static_cast<int64_t>(sizeof(Wt))) / 2 * 2);
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += 3) {
      const int64_t m = std::min<int64_t>(3, n - t0);
      const float* xt = x + t0 * cols;
      float* yt = y + t0 * rows;
      int64_t r = b0;
      for (; r + 2 <= b1; r += 2)
        float_tile_m<2>(m, base + r * cols, cols, xt, cols, cols, yt + r, rows, load8, to_f32);
      if (r < b1) float_tile_m<1>(m, base + r * cols, cols, xt, cols, cols, yt + r, rows, load8, to_f32);
    }
  }
}

// ---- MXFP4: dot_mxfp4's arithmetic, one row x T tokens ----

// One accumulator per token, as dot_mxfp4; the row's group is decoded and its scale broadcast once for
// all T tokens. T = 8: 4 decoded vectors + 8 accumulators + the scale + a product = 14 ymm registers.
template <WeightFormat F, int T>
inline void mxfp4_tile(const uint8_t* packed, const uint8_t* scales, const float* x, int64_t ldx, int64_t cols,
                       float* y, int64_t ldy) {
  __m256 acc[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  __m256 w[4];
  for (int64_t g = 0; g < cols / kMxfp4Group; ++g) {
    const __m256 sc = mxfp4_scale(load_mxfp4_group<F>(packed, scales, g, w));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      acc[t] = _mm256_fmadd_ps(mxfp4_group_dot(w, x + t * ldx + g * kMxfp4Group), sc, acc[t]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(acc[t]);
}

using Mxfp4Tile = void (*)(const uint8_t*, const uint8_t*, const float*, int64_t, int64_t, float*, int64_t);
template <WeightFormat F>
constexpr Mxfp4Tile kMxfp4Tiles[9] = {nullptr,          mxfp4_tile<F, 1>, mxfp4_tile<F, 2>, mxfp4_tile<F, 3>, mxfp4_tile<F, 4>,
                                      mxfp4_tile<F, 5>, mxfp4_tile<F, 6>, mxfp4_tile<F, 7>, mxfp4_tile<F, 8>};

// Same blocking as float_gemm: a block of rows stays in cache while 8-token tiles pass over it.
template <WeightFormat F>
void mxfp4_gemm(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  constexpr int64_t kBlockBytes = 256 << 10, kT = 8;
  const int64_t cols = W.cols, rows = W.rows;
  const int64_t block = std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, row_data_bytes(W.format, cols)));
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kT) {
      const Mxfp4Tile tile = kMxfp4Tiles<F>[std::min(kT, n - t0)];
      for (int64_t r = b0; r < b1; ++r)
        tile(W.row_data(r), W.row_scales(r), x + t0 * cols, cols, cols, y + t0 * rows + r, rows);
    }
  }
}

}  // namespace

void gemm_f32(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  float_gemm(static_cast<const float*>(W.data), W.rows, W.cols, r0, r1, x, n, y,
             [](const float* p) { return _mm256_loadu_ps(p); }, [](float v) { return v; });
}
void gemm_bf16(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  float_gemm(static_cast<const uint16_t*>(W.data), W.rows, W.cols, r0, r1, x, n, y,
             [](const uint16_t* p) { return load_bf16x8(p); }, [](uint16_t v) { return bf16_to_f32(v); });
}
void gemm_f16(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  float_gemm(static_cast<const uint16_t*>(W.data), W.rows, W.cols, r0, r1, x, n, y,
             [](const uint16_t* p) { return load_f16x8(p); }, [](uint16_t v) { return f16_to_f32(v); });
}

void gemm_mxfp4(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  mxfp4_gemm<WeightFormat::MXFP4>(W, r0, r1, x, n, y);
}
void gemm_mxfp4_ggml(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  mxfp4_gemm<WeightFormat::MXFP4_GGML>(W, r0, r1, x, n, y);
}

}  // namespace k3::cpu
