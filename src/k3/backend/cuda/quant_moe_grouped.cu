// quant_moe_grouped (quant_moe.h): GGUF block experts at decode-sized batches, grouped by expert.
//
// Why: the per-pair kernels (quant_moe.cu) give each output value its own warp and decode 8 weights per lane and
// step from 4..8-byte loads: ~140 bytes in flight per warp, so the Kimi-Linear shape ran at ~440 GB/s at one
// token (83 us a layer for 37 MB; session 18), and a batch re-read an expert once per pair routed to it. Here the
// plan kernel's tiles (up to 2 pairs of one expert, moe_kernels.cu) each read their expert's rows once, with the
// dense v2 GEMV's wide loads and exact decoders (quant_part.cuh: a lane owns 32 weights of a 256-column unit,
// one 16-byte load of quants + the unit's header), two units ahead, and apply them to all the tile's pairs.
//
// Launches: gather (x rows into slot order, so a tile's activations are rows s0 .. s0 + c of one matrix, the
// layout the part decoders read), gate+up (GLU fused, hidden by slot), down (y by slot), moe_combine (rank
// order). Block = 8 warps x 4 row groups of 8 lanes: 32 rows of one tile's expert (gate+up: each row group reads
// gate row r and up row r). Numerics: the weights are the CPU's exact fp32 values, fp32 fma products and sums
// as the dense v2 GEMV's (per lane 4 accumulators per pair and matrix, 3 shuffle levels in the group), so each
// output depends only on its own pair's row: results do not depend on the tile a pair lands in or on batching.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/moe_decode.h"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/quant_decode.cuh"
#include "k3/backend/cuda/quant_moe.h"
#include "k3/backend/cuda/quant_part.cuh"
#include "k3/backend/cuda/quant_tables.h"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerBlock = kWarps * 4;  // 4 row groups of 8 lanes per warp

// slot-ordered copy of the activations: xs[slot_of[p]] = x[p / K] for every pair p with a valid expert.
__global__ void __launch_bounds__(256) gather_kernel(const float* __restrict__ x, int K, int X4, int64_t P,
                                                     const int32_t* __restrict__ slot_of, float* __restrict__ xs) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= P * X4) return;
  const int64_t p = i / X4;
  const int c = static_cast<int>(i % X4);
  const int s = slot_of[p];
  if (s < 0) return;
  reinterpret_cast<float4*>(xs)[static_cast<int64_t>(s) * X4 + c] = __ldg(reinterpret_cast<const float4*>(x) + (p / K) * X4 + c);
}

// The NT-pair dots of S weight rows (rows[s], `cols` wide) with xt[t * cols ..] for this lane's row group (lane i
// of 8 owns part i of every unit); every lane of the group ends with the group's sums.
template <WeightFormat F, int S, int NT>
__device__ __forceinline__ void group_dots(const uint8_t* const (&rows)[S], int64_t cols, const float* __restrict__ xt, int i,
                                           const IqTables& T, float (&out)[S][NT]) {
  using P = typename qpart::PartOf<F>::type;
  const typename P::Ctx ctx = P::context(T);
  float acc[S][NT][4];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[s][t][0] = acc[s][t][1] = acc[s][t][2] = acc[s][t][3] = 0.f;
  const int64_t units = (cols + 255) / 256;
  for (int64_t u = 0; u < units; u += 2) {
    const int64_t u1 = u + 1 < units ? u + 1 : u;  // the second unit's loads go out before the first is decoded
    typename P::Raw a[S], b[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
      a[s] = P::load(rows[s], u, i, cols);
      b[s] = P::load(rows[s], u1, i, cols);
    }
    if (P::valid(u, i, cols)) {
#pragma unroll
      for (int s = 0; s < S; ++s) P::template dot<NT>(a[s], xt + u * 256, cols, i, ctx, acc[s]);
    }
    if (u1 > u && P::valid(u1, i, cols)) {
#pragma unroll
      for (int s = 0; s < S; ++s) P::template dot<NT>(b[s], xt + u1 * 256, cols, i, ctx, acc[s]);
    }
  }
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float v = (acc[s][t][0] + acc[s][t][1]) + (acc[s][t][2] + acc[s][t][3]);
      v += __shfl_xor_sync(0xffffffffu, v, 4);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      out[s][t] = v;
    }
}

struct GroupArgs {
  const uint8_t* w0 = nullptr;  // gate (gate+up) or down: [E][rows] rows of row_bytes
  const uint8_t* w1 = nullptr;  // up (gate+up)
  int rows = 0, cols = 0;
  int64_t row_bytes = 0;
  const float* in = nullptr;  // [slot][cols]: gathered x, or hidden
  float* out = nullptr;       // [slot][rows]
  const int4* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  GluAct act = GluAct::SiLU;
  float beta = 1.f, lbeta = 1.f;
  IqTables T{};
};

// One tile's rows with NT pairs: S = 2 writes glu(gate, up), S = 1 the dot. Lane i of the group writes pair i.
template <WeightFormat F, int S, int NT>
__device__ __forceinline__ void tile_rows(const GroupArgs& a, int e, int s0, int row, int i) {
  const int r = row < a.rows ? row : a.rows - 1;  // past the matrix: computed (the shuffles need every lane), not written
  const int64_t off = (static_cast<int64_t>(e) * a.rows + r) * a.row_bytes;
  const uint8_t* rows[S];
  rows[0] = a.w0 + off;
  if constexpr (S == 2) rows[S - 1] = a.w1 + off;
  float d[S][NT];
  group_dots<F, S, NT>(rows, a.cols, a.in + static_cast<int64_t>(s0) * a.cols, i, a.T, d);
  if (row >= a.rows) return;
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    if (t != i) continue;
    const float v = S == 2 ? moe_dev::glu(d[0][t], d[S - 1][t], a.act, a.beta, a.lbeta) : d[0][t];
    a.out[static_cast<int64_t>(s0 + t) * a.rows + row] = v;
  }
}

// Grid (row blocks, tile bound); blocks past the plan's tile count exit. Tiles of at most 2 pairs: with 4 the
// gate+up kernels needed up to 1.1 KB of spills at 2 blocks per SM (128 registers), with 8 ~250 registers.
template <WeightFormat F, int S>
__global__ void __launch_bounds__(kWarps * 32, 2) grouped_kernel(const GroupArgs a) {
  pdl::begin();
  if (static_cast<int>(blockIdx.y) >= *a.num_tiles) return;
  const int4 td = a.tiles[blockIdx.y];
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * kRowsPerBlock + (threadIdx.x >> 5) * 4 + (lane >> 3);
  if (td.z == 2) return tile_rows<F, S, 2>(a, td.x, td.y, row, lane & 7);
  return tile_rows<F, S, 1>(a, td.x, td.y, row, lane & 7);
}

template <int S>
cudaError_t launch_grouped(WeightFormat f, const GroupArgs& a, int tiles_bound, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((a.rows + kRowsPerBlock - 1) / kRowsPerBlock), static_cast<unsigned>(tiles_bound));
  return with_gguf_format(f, [&](auto fc) {
    constexpr WeightFormat F = decltype(fc)::value;
    if constexpr (qpart::has_part(F)) {
      (void)pdl::launch(grouped_kernel<F, S>, grid, kWarps * 32, 0, s, a);
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

// A matrix the part decoders read: a format with one, and every row at the decoder's alignment.
bool part_ok(WeightFormat f, const void* base, int64_t row_bytes) {
  int align = 0;
  with_gguf_format(f, [&](auto fc) {
    constexpr WeightFormat F = decltype(fc)::value;
    if constexpr (qpart::has_part(F)) align = qpart::PartOf<F>::type::kAlign;
    return cudaSuccess;
  });
  return align > 0 && reinterpret_cast<uintptr_t>(base) % align == 0 && row_bytes % align == 0;
}

}  // namespace

int quant_moe_grouped_tile_pairs() { return 2; }

bool quant_moe_grouped_supported(const ExpertStack& w) {
  const WeightFormat df = expert_down_format(w);
  if (!is_gguf_block(w.format) || !is_gguf_block(df) || w.X % 4 != 0) return false;
  if (w.X % weight_layout(w.format).block_elems != 0 || w.I % weight_layout(df).block_elems != 0) return false;
  const int64_t gu = row_data_bytes(w.format, w.X), dn = row_data_bytes(df, w.I);
  return part_ok(w.format, w.gate, gu) && part_ok(w.format, w.up, gu) && part_ok(df, w.down, dn);
}

cudaError_t quant_moe_grouped(const ExpertStack& w, int n, int K, const float* x, const int32_t* slot_of, const int4* tiles,
                              const int32_t* num_tiles, int tiles_bound, const float* topk_w, GluAct act, float beta,
                              float lbeta, float* xs, float* hidden, float* y, float* out, cudaStream_t s) {
  if (!quant_moe_grouped_supported(w) || n < 0 || K <= 0 || tiles_bound < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t P = static_cast<int64_t>(n) * K, X4 = w.X / 4;
  (void)pdl::launch(gather_kernel, static_cast<unsigned>((P * X4 + 255) / 256), 256, 0, s, x, K, static_cast<int>(X4), P, slot_of, xs);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || tiles_bound == 0) return e;
  GroupArgs a;
  a.w0 = static_cast<const uint8_t*>(w.gate);
  a.w1 = static_cast<const uint8_t*>(w.up);
  a.rows = w.I, a.cols = w.X;
  a.row_bytes = row_data_bytes(w.format, w.X);
  a.in = xs, a.out = hidden;
  a.tiles = tiles, a.num_tiles = num_tiles;
  a.act = act, a.beta = beta, a.lbeta = lbeta;
  a.T = iq_tables();
  if ((e = launch_grouped<2>(w.format, a, tiles_bound, s)) != cudaSuccess) return e;
  const WeightFormat df = expert_down_format(w);
  a.w0 = static_cast<const uint8_t*>(w.down), a.w1 = nullptr;
  a.rows = w.X, a.cols = w.I;
  a.row_bytes = row_data_bytes(df, w.I);
  a.in = hidden, a.out = y;
  if ((e = launch_grouped<1>(df, a, tiles_bound, s)) != cudaSuccess) return e;
  return moe_combine(n, w.X, K, y, 0, 1, slot_of, topk_w, out, s);
}

}  // namespace k3::cuda
