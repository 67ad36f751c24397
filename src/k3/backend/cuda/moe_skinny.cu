// Grouped expert GLU for decode batches with bf16 experts: the skinny projection (linear_skinny.cu) per tile
// of up to 8 / 16 (token, expert) pairs of one expert (moe_decode.h: moe_skinny_experts).
//
// Why (issue 18, session 8): at batch 64 / 128 of the Kimi-Linear shape the experts were 70% of the decode
// step's GPU time (ncu: SIMT tiles 1.1 ms per layer at 2 pairs per expert, the decode kernel 1.65 ms at 4,
// against 0.75 / 0.85 ms at 4.2 TB/s over the experts touched). That kernel splits K across blocks and
// leaves partial sums for a second pass; here a block's 8 warps split K among themselves and meet in shared
// memory (fixed order: the result does not depend on the schedule), so each block finishes its outputs:
// the gate/up block applies the GLU and writes the down projection's bf16 hi/lo input, the down block its
// fp32 rows. Launches: act prep, gate/up (+GLU), down, combine (4, was 5, and no split buffers).
//
// Fragments as in linear_skinny.cu: lane (g, tq) loads 16 bytes of rows g and g + 8 of a 32-column chunk
// straight into A (k permuted, no repack); B = the tile's activation rows (natural column order), hi + lo.
// Gate/up block: 16 gate rows and the same 16 up rows (two m16 tiles); down block: 32 rows.
#include <cuda_bf16.h>

#include <cstdlib>
#include <string>

#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/moe_decode.h"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/mma_bf16.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 4;  // chunks per warp whose weights are in flight together
constexpr int kMT = 2;      // m16 tiles per block

using mma_bf16::load_stream;
using mma_bf16::mma_chunk;

struct SkArgs {
  const uint16_t* w0 = nullptr;  // gate (GLU) or down: [E][rows][cols] bf16
  const uint16_t* w1 = nullptr;  // up (GLU)
  int rows = 0, cols = 0;
  const uint16_t* act_hi = nullptr;  // [source rows][cols]: x by token (GLU) or hidden by slot
  const uint16_t* act_lo = nullptr;
  const int32_t* sorted = nullptr;  // slot -> pair (token * K + k)
  int K = 1;
  const int4* tiles = nullptr;  // (expert, first slot, pairs)
  const int32_t* num_tiles = nullptr;
  uint16_t* h_hi = nullptr;  // GLU out: [P][rows] bf16 hi / lo by slot
  uint16_t* h_lo = nullptr;
  float* y = nullptr;  // down out: [P][rows] fp32 by slot
  GluAct act = GluAct::SiLU;
  float beta = 1.f, lbeta = 1.f;
};

// Grid (tile bound, row blocks). GLU: block rows [16 by, +16) of gate and up; else [32 by, +32) of down.
template <int NT, bool GLU, bool LO>
__global__ void __launch_bounds__(kWarps * 32) grouped_skinny_kernel(const SkArgs a) {
  pdl::launch_dependents();
  __shared__ float red[kWarps][kMT * NT * 4][32];
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;  // whole block: the grid is sized from an upper bound
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int rows = a.rows, cols = a.cols, chunks = cols / 32;
  const int row0 = blockIdx.y * (GLU ? 16 : 32);
  // Rows past the end and pairs past cnt are clamped to valid ones: loaded, computed, never stored.
  const uint4* wp[kMT][2];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = min(row0 + (GLU ? 0 : 16 * i) + g + 8 * h, rows - 1);
      const uint16_t* base = GLU && i == 1 ? a.w1 : a.w0;
      wp[i][h] = reinterpret_cast<const uint4*>(base + (static_cast<int64_t>(e) * rows + r) * cols) + tq;
    }
  const uint4* xp[NT][2];
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const int j = 8 * t + g < cnt ? 8 * t + g : 0;
    const int src = GLU ? a.sorted[start + j] / a.K : start + j;
    xp[t][0] = reinterpret_cast<const uint4*>(a.act_hi + static_cast<int64_t>(src) * cols) + tq;
    xp[t][1] = reinterpret_cast<const uint4*>(a.act_lo + static_cast<int64_t>(src) * cols) + tq;
  }
  float acc[kMT][NT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) acc[i][t][j] = 0.f;

  for (int c0 = warp; c0 < chunks; c0 += kWarps * kUnroll) {
    uint4 wv[kUnroll][kMT][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kWarps;
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) wv[u][i][h] = c < chunks ? load_stream(wp[i][h] + 4 * c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kWarps;
      if (c >= chunks) break;  // warp-uniform
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const uint4 bh = __ldg(xp[t][0] + 4 * c);
#pragma unroll
        for (int i = 0; i < kMT; ++i) mma_chunk(acc[i][t], wv[u][i][0], wv[u][i][1], bh);
        if constexpr (LO) {
          const uint4 bl = __ldg(xp[t][1] + 4 * c);
#pragma unroll
          for (int i = 0; i < kMT; ++i) mma_chunk(acc[i][t], wv[u][i][0], wv[u][i][1], bl);
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int j = 0; j < 4; ++j) red[warp][(i * NT + t) * 4 + j][lane] = acc[i][t][j];
  __syncthreads();
  // Accumulator j of lane l in tile (i, t): row 16 i + (l >> 2) + 8 (j >> 1) (GLU: i = 0 gate, 1 up, same
  // rows), pair 8 t + 2 (l & 3) + (j & 1). Warps summed in order.
  constexpr int kOut = (GLU ? 1 : kMT) * NT * 4 * 32;
  for (int idx = threadIdx.x; idx < kOut; idx += kWarps * 32) {
    const int l = idx & 31, f = idx >> 5, j = f & 3, t = (f >> 2) % NT, i = (f >> 2) / NT;
    const int row = row0 + 16 * i + (l >> 2) + 8 * (j >> 1), p = 8 * t + 2 * (l & 3) + (j & 1);
    float s0 = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s0 += red[w][f][l];
    if (row >= rows || p >= cnt) continue;
    const int64_t o = static_cast<int64_t>(start + p) * rows + row;
    if constexpr (GLU) {
      float s1 = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s1 += red[w][(NT + t) * 4 + j][l];
      const float h = moe_dev::glu(s0, s1, a.act, a.beta, a.lbeta);
      const __nv_bfloat16 hh = __float2bfloat16_rn(h);
      const __nv_bfloat16 hl = __float2bfloat16_rn(h - __bfloat162float(hh));
      a.h_hi[o] = *reinterpret_cast<const uint16_t*>(&hh);
      a.h_lo[o] = *reinterpret_cast<const uint16_t*>(&hl);
    } else {
      a.y[o] = s0;
    }
  }
}

template <int NT, bool LO>
cudaError_t launch(const ExpertBank& w, int n, int K, const float* x, const int32_t* sorted, const int32_t* slot_of,
                   const int4* tiles, const int32_t* num_tiles, int tiles_bound, const float* topk_w, GluAct act,
                   float beta, float lbeta, float* out, const DecodeScratch& s, cudaStream_t stream) {
  const int P = n * K, I = w.I, X = w.X;
  uint16_t* xhi = s.xb;
  uint16_t* xlo = s.xb + static_cast<int64_t>(s.max_tokens) * X;
  uint16_t* hhi = s.hb;
  uint16_t* hlo = s.hb + static_cast<int64_t>(s.max_pairs) * I;
  const int64_t count = static_cast<int64_t>(n) * X;
  cudaError_t e = to_bf16_split(x, count, xhi, xlo, stream);  // natural column order (bf16 weights)
  if (e != cudaSuccess) return e;
  SkArgs a;
  a.w0 = static_cast<const uint16_t*>(w.gate);
  a.w1 = static_cast<const uint16_t*>(w.up);
  a.rows = I;
  a.cols = X;
  a.act_hi = xhi;
  a.act_lo = xlo;
  a.sorted = sorted;
  a.K = K;
  a.tiles = tiles;
  a.num_tiles = num_tiles;
  a.h_hi = hhi;
  a.h_lo = hlo;
  a.act = act;
  a.beta = beta;
  a.lbeta = lbeta;
  grouped_skinny_kernel<NT, true, LO><<<dim3(tiles_bound, (I + 15) / 16), kWarps * 32, 0, stream>>>(a);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  SkArgs d = a;
  d.w0 = static_cast<const uint16_t*>(w.down);
  d.w1 = nullptr;
  d.rows = X;
  d.cols = I;
  d.act_hi = hhi;
  d.act_lo = hlo;
  d.y = s.part;
  grouped_skinny_kernel<NT, false, LO><<<dim3(tiles_bound, (X + 31) / 32), kWarps * 32, 0, stream>>>(d);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return moe_combine(n, X, K, s.part, static_cast<int64_t>(P) * X, 1, slot_of, topk_w, out, stream);
}

}  // namespace

bool moe_skinny_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("K3_MOE_SKINNY");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

bool moe_skinny_supported(const ExpertBank& w, int tok) {
  return w.format == WeightFormat::BF16 && w.I % 32 == 0 && w.X % 32 == 0 && (tok == 8 || tok == 16);
}

cudaError_t moe_skinny_experts(const ExpertBank& w, int n, int K, int tok, const float* x, const int32_t* sorted,
                               const int32_t* slot_of, const int4* tiles, const int32_t* num_tiles, int tiles_bound,
                               const float* topk_w, GluAct act, float beta, float lbeta, bool split, float* out,
                               const DecodeScratch& s, cudaStream_t stream) {
  if (!moe_skinny_supported(w, tok) || n > s.max_tokens || static_cast<int64_t>(n) * K > s.max_pairs)
    return cudaErrorInvalidValue;
  if (static_cast<int64_t>(n) * K * w.X > s.part_floats) return cudaErrorInvalidValue;
#define K3_SK(NT, LO) \
  launch<NT, LO>(w, n, K, x, sorted, slot_of, tiles, num_tiles, tiles_bound, topk_w, act, beta, lbeta, out, s, stream)
  if (tok == 8) return split ? K3_SK(1, true) : K3_SK(1, false);
  return split ? K3_SK(2, true) : K3_SK(2, false);
#undef K3_SK
}

}  // namespace k3::cuda
