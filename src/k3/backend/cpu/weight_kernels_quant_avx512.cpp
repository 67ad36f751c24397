// The avx512 tier's kernels of GGUF's block formats (weight_kernels_quant.h): a block decoded into an L1
// buffer (quant/block_decode.h, compiled here for AVX-512), then the avx512 float dot's arithmetic: two
// 16-lane accumulators per token (a0 lanes i..i+15 of each 32-step, a1 i+16..i+31), one reduction.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/backend/cpu/weight_simd512.h"
#include "k3/core/dtype.h"
#include "k3/core/weight_format.h"
#include "k3/quant/iq_tables.h"

K3_AVX512_BEGIN

// Inside the target region: the static inline decoders (quant_decode_simd.h, quant/block_decode.h) are
// compiled for AVX-512 in this file only.
#include "k3/backend/cpu/quant_decode_simd.h"

namespace k3::cpu {

namespace {

// 32 int8 quants with their sub-scales -> two 16-lane fp32 vectors (elements i..i+15, i+16..i+31): the
// per-element operations of qsimd::to_f32x32, 16 lanes at a time (half the conversions of the AVX2 path).
template <bool kMin>
inline void to_f32x32_512(__m256i v, float d0, float m0, float d1, float m1, __m512& r0, __m512& r1) {
  r0 = _mm512_mul_ps(_mm512_set1_ps(d0), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(v))));
  r1 = _mm512_mul_ps(_mm512_set1_ps(d1), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(v, 1))));
  if constexpr (kMin) {
    r0 = _mm512_sub_ps(r0, _mm512_set1_ps(m0));
    r1 = _mm512_sub_ps(r1, _mm512_set1_ps(m1));
  }
}

// One 64-byte store per 16 weights, so that the tile's 16-lane loads are forwarded from it.
struct StoreSink16 {
  float* y;
  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float m0, float d1, float m1) const {
    __m512 r0, r1;
    to_f32x32_512<kMin>(v, d0, m0, d1, m1, r0, r1);
    _mm512_storeu_ps(y + i, r0);
    _mm512_storeu_ps(y + i + 16, r1);
  }
  __attribute__((always_inline)) void put32f(int i, const float* w) const {
    _mm512_storeu_ps(y + i, _mm512_loadu_ps(w));
    _mm512_storeu_ps(y + i + 16, _mm512_loadu_ps(w + 16));
  }
};

// The 1-token tile without the buffer: a0 takes elements i..i+15 of each 32, a1 i+16..i+31, as quant_tile.
struct DotSink {
  const float* x;
  __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
  void add(int i, __m512 w0, __m512 w1) {
    a0 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + i + 16), a1);
  }
  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float m0, float d1, float m1) {
    __m512 r0, r1;
    to_f32x32_512<kMin>(v, d0, m0, d1, m1, r0, r1);
    add(i, r0, r1);
  }
  __attribute__((always_inline)) void put32f(int i, const float* w) { add(i, _mm512_loadu_ps(w), _mm512_loadu_ps(w + 16)); }
};

// One row x T tokens. T = 12: 24 accumulators + 2 weight vectors + 1 activation vector of 32 registers.
template <WeightFormat F, int T>
void quant_tile(const uint8_t* row, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) {
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes;
  alignas(64) float w[E];
  __m512 acc[T][2];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
  StoreSink16 sink{w};
  for (int64_t b = 0; b < cols / E; ++b) {
    qsimd::decode_into<F>(row + b * B, sink);
    const float* xb = x + b * E;
    for (int i = 0; i < E; i += 32) {
      const __m512 w0 = _mm512_load_ps(w + i), w1 = _mm512_load_ps(w + i + 16);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) {
        acc[t][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb + t * ldx + i), acc[t][0]);
        acc[t][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + t * ldx + i + 16), acc[t][1]);
      }
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = _mm512_reduce_add_ps(_mm512_add_ps(acc[t][0], acc[t][1]));
}

constexpr int64_t kT = 12;

template <WeightFormat F, size_t... T>
constexpr auto quant_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);
  return std::array<Tile, sizeof...(T)>{quant_tile<F, static_cast<int>(T) + 1>...};
}

template <WeightFormat F>
float quant_dot(const WeightMatrix& W, int64_t r, const float* x) {
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes;
  const uint8_t* row = W.row_data(r);
  DotSink s{x};
  for (int64_t b = 0; b < W.cols / E; ++b, s.x += E) qsimd::decode_into<F>(row + b * B, s);
  return _mm512_reduce_add_ps(_mm512_add_ps(s.a0, s.a1));
}

// Blocks of rows (~512 KiB of blocks) stay in L2 while every token tile passes over them.
template <WeightFormat F>
void quant_gemm(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  static constexpr auto tiles = quant_tiles<F>(std::make_index_sequence<kT>());
  constexpr int64_t kBlockBytes = 512 << 10;
  const int64_t cols = W.cols, rows = W.rows;
  const int64_t block = std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, row_data_bytes(F, cols)));
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kT) {
      const auto tile = tiles[std::min(kT, n - t0) - 1];
      for (int64_t r = b0; r < b1; ++r) tile(W.row_data(r), cols, x + t0 * cols, cols, y + t0 * rows + r, rows);
    }
  }
}

template <WeightFormat F>
void quant_dequant(const WeightMatrix& W, int64_t r, float* out) {
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes;
  const uint8_t* p = W.row_data(r);
  for (int64_t b = 0; b < W.cols / E; ++b) {
    StoreSink16 sink{out + b * E};
    qsimd::decode_into<F>(p + b * B, sink);
  }
}

template <WeightFormat F>
constexpr RowKernels kKernels{quant_dot<F>, quant_dequant<F>, quant_gemm<F>, nullptr};

}  // namespace

}  // namespace k3::cpu

K3_AVX512_END

namespace k3::cpu {

const RowKernels* avx512_quant_row_kernels(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8_0: return &kKernels<WeightFormat::Q8_0>;
    case WeightFormat::Q4_K: return &kKernels<WeightFormat::Q4_K>;
    case WeightFormat::Q5_K: return &kKernels<WeightFormat::Q5_K>;
    case WeightFormat::Q6_K: return &kKernels<WeightFormat::Q6_K>;
    case WeightFormat::Q3_K: return &kKernels<WeightFormat::Q3_K>;
    case WeightFormat::Q2_K: return &kKernels<WeightFormat::Q2_K>;
    case WeightFormat::IQ4_XS: return &kKernels<WeightFormat::IQ4_XS>;
    case WeightFormat::IQ3_XXS: return &kKernels<WeightFormat::IQ3_XXS>;
    case WeightFormat::IQ3_S: return &kKernels<WeightFormat::IQ3_S>;
    case WeightFormat::IQ2_XXS: return &kKernels<WeightFormat::IQ2_XXS>;
    case WeightFormat::IQ2_XS: return &kKernels<WeightFormat::IQ2_XS>;
    case WeightFormat::IQ2_S: return &kKernels<WeightFormat::IQ2_S>;
    case WeightFormat::IQ1_S: return &kKernels<WeightFormat::IQ1_S>;
    case WeightFormat::IQ1_M: return &kKernels<WeightFormat::IQ1_M>;
    case WeightFormat::Q4_0: return &kKernels<WeightFormat::Q4_0>;
    case WeightFormat::Q4_1: return &kKernels<WeightFormat::Q4_1>;
    case WeightFormat::Q5_0: return &kKernels<WeightFormat::Q5_0>;
    case WeightFormat::Q5_1: return &kKernels<WeightFormat::Q5_1>;
    case WeightFormat::IQ4_NL: return &kKernels<WeightFormat::IQ4_NL>;
    default: return nullptr;
  }
}

}  // namespace k3::cpu
