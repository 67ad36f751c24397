// The avx2int8 kernel tier (weight_kernels_avx2int8.cpp): private to weight_kernels.cpp, which puts it in
// the per-tier table that row_kernels() dispatches on.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

// The avx2int8 tier's own kernels of format f (MXFP4, MXFP4_GGML: int8 activations, maddubs), or null
// (the tier table then uses the avx2 tier's exact kernels). `exact`: the avx2 tier's kernels of f, whose
// dequant the tier keeps (it rounds activations, never weights). Needs AVX2 + FMA + F16C only.
const RowKernels* avx2int8_row_kernels(WeightFormat f, const RowKernels& exact);

// The tier's kernels of GGUF's block formats: Q4_K, Q5_K and Q6_K on per-block int8 activations, every other
// block format (Q8_0, Q3_K, Q2_K, the i-quants, the 32-element formats) on int8 quads; null when f is not a
// block format.
const RowKernels* avx2int8_quant_row_kernels(WeightFormat f);

// Shared by the tier's files: a tile function (rows [r0, r1) x a fixed count of converted tokens, ldq bytes
// apart, into y[t * ldy + (r - r0)]) and the driver that runs tiles[m - 1] over m <= nt tokens at a time.
using Avx2Int8TileFn = void (*)(const WeightMatrix&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t);
void avx2int8_run_tiles(const Avx2Int8TileFn* tiles, int64_t nt, const WeightMatrix& W, int64_t r0, int64_t r1,
                        const uint8_t* xq, int64_t ldq, int64_t n, float* y, int64_t ldy);
// The tier's matmul rows [r0, r1) x n converted tokens: K::template row<T>(W, r, xq, ldq, y, ldy) computes row
// r for T tokens (T = 1..NT, y[t * ldy]); the tiles over rows and up to NT tokens, run by avx2int8_run_tiles.
template <class K, int NT>
void avx2int8_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t ldq, int64_t n, float* y,
                   int64_t ldy) {
  static constexpr auto tiles = []<size_t... T>(std::index_sequence<T...>) {
    return std::array<Avx2Int8TileFn, NT>{+[](const WeightMatrix& w, int64_t b0, int64_t b1, const uint8_t* q, int64_t ld,
                                               float* out, int64_t ldo) {
      for (int64_t r = b0; r < b1; ++r) K::template row<static_cast<int>(T) + 1>(w, r, q, ld, out + (r - b0), ldo);
    }...};
  }(std::make_index_sequence<NT>());
  avx2int8_run_tiles(tiles.data(), NT, W, r0, r1, xq, ldq, n, y, ldy);
}

// An act_path Path (act_convert_path.h) of the tier: activations converted by Prepare into Stride(cols) bytes
// per token, rows through avx2int8_rows<K, NT>.
template <class K, int NT, int64_t (*Stride)(int64_t), void (*Prepare)(const float*, int64_t, int64_t, uint8_t*)>
struct Avx2Int8Path {
  static int64_t stride_bytes(int64_t cols) { return Stride(cols); }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) { Prepare(x, n, cols, out); }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    avx2int8_rows<K, NT>(W, r0, r1, act, Stride(W.cols), n, y, ldy);
  }
};

// Q4_K, Q5_K and Q6_K on per-block int8 activations (llama.cpp's Q8_K layout; weight_kernels_avx2int8_k.cpp); null
// for other formats.
const RowKernels* avx2int8_k_row_kernels(WeightFormat f);

}  // namespace k3::cpu
