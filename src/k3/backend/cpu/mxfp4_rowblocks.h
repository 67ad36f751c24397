// MXFP4 matrices repacked for products 16 rows at a time: the CPU's copy of MXFP4 routed experts (made by
// add_expert_decode_layouts, decode_layout.h; read by matmul_batch / matmul_two_stage for every job whose matrix has it,
// WeightMatrix::tiled: decode and prefill alike, so that a token's result does not depend on its batch).
//
// Why: the avx512bf16 tier's one-token MXFP4 rows (weight_kernels_avx512bf16.cpp, mxfp4_one_token_rows) spend ~11
// vector instructions per row and pair of 32-groups, one of them the vpdpbusd: issue-bound at ~18 GB/s a core. Here a
// 32-column group of 16 rows is stored as 8 "quads" of 32 bytes (a quad: 4 columns x 16 rows; byte s holds row s / 4
// in its low nibble and row s / 4 + 8 in its high one, column s % 4), so the tier's decode (vpmultishiftqb + vpermb)
// turns one quad into 16 rows x 4 unsigned weights and ONE vpdpbusd adds them against the quad's 4 activation bytes
// (broadcast) into the 16 rows' int32 lanes: ~30 instructions per 16 rows x 32 columns against ~88 (the probe: 1.86x
// a core in L2; docs/perf/cpu.md, session 52). AVX2-only CPUs run the same copy in the AVX2 form (vpshufb, vpmaddubsw,
// vpmaddwd on 8 rows at a time; mxfp4_rowblocks_forms.h), the same bits: ~2x the avx2int8 tier's rows (session 66).
//
// Layout of the copy (mxfp4_rowblocks_bytes(W) = W.bytes(): the same 4.25 bits a weight), one stream: row block b
// (rows 16 b .. 16 b + 15), group g (columns 32 g .. 32 g + 31) at (b x cols / 32 + g) x 272 bytes:
//   [0, 256)    quads 0..7 (columns 4 q .. 4 q + 3), 32 bytes each as above
//   [256, 272)  the 16 rows' E8M0 scales of the group
//
// Numerics: x quantised to int8 with one scale per 32 values by default (m = max |x| of the block, q = nearest-even
// of x x (127 / m), |q| <= 127, d = m / 127: llama.cpp's q8_0 class, not the tier's one scale per 4 values -- so a
// token's expert outputs are not the stored rows' bits, within the tier's error class; a block with m < 2^-120, where
// 127 / m would overflow, gets q = 0), the int32 dot of each row's block exact, then fp32: acc += float(dot) x
// (0.5 x 2^(e8m0 - 127) x d). A block holding a NaN or an infinity gives NaN.
#pragma once
#include <cstdint>

#include "k3/core/weight.h"

namespace k3::cpu {

inline constexpr int64_t kMxfp4RowBlockRows = 16, kMxfp4RowBlockGroupBytes = 272;

// Whether W can be repacked: MXFP4 or MXFP4_GGML, rows a multiple of 16, cols a multiple of 32.
bool mxfp4_rowblocks_supported(const WeightMatrix& W);
int64_t mxfp4_rowblocks_bytes(const WeightMatrix& W);
// W's copy into out (mxfp4_rowblocks_bytes(W) bytes, every byte written). Throws on an unsupported W.
void mxfp4_rowblocks_write(const WeightMatrix& W, uint8_t* out);
// The product's two instruction-set forms (mxfp4_rowblocks_forms.h), the same bits: Avx512Bf16 (vpdpbusd on 16 rows at
// once) and Avx2 (vpmaddubsw + vpmaddwd on 8; for AVX2-only CPUs, where the avx2int8 tier's one-row products are
// compute-bound). Whether this CPU has a form's features; which one prepare / rows run: Avx512Bf16 where the CPU has it
// unless the active tier is an AVX2 one (K3_CPU_ISA=avx2 / avx2int8), else Avx2.
enum class Mxfp4RowBlocksForm { Avx2, Avx512Bf16 };
bool mxfp4_rowblocks_form_ok(Mxfp4RowBlocksForm f);
Mxfp4RowBlocksForm mxfp4_rowblocks_form();
// Whether this CPU runs the product at all: the Avx2 form's features (AVX2, FMA, F16C: the avx2int8 tier's, cpu_isa.h).
bool mxfp4_rowblocks_cpu_ok();

// One token's activations as the product reads them, `mxfp4_rowblocks_act_bytes(cols)` bytes (64-byte multiple), with
// one int8 scale per block of B = mxfp4_rowblocks_act_block() values: q [cols] int8, then d [cols / B] fp32 (the
// block's scale; NaN for a block holding a NaN or an infinity, whose q are 0), then start [cols / B] int32
// (-12 x sum(q): the start of the block's int32 dot, weights going in + 12).
// B: 32 by default (llama.cpp's q8_0 class), K3_MXFP4_RB_ACT_BLOCK=16 | 8 | 4 (4: the tier's class) for the
// measurement of what each costs (docs/perf/cpu.md, session 53).
int mxfp4_rowblocks_act_block();
int64_t mxfp4_rowblocks_act_bytes(int64_t cols);
// n tokens of x [n][cols] (cols % 32 == 0) converted into out (n x act_bytes). Requires mxfp4_rowblocks_cpu_ok().
void mxfp4_rowblocks_prepare(const float* x, int64_t n, int64_t cols, uint8_t* out);
void mxfp4_rowblocks_prepare(const float* x, int64_t n, int64_t cols, uint8_t* out, Mxfp4RowBlocksForm f);  // (tests)
struct Mxfp4GroupActs {
  const int8_t* q;
  const float* d;
  const int32_t* start;
  int block;  // values per scale
};
Mxfp4GroupActs mxfp4_rowblocks_acts(const uint8_t* act, int64_t cols);

// Whether a product of W over n tokens reads the copy: W.tiled holds it (MXFP4 on the host), n >= 1, and the CPU runs
// it.
bool mxfp4_rowblocks_job(const WeightMatrix& W, int64_t n);
// Rows [r0, r1) of W (multiples of 16) from its copy W.tiled against n converted tokens (act: n x act_bytes):
// y[t * ldy + r - r0] (RowKernels::rows' contract). Tokens go 8 at a time over each row block, a token's outputs the
// same bits whatever n (the CPU engine's batch invariance). Throws k3::Error on a range, width or stride it cannot serve.
void mxfp4_rowblocks_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y,
                          int64_t ldy);
void mxfp4_rowblocks_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y,
                          int64_t ldy, Mxfp4RowBlocksForm f);  // (tests: a form; throws where the CPU lacks it)

}  // namespace k3::cpu
