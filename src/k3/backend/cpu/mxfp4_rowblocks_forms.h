// The two instruction-set forms of the MXFP4 row-block product (mxfp4_rowblocks.h): the avx512bf16 one
// (mxfp4_rowblocks.cpp: vpmultishiftqb + vpermb decode a quad, one vpdpbusd adds 16 rows x 4 columns) and the AVX2 one
// (mxfp4_rowblocks_avx2.cpp, for AVX2-only CPUs such as AMD Zen 2 / 3: vpshufb decodes a quad's two nibble halves, vpmaddubsw +
// vpmaddwd add 8 rows x 4 columns each). Both read the same copy and the same converted activations and compute the same
// int32 dots and the same fp32 steps in the same order: their outputs are the same bits (Mxfp4RowBlocks.FormsAgreeBitForBit).
// Internal to the two files and their tests.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>

#include "k3/backend/cpu/mxfp4_rowblocks.h"

namespace k3::cpu::rowblocks_detail {

// One activation block of S values the scalar way (mxfp4_rowblocks.h's rule; a block holding a NaN or an infinity:
// q = 0, d = NaN, start 0).
void quantise_block_scalar(const float* x, int S, int8_t* q, float* d, int32_t* start);
// K3_MXFP4_RB_PREFETCH: the bytes ahead of the stream whose lines the product requests (0: none).
int64_t prefetch_ahead();

// A form's kernel for a fixed number of tokens: rows of blocks [b0, b1) against a[t], into y[t][16 (b - b0) + r].
using RowBlocksKernel = void (*)(const uint8_t* copy, int64_t cols, const Mxfp4GroupActs* a, int64_t b0, int64_t b1,
                                 float* const* y);

// n converted tokens (act, stride apart) in tiles of up to N, tiles[m - 1] running m of them over the row blocks.
template <size_t N>
void run_token_tiles(const std::array<RowBlocksKernel, N>& tiles, const uint8_t* copy, int64_t cols, const uint8_t* act,
                     int64_t stride, int64_t n, int64_t b0, int64_t b1, float* y, int64_t ldy) {
  Mxfp4GroupActs a[N];
  float* yt[N];
  for (int64_t t0 = 0; t0 < n; t0 += static_cast<int64_t>(N)) {
    const int m = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(N), n - t0));
    for (int t = 0; t < m; ++t) {
      a[t] = mxfp4_rowblocks_acts(act + (t0 + t) * stride, cols);
      yt[t] = y + (t0 + t) * ldy;
    }
    tiles[static_cast<size_t>(m - 1)](copy, cols, a, b0, b1, yt);
  }
}

// The AVX2 form: n tokens' activations (blocks of S values; S = 32 vectorised, 4 / 8 / 16 through the scalar rule) and
// rows of blocks [b0, b1) of a copy against n converted tokens, as mxfp4_rowblocks_prepare / _rows lay them out.
void avx2_quantise(const float* x, int64_t n, int64_t cols, int S, int64_t stride, uint8_t* out);
void avx2_rows(int S, const uint8_t* copy, int64_t cols, const uint8_t* act, int64_t stride, int64_t n, int64_t b0,
               int64_t b1, float* y, int64_t ldy);

}  // namespace k3::cpu::rowblocks_detail
