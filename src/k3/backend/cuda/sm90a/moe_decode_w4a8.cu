// The W4A8 decode path of the routed experts (moe_decode_w4a8.h; building blocks in w4a8_mma.cuh).
//
// Grid of the expert kernel: (tile, 128-row block, K split); block = 2 warpgroups of 64 rows each over the split's
// 128-input chunks, PF chunks of weights in flight a lane (a register ring, refilled once a chunk is dequantised). The
// tile's activations (<= 8 rows of MXFP8 codes) are staged once per block in the A fragments' k order; rows past the
// tile's count are zeros. Gate and up are one launch (row blocks [0, I) of gate, then [I, 2 I) of up), each writing its
// partial sums [split][slot][2 I]; the GLU launch sums the splits in order, applies the GLU and rounds h to MXFP8 by
// slot; the down launch writes [split][slot][X] over them; moe_combine adds the splits and the ranks in order.
#include "k3/backend/cuda/moe_decode_w4a8.h"

#include <algorithm>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_decode.h"
#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/backend/cuda/mxfp8_quant.cuh"
#include "k3/backend/cuda/mxfp8_quant.h"
#include "k3/backend/cuda/pdl.cuh"
#include "k3/backend/cuda/sm90a/w4a8_mma.cuh"

namespace k3::cuda {
namespace {

constexpr int kThreads = 256;     // 2 warpgroups
constexpr int kRowsPerBlock = 128;
constexpr int kPF = 2;            // chunks in flight a lane (2 blocks of 256 an SM at 116 registers)
constexpr int kTok = 8;           // tokens a tile (the wgmma's N)

struct W8Args {
  const uint8_t* w0 = nullptr;   // gate (GLU2) or down: MXFP4 packed [E][rows][cols / 2]
  const uint8_t* s0 = nullptr;   // its E8M0 scales [E][rows][cols / 32]
  const uint8_t* w1 = nullptr;   // up (GLU2)
  const uint8_t* s1 = nullptr;
  int rows = 0, cols = 0;        // one matrix
  const uint8_t* a8 = nullptr;   // activation codes [source rows][cols]: x by token (GLU2) or h by slot
  const uint8_t* as = nullptr;   // their scales [source rows][cols / 32]
  const int32_t* sorted = nullptr;
  int K = 1;
  const int4* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  float* part = nullptr;         // [split][slot][ldo]
  int64_t split_stride = 0;
  int ldo = 0, cps = 0;          // partial row length; chunks per split
};

// Stages the tile's activations for groups [g0, g0 + G): codes in the A fragments' k order (w4a8_mma.cuh), exponent
// terms [group][token]. Slot j of the tile (j < cnt) reads token sorted[start + j] / K (GLU2) or slot start + j; the
// rest are padding (zeros). Each item looks up its own row: ~3.5 items a thread, not 8 rows for every thread.
template <bool GLU2>
__device__ __forceinline__ void stage_tile(const W8Args& a, int start, int cnt, int g0, int G, uint8_t* sb, uint32_t* sx) {
  const int gpr = a.cols / 32;
  for (int it = threadIdx.x; it < G * kTok; it += kThreads) {
    const int q = it / kTok, j = it % kTok;
    const int sr = j < cnt ? (GLU2 ? a.sorted[start + j] / a.K : start + j) : -1;
    uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
    uint32_t xs = 127u;
    if (sr >= 0) {
      const uint32_t s = a.as[static_cast<int64_t>(sr) * gpr + g0 + q];
      if (s >= w4a8::kFlushBelow) {
        const uint4* src = reinterpret_cast<const uint4*>(a.a8 + static_cast<int64_t>(sr) * a.cols + (g0 + q) * 32);
        v0 = __ldg(src);
        v1 = __ldg(src + 1);
        xs = s;
      }
    }
    uint32_t* c0 = reinterpret_cast<uint32_t*>(sb + q * 256 + j * 16);
    uint32_t* c1 = reinterpret_cast<uint32_t*>(sb + q * 256 + 128 + j * 16);
    const uint32_t w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int m = 0; m < 4; ++m) {  // inputs 8m..8m+7: the even ones to k 4m+i, the odd ones to k 16+4m+i
      c0[m] = __byte_perm(w[2 * m], w[2 * m + 1], 0x6420);
      c1[m] = __byte_perm(w[2 * m], w[2 * m + 1], 0x7531);
    }
    sx[q * kTok + j] = w4a8::act_exp_term(xs);
  }
}

template <bool GLU2>
__global__ void __launch_bounds__(kThreads, 1) w4a8_dec_kernel(const W8Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) {  // grid sized from an upper bound (num_tiles: plan_kernel's, complete before this starts)
    pdl::begin();
    return;
  }
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int nch = a.cols / 128;
  const int c0 = blockIdx.z * a.cps, c1 = min(nch, c0 + a.cps);
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int brow = blockIdx.y * kRowsPerBlock;                      // in the partial's row space ([0, 2 I) for GLU2)
  const bool up = GLU2 && brow >= a.rows;
  const uint8_t* W = up ? a.w1 : a.w0;
  const uint8_t* S = up ? a.s1 : a.s0;
  const int orow = brow + wg * 64 + warp * 16 + g, mrow = up ? orow - a.rows : orow;
  const int64_t row_bytes = a.cols / 2, srow_bytes = a.cols / 32;
  const uint8_t* row0 = W + (static_cast<int64_t>(e) * a.rows + mrow) * row_bytes;
  const uint8_t* row1 = row0 + 8 * row_bytes;
  const uint32_t* sp0 = reinterpret_cast<const uint32_t*>(S + (static_cast<int64_t>(e) * a.rows + mrow) * srow_bytes);
  const uint32_t* sp1 = sp0 + 8 * srow_bytes / 4;

  // The ring's first weights before waiting on the previous kernel (weights only: pdl.cuh's contract).
  uint4 ra[kPF], rb[kPF];
  uint32_t sa[kPF], sb[kPF];
#pragma unroll
  for (int p = 0; p < kPF; ++p)
    if (c0 + p < c1) {
      ra[p] = w4a8::load_chunk_words(row0, c0 + p, t);
      rb[p] = w4a8::load_chunk_words(row1, c0 + p, t);
      sa[p] = w4a8::ld_nc_u32(sp0 + c0 + p);
      sb[p] = w4a8::ld_nc_u32(sp1 + c0 + p);
    }
  pdl::begin();
  const int G = (c1 - c0) * 4;
  uint8_t* sbuf = smem;                                            // [G][2][8][16]
  uint32_t* sx = reinterpret_cast<uint32_t*>(smem + G * 256);      // [G][8]
  stage_tile<GLU2>(a, start, cnt, c0 * 4, G, sbuf, sx);
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy stores -> the wgmma's reads
  __syncthreads();

  const uint64_t desc0 = w4a8::group_desc(static_cast<uint32_t>(__cvta_generic_to_shared(sbuf)));
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  int c = c0;
  for (; c + kPF <= c1; c += kPF) {  // whole rounds of the ring: static slots, no copies
#pragma unroll
    for (int p = 0; p < kPF; ++p) {
      uint32_t fr[4][4];
      w4a8::dequant_chunk(ra[p], rb[p], fr);
      w4a8::settle(fr);
      const int nx = c + p + kPF;
      if (nx < c1) {
        ra[p] = w4a8::load_chunk_words(row0, nx, t);
        rb[p] = w4a8::load_chunk_words(row1, nx, t);
      }
      const int gl = (c - c0 + p) * 4;
      w4a8::chunk_products(fr, sa[p], sb[p], desc0 + static_cast<uint64_t>(gl * 16), sx + gl * kTok, t, acc);
      if (nx < c1) {
        sa[p] = w4a8::ld_nc_u32(sp0 + nx);
        sb[p] = w4a8::ld_nc_u32(sp1 + nx);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < kPF; ++p)  // the last partial round (the same for every thread of the block)
    if (c + p < c1) {
      uint32_t fr[4][4];
      w4a8::dequant_chunk(ra[p], rb[p], fr);
      w4a8::settle(fr);
      const int gl = (c - c0 + p) * 4;
      w4a8::chunk_products(fr, sa[p], sb[p], desc0 + static_cast<uint64_t>(gl * 16), sx + gl * kTok, t, acc);
    }
  // acc: (row orow, token 2t), (orow, 2t + 1), (orow + 8, 2t), (orow + 8, 2t + 1).
  float* part = a.part + static_cast<int64_t>(blockIdx.z) * a.split_stride;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int j = 2 * t + (i & 1), r = orow + 8 * (i >> 1);
    if (j < cnt) part[static_cast<int64_t>(start + j) * a.ldo + r] = acc[i];
  }
}

// h of each slot of each tile: the gate / up partials summed over splits in order, the GLU, rounded to MXFP8. One
// thread per (slot, 32-input group).
__global__ void __launch_bounds__(256) w4a8_glu_kernel(const float* __restrict__ part, int64_t split_stride, int splits,
                                                       int I, const int4* __restrict__ tiles,
                                                       const int32_t* __restrict__ num_tiles, GluAct act, float beta,
                                                       float lbeta, uint8_t* __restrict__ h8, uint8_t* __restrict__ hs) {
  pdl::begin();
  const int tile = blockIdx.x;
  if (tile >= *num_tiles) return;
  const int4 td = tiles[tile];
  const int groups = I / 32;
  for (int it = threadIdx.x; it < td.z * groups; it += blockDim.x) {
    const int slot = td.y + it / groups, grp = it % groups;
    float h[32];
    float amax = 0.f;
#pragma unroll 4
    for (int i = 0; i < 32; ++i) {
      const int64_t o = static_cast<int64_t>(slot) * 2 * I + grp * 32 + i;
      float gs = 0.f, us = 0.f;
      for (int s = 0; s < splits; ++s) {  // fixed order
        gs += part[s * split_stride + o];
        us += part[s * split_stride + o + I];
      }
      h[i] = moe_dev::glu(gs, us, act, beta, lbeta);
      amax = fmaxf(amax, fabsf(h[i]));
    }
    const uint32_t sc = mxfp8::scale_byte(amax);
    const float inv = mxfp8::inverse_scale(sc);
    uint8_t* dst = h8 + static_cast<int64_t>(slot) * I + grp * 32;
#pragma unroll
    for (int i = 0; i < 32; i += 4)
      *reinterpret_cast<uint32_t*>(dst + i) = mxfp8::code(h[i], inv) | (mxfp8::code(h[i + 1], inv) << 8) |
                                              (mxfp8::code(h[i + 2], inv) << 16) |
                                              (static_cast<uint32_t>(mxfp8::code(h[i + 3], inv)) << 24);
    hs[static_cast<int64_t>(slot) * groups + grp] = static_cast<uint8_t>(sc);
  }
}

// K splits for one expert launch: ~2 blocks an SM over the tiles the batch can touch, within the partial buffer.
int w4a8_splits(int est_tiles, int row_blocks, int nch, int64_t floats_per_split, int64_t cap, int& cps) {
  const int64_t blocks = static_cast<int64_t>(std::max(1, est_tiles)) * row_blocks;
  const int64_t want = (2 * static_cast<int64_t>(device_sm_count()) + blocks - 1) / blocks;
  const int64_t wk = std::max<int64_t>(1, std::min<int64_t>({want, nch, cap / std::max<int64_t>(1, floats_per_split)}));
  cps = static_cast<int>((nch + wk - 1) / wk);
  return (nch + cps - 1) / cps;
}

template <bool GLU2>
cudaError_t launch_experts(const W8Args& a, int tiles_bound, int row_blocks, int splits, cudaStream_t stream) {
  const int smem = a.cps * 4 * (256 + kTok * 4);
  static const cudaError_t attr =
      cudaFuncSetAttribute(w4a8_dec_kernel<GLU2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);
  if (attr != cudaSuccess) return attr;
  if (smem > 160 * 1024) return cudaErrorInvalidValue;
  (void)pdl::launch(w4a8_dec_kernel<GLU2>, dim3(tiles_bound, row_blocks, splits), kThreads, smem, stream, a);
  return cudaGetLastError();
}

}  // namespace

bool moe_w4a8_supported(const ExpertBank& w) {
  return w.format == WeightFormat::MXFP4 && w.I % 128 == 0 && w.X % 128 == 0 && moe_wg::supports(w);
}

cudaError_t moe_w4a8_experts(const ExpertBank& w, int n, int K, int tok, const float* x, const int32_t* sorted,
                             const int32_t* slot_of, const int4* tiles, const int32_t* num_tiles, int tiles_bound,
                             const float* topk_w, GluAct act, float beta, float lbeta, float* out, const W4a8Scratch& s,
                             cudaStream_t stream) {
  const int P = n * K, I = w.I, X = w.X;
  if (tok != kTok || !moe_w4a8_supported(w) || n > s.max_tokens || P > s.max_pairs) return cudaErrorInvalidValue;
  cudaError_t e = quantize_mxfp8_rows(x, n, X, s.x8, s.xs, stream);
  if (e != cudaSuccess) return e;
  if (static_cast<int64_t>(P) * 2 * I > s.part_floats || static_cast<int64_t>(P) * X > s.part_floats) return cudaErrorInvalidValue;
  const int est_tiles = std::min(P, w.E);
  // One matrix pair's launch: weights (w1 for GLU2's up rows), the activation codes it stages, its partial row length.
  const auto args = [&](const void* w0, const uint8_t* s0, const void* w1, const uint8_t* s1, int rows, int cols,
                        const uint8_t* a8, const uint8_t* as, int ldo) {
    W8Args a;
    a.w0 = static_cast<const uint8_t*>(w0);
    a.s0 = s0;
    a.w1 = static_cast<const uint8_t*>(w1);
    a.s1 = s1;
    a.rows = rows;
    a.cols = cols;
    a.a8 = a8;
    a.as = as;
    a.sorted = sorted;
    a.K = K;
    a.tiles = tiles;
    a.num_tiles = num_tiles;
    a.part = s.part;  // the down partials over the gate/up ones: the GLU launch has read them when down writes (after its wait)
    a.ldo = ldo;
    a.split_stride = static_cast<int64_t>(P) * ldo;
    return a;
  };
  W8Args gu = args(w.gate, w.gate_scales, w.up, w.up_scales, I, X, s.x8, s.xs, 2 * I);
  const int rb_gu = 2 * I / kRowsPerBlock;
  const int sp_gu = w4a8_splits(est_tiles, rb_gu, X / 128, gu.split_stride, s.part_floats, gu.cps);
  e = launch_experts<true>(gu, tiles_bound, rb_gu, sp_gu, stream);
  if (e != cudaSuccess) return e;
  (void)pdl::launch(w4a8_glu_kernel, tiles_bound, 256, 0, stream, static_cast<const float*>(s.part), gu.split_stride,
                    sp_gu, I, tiles, num_tiles, act, beta, lbeta, s.h8, s.hs);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  W8Args a = args(w.down, w.down_scales, nullptr, nullptr, X, I, s.h8, s.hs, X);
  const int rb_dn = X / kRowsPerBlock;
  const int sp_dn = w4a8_splits(est_tiles, rb_dn, I / 128, a.split_stride, s.part_floats, a.cps);
  e = launch_experts<false>(a, tiles_bound, rb_dn, sp_dn, stream);
  if (e != cudaSuccess) return e;
  return moe_combine(n, X, K, a.part, a.split_stride, sp_dn, slot_of, topk_w, out, stream);
}

}  // namespace k3::cuda
