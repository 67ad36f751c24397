// The MXFP4 decode kernels' FP8 form (DecVariant::Fp8, moe_decode.h; kernels in moe_decode_fp8.cu), internal to
// moe_decode.cu: the same grid, K split, partial sums and combine as the ring kernel, the arithmetic on
// mma.sync m16n8k32 e4m3.
//
// Why: the ring kernel is bound by its integer work -- 7.2 instructions a weight byte at n = 8-64, ~4 of them placing
// two E2M1 nibbles as a bf16 pair and one the bf16 scale multiply (docs/perf/cuda.md, session 23). E2M1 placed in an
// E4M3 byte is one shift-and-mask per sign and per magnitude for four values at once (the value times 2^-6,
// subnormals included), and an m16n8k32 MMA covers one 32-column scale group per row, so the E8M0 scale multiplies the
// MMA's fp32 result instead of every weight.
// Activations: per token (gate/up: a row of x; down: a slot's GLU output) a power-of-two scale s with max |v| / s <=
// 448, and v / s as the sum of kF8Terms E4M3 values (each the rounding of what the previous ones left): 4 terms hold
// ~16 significant bits of each value down to 2^-10 s, about the bf16x2 split's precision; each term is one more MMA
// into the same accumulator. Not the ring's bits (another rounding of the activations): tested against the CPU
// reference at the bf16x2 tolerance.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda::f8dec {

constexpr int kTerms = 4;

// The activation terms of `rows` source rows of `cols` values (cols % 128 == 0): terms [row][cols / 32][4][kTerms] as
// uint2 (per 32-column group and quarter, each term's 4 even columns then 4 odd ones, E4M3), scale [row] (the power of
// two s; NaN for a row holding a NaN or an infinity).
// From x [rows][cols] fp32 (gate/up):
cudaError_t prep_rows(const float* x, int rows, int cols, uint2* terms, float* scale, cudaStream_t s);
// From the gate/up kernel's split partials [splits][slot][2 I] (gate | up), the GLU applied (down): rows = slots.
cudaError_t prep_glu(const float* part, int64_t split_stride, int splits, int rows, int I, GluAct act, float beta,
                     float lbeta, uint2* terms, float* scale, cudaStream_t s);

struct Args {
  const uint8_t* w0 = nullptr;  // gate (GLU2) or down: MXFP4 packed [E][rows][cols / 2]
  const uint8_t* s0 = nullptr;  // E8M0 scales [E][rows][cols / 32]
  const uint8_t* w1 = nullptr;  // up (GLU2)
  const uint8_t* s1 = nullptr;
  int rows = 0, cols = 0;       // one matrix; cols % 128 == 0
  const uint2* terms = nullptr;  // prep_*'s, by source row (GLU2: token, sorted[pair] / K; else slot)
  const float* scale = nullptr;
  const int32_t* sorted = nullptr;
  int K = 1;
  const int4* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  float* part = nullptr;  // [split][slot][ldo], as the ring kernel's
  int64_t split_stride = 0;
  int ldo = 0;
  int nch = 0, cps = 0;   // 128-column chunks of the K range, chunks per split
};

// One matrix (glu2: gate and up rows side by side) for tiles of 8 (nt 1) or 16 (nt 2) pairs: grid (tiles_bound, the
// ring kernel's row blocks, splits).
cudaError_t matrix(const Args& a, bool glu2, int nt, int tiles_bound, int splits, cudaStream_t s);

}  // namespace k3::cuda::f8dec
