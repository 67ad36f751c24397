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

// R rows x T tokens; two 16-lane accumulators per (row, token): a0 takes lanes i..i+15 of each 32-step,
// a1 lanes i+16..i+31, then finish_dot. R = 2, T = 6: 24 accumulators + 2 weight vectors + 1 activation
// vector of the 32 zmm registers.
template <int R, int T, class Wt, class Load>
inline void float_tile(const Wt* w, int64_t ldw, const float* x, int64_t ldx, int64_t cols, float* y, int64_t ldy,
                       Load load) {
  __m512 acc[R][T][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t][0] = acc[r][t][1] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= cols; i += 32) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512 wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = load(w + r * ldw + i + 16 * h);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512 xv = _mm512_loadu_ps(x + t * ldx + i + 16 * h);
        asm("" : "+v"(xv));  // one load per activation vector, not one folded into each fma (weight_gemm.cpp)
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t][h] = _mm512_fmadd_ps(wv[r], xv, acc[r][t][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      y[t * ldy + r] = finish_dot(acc[r][t][0], acc[r][t][1], w + r * ldw, x + t * ldx, i, cols, load);
}

template <int R, class Wt, class Load, size_t... T>
constexpr auto float_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const Wt*, int64_t, const float*, int64_t, int64_t, float*, int64_t, Load);
  return std::array<Tile, sizeof...(T)>{float_tile<R, static_cast<int>(T) + 1, Wt, Load>...};
}

constexpr int64_t kFloatT = 6;

// Blocks of rows whose weights (~512 KiB) stay in L2 while every token passes over them.
template <class Wt, class Load>
void float_gemm(const Wt* base, int64_t rows, int64_t cols, int64_t r0, int64_t r1, const float* x, int64_t n,
                float* y) {
  static constexpr auto tiles2 = float_tiles<2, Wt, Load>(std::make_index_sequence<kFloatT>());
  static constexpr auto tiles1 = float_tiles<1, Wt, Load>(std::make_index_sequence<kFloatT>());
  constexpr int64_t kBlockBytes = 512 << 10;
  const int64_t block = std::max<int64_t>(2, kBlockBytes / (cols * static_cast<int64_t>(sizeof(Wt))) / 2 * 2);
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kFloatT) {
      const int64_t m = std::min(kFloatT, n - t0);
      const float* xt = x + t0 * cols;
      float* yt = y + t0 * rows;
      int64_t r = b0;
      for (; r + 2 <= b1; r += 2) tiles2[m - 1](base + r * cols, cols, xt, cols, cols, yt + r, rows, Load{});
      if (r < b1) tiles1[m - 1](base + r * cols, cols, xt, cols, cols, yt + r, rows, Load{});
    }
  }
}

template <class Wt, class Load>
float float_dot(const WeightMatrix& W, int64_t r, const float* x) {
  float y;
  float_tile<1, 1>(static_cast<const Wt*>(W.data) + r * W.cols, W.cols, x, W.cols, W.cols, &y, 1, Load{});
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

template <WeightFormat F, int T>
void mxfp4_tile(const uint8_t* packed, const uint8_t* scales, const float* x, int64_t ldx, int64_t cols, float* y,
                int64_t ldy) {
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  __m512 w[2];
  for (int64_t g = 0; g < cols / kMxfp4Group; ++g) {
    const __m512 sc = mxfp4_scale(load_mxfp4_group<F>(packed, scales, g, w));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      acc[t] = _mm512_fmadd_ps(mxfp4_group_dot(w, x + t * ldx + g * kMxfp4Group), sc, acc[t]);
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = _mm512_reduce_add_ps(acc[t]);
}

template <WeightFormat F, size_t... T>
constexpr auto mxfp4_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const uint8_t*, const uint8_t*, const float*, int64_t, int64_t, float*, int64_t);
  return std::array<Tile, sizeof...(T)>{mxfp4_tile<F, static_cast<int>(T) + 1>...};
}

constexpr int64_t kMxfp4T = 12;  // 12 accumulators + 2 weights + scale + product: 16 of 32 registers

template <WeightFormat F>
float mxfp4_dot(const WeightMatrix& W, int64_t r, const float* x) {
  float y;
  mxfp4_tile<F, 1>(W.row_data(r), W.row_scales(r), x, W.cols, W.cols, &y, 1);
  return y;
}

template <WeightFormat F>
void mxfp4_gemm(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  static constexpr auto tiles = mxfp4_tiles<F>(std::make_index_sequence<kMxfp4T>());
  constexpr int64_t kBlockBytes = 512 << 10;
  const int64_t cols = W.cols, rows = W.rows;
  const int64_t block = std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, row_data_bytes(W.format, cols)));
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kMxfp4T) {
      const auto tile = tiles[std::min(kMxfp4T, n - t0) - 1];
      for (int64_t r = b0; r < b1; ++r)
        tile(W.row_data(r), W.row_scales(r), x + t0 * cols, cols, cols, y + t0 * rows + r, rows);
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
