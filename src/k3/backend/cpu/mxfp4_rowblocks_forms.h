// The two instruction-set forms of the MXFP4 row-block product (mxfp4_rowblocks.h): the avx512bf16 one
// (mxfp4_rowblocks.cpp: vpmultishiftqb + vpermb decode a quad, one vpdpbusd adds 16 rows x 4 columns) and the AVX2 one
// (mxfp4_rowblocks_avx2.cpp, for AVX2-only CPUs such as AMD Zen 2 / 3: vpshufb decodes a quad's two nibble halves, vpmaddubsw +
// vpmaddwd add 8 rows x 4 columns each). Both read the same copy and the same converted activations and compute the same
// int32 dots and the same fp32 steps in the same order: their outputs are the same bits (Mxfp4RowBlocks.FormsAgreeBitForBit).
// Internal to the two files and their tests.
#pragma once
#include <cstdint>

namespace k3::cpu::rowblocks_detail {

// One activation block of S values the scalar way (mxfp4_rowblocks.h's rule; a block holding a NaN or an infinity:
// q = 0, d = NaN, start 0).
void quantise_block_scalar(const float* x, int S, int8_t* q, float* d, int32_t* start);
// K3_MXFP4_RB_PREFETCH: the bytes ahead of the stream whose lines the product requests (0: none).
int64_t prefetch_ahead();

// The AVX2 form: n tokens' activations (blocks of S values; S = 32 vectorised, 4 / 8 / 16 through the scalar rule) and
// rows of blocks [b0, b1) of a copy against n converted tokens, as mxfp4_rowblocks_prepare / _rows lay them out.
void avx2_quantise(const float* x, int64_t n, int64_t cols, int S, int64_t stride, uint8_t* out);
void avx2_rows(int S, const uint8_t* copy, int64_t cols, const uint8_t* act, int64_t stride, int64_t n, int64_t b0,
               int64_t b1, float* y, int64_t ldy);

}  // namespace k3::cpu::rowblocks_detail
