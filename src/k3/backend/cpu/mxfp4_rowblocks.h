// MXFP4 matrices repacked for one-token products 16 rows at a time (session 52; not yet wired into the model -- the
// first, tested step of docs/perf/cpu.md "Session 52: a probe for the one-token MXFP4 product").
//
// Why: the avx512bf16 tier's one-token MXFP4 rows (weight_kernels_avx512bf16.cpp, mxfp4_one_token_rows) spend ~11
// vector instructions per row and pair of 32-groups, one of them the vpdpbusd: issue-bound at ~18 GB/s a core. Here a
// 32-column group of 16 rows is stored as 8 "quads" of 32 bytes (a quad: 4 columns x 16 rows; byte s holds row s / 4
// in its low nibble and row s / 4 + 8 in its high one, column s % 4), so the tier's decode (vpmultishiftqb + vpermb)
// turns one quad into 16 rows x 4 unsigned weights and ONE vpdpbusd adds them against the quad's 4 activation bytes
// (broadcast) into the 16 rows' int32 lanes: ~30 instructions per 16 rows x 32 columns against ~88 (the probe: 1.86x
// a core in L2).
//
// Numerics: x quantised to int8 with one scale per 32 values (m = max |x| of the group, q = nearest-even of
// x x (127 / m), |q| <= 127, d = m / 127: llama.cpp's q8_0 class, not the tier's one scale per 4 values), the int32 dot
// of each row's group exact, then fp32: acc += float(dot) x (0.5 x 2^(e8m0 - 127) x d). A group holding a NaN or an
// infinity gives NaN.
#pragma once
#include <cstdint>
#include <vector>

#include "k3/core/weight.h"

namespace k3::cpu {

struct Mxfp4RowBlocks {
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> quads;   // [rows / 16][cols / 32][8 quads][32 bytes]
  std::vector<uint8_t> scales;  // [rows / 16][cols / 32][16 rows]: the rows' E8M0 scales of the group
};

// Whether W can be repacked: MXFP4 or MXFP4_GGML, rows a multiple of 16, cols a multiple of 32.
bool mxfp4_rowblocks_supported(const WeightMatrix& W);
// The repacked copy of W (same bytes: 4.25 bits a weight). Throws on an unsupported W.
Mxfp4RowBlocks mxfp4_rowblocks(const WeightMatrix& W);
// Whether this CPU runs mxfp4_rowblocks_one_token: it has the avx512bf16 tier's features (cpu_isa.h).
bool mxfp4_rowblocks_cpu_ok();

// One token's activations as the product reads them (made once, shared by every matrix that reads x).
struct Mxfp4GroupActs {
  std::vector<int8_t> q;        // [cols]
  std::vector<float> d;         // [cols / 32]: the scale (NaN for a group holding a NaN or an infinity: its q are 0)
  std::vector<int32_t> start;   // [cols / 32]: -12 x sum(q), the start of each group's int32 dot (weights go in + 12)
};
// x [cols] (cols % 32 == 0) quantised as above.
void mxfp4_rowblocks_quantise(const float* x, int64_t cols, Mxfp4GroupActs& out);
// y[r] = W[r] . x for the rows of row blocks [b0, b1) (rows 16 b0 .. 16 b1 - 1), y indexed by row; a.q has m.cols
// values. Requires mxfp4_rowblocks_cpu_ok().
void mxfp4_rowblocks_one_token(const Mxfp4RowBlocks& m, const Mxfp4GroupActs& a, int64_t b0, int64_t b1, float* y);

}  // namespace k3::cpu
