// The avx2 tier's kernels of GGUF's block formats (weight_kernels_quant.h): dot_loop's arithmetic against
// the activations (two 8-lane accumulators per token, one 16-wide step at a time, one hsum at the end of
// the row) over decoded blocks: straight from the decoder's registers for one token (DotSink), through an
// L1 buffer decoded once per tile of tokens in the gemm.
#include "k3/backend/cpu/weight_kernels_quant.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>

#include "k3/backend/cpu/weight_simd.h"
#include "k3/backend/cpu/quant_decode_simd.h"

namespace k3::cpu {

using namespace simd;

namespace {

// One row x T tokens. T = 6: 12 accumulators + 2 weight vectors + 1 activation vector of 16 registers.
template <WeightFormat F, int T>
void quant_tile(const uint8_t* row, int64_t cols, const float* x, int64_t ldx, float* y, int64_t ldy) {
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes;
  alignas(32) float w[E];
  __m256 acc[T][2];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < cols / E; ++b) {
    qsimd::decode_block<F>(row + b * B, w);
    const float* xb = x + b * E;
    for (int i = 0; i < E; i += 16) {
      const __m256 w0 = _mm256_load_ps(w + i), w1 = _mm256_load_ps(w + i + 8);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        acc[t][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb + t * ldx + i), acc[t][0]);
        acc[t][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + t * ldx + i + 8), acc[t][1]);
      }
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = hsum(_mm256_add_ps(acc[t][0], acc[t][1]));
}

constexpr int64_t kT = 6;

template <WeightFormat F, size_t... T>
constexpr auto quant_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const uint8_t*, int64_t, const float*, int64_t, float*, int64_t);
  return std::array<Tile, sizeof...(T)>{quant_tile<F, static_cast<int>(T) + 1>...};
}

// The 1-token tile without the buffer: each 32 decoded weights go straight into the two accumulators,
// the same products in the same order as quant_tile<F, 1> (so gemm keeps dot's bits): a0 takes elements
// i..i+7 and i+16..i+23, a1 i+8..i+15 and i+24..i+31, as dot_loop's 16-wide steps.
struct DotSink {
  const float* x;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  void add(int i, const __m256 w[4]) {
    a0 = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + i + 8), a1);
    a0 = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + i + 16), a0);
    a1 = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + i + 24), a1);
  }
  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float m0, float d1, float m1) {
    __m256 w[4];
    qsimd::to_f32x32<kMin>(v, d0, m0, d1, m1, w);
    add(i, w);
  }
  __attribute__((always_inline)) void put32f(int i, const float* p) {
    const __m256 w[4] = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8), _mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)};
    add(i, w);
  }
};

template <WeightFormat F>
float quant_dot(const WeightMatrix& W, int64_t r, const float* x) {
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes;
  const uint8_t* row = W.row_data(r);
  DotSink s{x};
  for (int64_t b = 0; b < W.cols / E; ++b, s.x += E) qsimd::decode_into<F>(row + b * B, s);
  return hsum(_mm256_add_ps(s.a0, s.a1));
}

// Blocks of rows (~256 KiB of blocks) stay in L2 while every token tile passes over them.
template <WeightFormat F>
void quant_gemm(const WeightMatrix& W, int64_t r0, int64_t r1, const float* x, int64_t n, float* y) {
  static constexpr auto tiles = quant_tiles<F>(std::make_index_sequence<kT>());
  constexpr int64_t kBlockBytes = 256 << 10;
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
  for (int64_t b = 0; b < W.cols / E; ++b) qsimd::decode_block<F>(p + b * B, out + b * E);
}

template <WeightFormat F>
constexpr RowKernels kKernels{quant_dot<F>, quant_dequant<F>, quant_gemm<F>, nullptr};

}  // namespace

const RowKernels* avx2_quant_row_kernels(WeightFormat f) {
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
