// MoE kernels (see moe_kernels.h; CPU reference: moe_layer() in model/ffn_layers.cpp).
//
// Routing: one block per token; K rounds of a block-wide argmax over the biased scores with the total
// order (score desc, id asc), so the pick is unique and independent of the reduction tree, and ties go
// to the lower id like the CPU's partial_sort comparator. The weights use the same fp32 operations in
// the same order as the CPU (denominator summed in rank order).
//
// Experts (SIMT path, decode-sized batches), four launches, no host synchronisation and no allocation (CUDA-graph capturable):
//  1. plan (one block): count the (token, k) pairs per expert in shared memory, scan the counts, cut each
//     expert's pairs into tiles of up to TOK pairs, and scatter the pair ids into expert order
//     ("slots"); slot_of[pair] remembers where each pair landed.
//  2. gate+up: block = (tile, 16 output rows). A warp owns R rows of gate and the same R rows of up;
//     lane l takes 32-column groups l, l+32, ... (one group = one 16-byte load of MXFP4, or four of bf16,
//     so a warp reads contiguous bytes). Each weight is decoded once in registers and applied to all
//     pairs of the tile (W4A16: weight bytes are read once per tile, not once per token). The tile's
//     activations are staged in shared memory in chunks of CG groups, 36 floats per group (4 pad floats
//     make the lanes' 16-byte reads of different groups conflict-free). Writes act(g) * up by slot.
//  3. down: the same kernel with one matrix, reading hidden by slot; writes y by slot.
//  4. combine: out[t] = sum over k in rank order of w[t][k] * y[slot_of[t*K+k]]: deterministic, no atomics.
// Every pair's arithmetic is the same whichever tile slot it lands in (the per-slot loops are unrolled
// and uniform), so the results do not depend on the (atomic) order of the scatter or on batching.
// The tile kernels' grids are sized from the host-known bound ceil(P/TOK) + min(E, P) tiles; blocks past
// the real tile count (read on the device) exit at once.
// TOK: 4 when there are at most as many pairs as experts (decode: tiles hold ~1 pair, fewer accumulator
// registers, more blocks resident), else 8 (16 needed ~220 registers per thread or spilled at 128).
//
// Tensor-core path (prefill; moe_experts_use_tc: n * K >= 2 * E, i.e. >= 2 pairs per expert on average):
// the SIMT tiles are fp32-FMA-bound once several pairs share an expert (12-14 TFLOP/s on an H200), so the
// plan cuts tiles of up to 64 pairs instead (same plan kernel, tok = 64) and steps 2-3 become
// expert_tc_kernel: block = (tile, N-tile of 64 gate + 64 up rows, or 128 down rows), 8 warps as 2 (M:
// 32 pairs) x 4 (N), Ampere-style mma.sync m16n8k16 bf16 -> fp32 with ldmatrix fragments (no wgmma).
// K loop in chunks of 32 columns, double-buffered through registers: A = the tile's activations (fp32 in
// global -> bf16 in shared memory; pairs past the count are zero rows), B = the weight rows (bf16 as
// stored, or MXFP4 dequantised to bf16 when staging: an E2M1 value times 2^(s-127) has 2 significant bits,
// so it is exact in bf16). Rows and columns past the matrix (I = 48, any multiple of 8 / 32) are zero.
// Precision: weights are exact; activations are split x = hi + lo (hi = bf16(x), lo = bf16(x - hi)) and
// both halves go through the MMA into the same fp32 accumulators (~1e-5 relative, matching the fp32 CPU
// reference to 1e-4); MoePrecision::Bf16 skips lo (half the MMAs, ~1e-3). gate+up keeps the gate and up
// accumulators of the same rows in one warp and applies the GLU in registers; down writes y by slot; the
// combine kernel is shared. Warps whose 32 pairs lie past the tile's count only stage (few pairs per
// expert at n ~ 2E..8E). Shared memory: 2 buffers x (64 x 40 bf16 A (x2 split) + 128 x 40 bf16 B) = 41 KiB
// (31 KiB plain) static; ~96 registers, no spills, 2 blocks per SM (launch bounds). The 64-pair tiles
// change the rounding (bf16 MMAs vs fp32 FMAs) but still not with the scatter order: each output
// element is a function of its own pair's row only.
// GGUF block experts take this path from 2.5 pairs per expert (session 18, moe_tc_tile.cuh / quant_moe_tc.cu: the
// blocks' raw bytes staged by cp.async a 256-column stage ahead, decoded to bf16 while staging B, activations bf16),
// below it quant_moe.h's grouped or per-pair decode kernels (quant_moe_choice).
#include "k3/backend/cuda/moe_kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "k3/backend/cuda/moe_decode.h"
#include "k3/backend/cuda/moe_decode_w4a8.h"
#include "k3/backend/cuda/moe_gemv.h"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_grouped_gemm.h"
#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/backend/cuda/moe_tc_tile.cuh"
#include "k3/backend/cuda/mxfp4_decode.cuh"
#include "k3/backend/cuda/mxfp8_quant.h"
#include "k3/backend/cuda/quant_moe.h"
#include "k3/backend/cuda/warp_argmax.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)
#include "k3/core/error.h"

namespace k3::cuda {
namespace {

constexpr int kMaxE = 4096;
constexpr int kMaxK = 32;
constexpr int kRouteThreads = 256;
constexpr int kPlanThreads = 1024;
constexpr int kTileWarps = 8;
constexpr int kTileThreads = kTileWarps * 32;
constexpr int kGroupF4 = 9;  // float4s per 32-column group in shared memory (32 values + 4 pad floats)
constexpr int kGateUpR = 2;  // rows per warp of each of gate and up: 4 weight rows per warp
constexpr int kDownR = 4;    // rows per warp of down: 4 weight rows per warp
constexpr int kGateUpRowsPerBlock = kTileWarps * kGateUpR;
constexpr int kDownRowsPerBlock = kTileWarps * kDownR;
// Shared-memory chunk (groups of 32 columns) per tile size: both stage 36 KiB of activations (under the
// 48 KiB default, so no opt-in attribute is needed).
template <int TOK>
__host__ __device__ constexpr int chunk_groups() {
  return TOK <= 4 ? 64 : 32;
}
// Resident blocks per SM asked of ptxas (caps registers at 65536 / (256 * this)): enough warps to keep
// loads in flight (TOK 8: 128 registers, no spills; a 16-pair tile needed ~220 or spilled).
template <int TOK>
__host__ __device__ constexpr int min_blocks() {
  return TOK <= 4 ? 3 : 2;
}
template <int TOK>
constexpr size_t tile_smem() {
  return static_cast<size_t>(TOK) * chunk_groups<TOK>() * kGroupF4 * sizeof(float4);
}

// ---------------------------------------------------------------------------------------------- routing


__global__ void __launch_bounds__(kRouteThreads)
    route_kernel(int E, int K, const float* __restrict__ logits, const float* __restrict__ bias, bool renormalize,
                 float scale, int32_t* __restrict__ topk_idx, float* __restrict__ topk_w) {
  pdl::begin();
  __shared__ float s_sig[kMaxE];
  __shared__ float s_biased[kMaxE];
  __shared__ unsigned char s_taken[kMaxE];
  __shared__ float s_wv[kRouteThreads / 32];
  __shared__ int s_wi[kRouteThreads / 32];
  __shared__ int s_pick[kMaxK];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* lt = logits + static_cast<int64_t>(t) * E;
  for (int e = threadIdx.x; e < E; e += kRouteThreads) {
    const float s = 1.0f / (1.0f + expf(-lt[e]));  // cpu::sigmoidf; expf, not __expf: keep ulp-close
    s_sig[e] = s;
    s_biased[e] = bias ? s + bias[e] : s;
    s_taken[e] = 0;
  }
  __syncthreads();
  for (int k = 0; k < K; ++k) {
    float bv = 0.f;
    int bi = -1;
    for (int e = threadIdx.x; e < E; e += kRouteThreads)
      if (!s_taken[e] && better(s_biased[e], e, bv, bi)) {
        bv = s_biased[e];
        bi = e;
      }
    warp_best(bv, bi);
    if (lane == 0) {
      s_wv[warp] = bv;
      s_wi[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kRouteThreads / 32; ++w)
        if (better(s_wv[w], s_wi[w], bv, bi)) {
          bv = s_wv[w];
          bi = s_wi[w];
        }
      // bi < 0 only if every score is NaN; pick the lowest free id so the ids stay valid.
      if (bi < 0)
        for (int e = 0; e < E; ++e)
          if (!s_taken[e]) {
            bi = e;
            break;
          }
      s_pick[k] = bi;
      s_taken[bi] = 1;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    float denom = 0.f;
    for (int k = 0; k < K; ++k) denom += s_sig[s_pick[k]];
    for (int k = 0; k < K; ++k) {
      const float s = s_sig[s_pick[k]];
      topk_idx[static_cast<int64_t>(t) * K + k] = s_pick[k];
      topk_w[static_cast<int64_t>(t) * K + k] = (renormalize ? s / (denom + 1e-20f) : s) * scale;
    }
  }
}

// The same routing with one warp per token, for E <= 32 J: lane l holds experts l, l + 32, ... as order-preserving
// 32-bit keys in registers (route_key), and each of the K rounds is a warp argmax on two redux.sync instructions:
// the largest key (__reduce_max_sync), then the lowest id holding it (__reduce_min_sync) -- higher score, then lower
// id: `better`'s order, so the same picks and weights as the block kernel for every input without NaN scores. A
// NaN score keys as 1, below every number and above a taken or padding slot (0): picked only when nothing else is
// left; the ids stay valid and distinct.
// Session 45: a lane's best slot is a tree over its J keys (the left, lower slot on ties) instead of a linear scan of
// 64-bit (key, slot) values, a taken slot's key is zeroed instead of a mask tested per slot, and the picks' sigmoids
// are recomputed from their logits at the end (the same expression) instead of being carried through the rounds.
// CudaMoe.RouteTiming (graph of 200 launches, s45-1, H100): the scan form took 5.3 us a launch for E 256 / K 8 and
// 18.0 us for E 896 / K 16 -- one warp's serial chain (ncu: 7.9 cycles per issued instruction).
__device__ __forceinline__ uint32_t route_key(float v) {
  if (v != v) return 1u;  // NaN: below every number (their keys are >= 0x007fffff), above "none"
  uint32_t u = __float_as_uint(v);
  if (u == 0x80000000u) u = 0u;  // -0 == +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The warp and block forms' shared steps. A thread's J keys: experts first, first + STRIDE, ... (padding: 0, never picked).
template <int J, int STRIDE>
__device__ __forceinline__ void route_keys(uint32_t (&key)[J], int first, int E, const float* lt, const float* bias) {
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int e = first + STRIDE * j;
    const float s = e < E ? 1.0f / (1.0f + expf(-lt[e])) : 0.f;  // expf as the scan kernel and the CPU
    key[j] = e < E ? route_key(bias ? s + bias[e] : s) : 0u;
  }
}
// The thread's largest key and its slot: a tree over the J keys, the lower slot (lower id) keeping a tie.
template <int J>
__device__ __forceinline__ uint32_t best_key(const uint32_t (&key)[J], int& best_slot) {
  uint32_t v[J];
  int slot[J];
#pragma unroll
  for (int j = 0; j < J; ++j) {
    v[j] = key[j];
    slot[j] = j;
  }
#pragma unroll
  for (int st = 1; st < J; st *= 2)
#pragma unroll
    for (int j = 0; j + st < J; j += 2 * st)
      if (v[j + st] > v[j]) {  // strict: the lower slot keeps a tie
        v[j] = v[j + st];
        slot[j] = slot[j + st];
      }
  best_slot = slot[0];
  return v[0];
}
// The picked slot's key zeroed by its owner (kill == J elsewhere: nothing changes).
template <int J>
__device__ __forceinline__ void zero_key(uint32_t (&key)[J], int kill) {
#pragma unroll
  for (int j = 0; j < J; ++j) key[j] = j == kill ? 0u : key[j];
}
// One warp writes token t's K picks (lane k holds the rank-k pick): each pick's sigmoid recomputed from its logit (the
// same expression as route_keys), the denominator summed in rank order.
__device__ __forceinline__ void write_picks(int lane, int K, int pick, const float* lt, bool renormalize, float scale,
                                            int64_t t, int32_t* __restrict__ topk_idx, float* __restrict__ topk_w) {
  const float s = lane < K ? 1.0f / (1.0f + expf(-lt[pick])) : 0.f;
  float denom = 0.f;
  for (int k = 0; k < K; ++k) denom += __shfl_sync(0xffffffffu, s, k);
  if (lane < K) {
    topk_idx[t * K + lane] = pick;
    topk_w[t * K + lane] = (renormalize ? s / (denom + 1e-20f) : s) * scale;
  }
}

template <int J>
__global__ void __launch_bounds__(128)
    route_warp_kernel(int n, int E, int K, const float* __restrict__ logits, const float* __restrict__ bias,
                      bool renormalize, float scale, int32_t* __restrict__ topk_idx, float* __restrict__ topk_w) {
  pdl::begin();
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * 4 + (threadIdx.x >> 5);
  if (t >= n) return;
  const float* lt = logits + static_cast<int64_t>(t) * E;
  uint32_t key[J];
  route_keys<J, 32>(key, lane, E, lt, bias);
  int my_pick = 0;  // lane k keeps the rank-k pick
  for (int k = 0; k < K; ++k) {
    int slot0;
    const uint32_t v0 = best_key<J>(key, slot0);
    const uint32_t top = __reduce_max_sync(0xffffffffu, v0);  // > 0: K <= E free slots exist
    const uint32_t mine = v0 == top ? static_cast<uint32_t>(lane + 32 * slot0) : 0xffffffffu;
    const int bi = static_cast<int>(__reduce_min_sync(0xffffffffu, mine));
    zero_key<J>(key, lane == (bi & 31) ? bi >> 5 : J);  // the owner zeroes the picked slot's key
    if (lane == k) my_pick = bi;
  }
  write_picks(lane, K, my_pick, lt, renormalize, scale, t, topk_idx, topk_w);
}

// The same routing with four warps a token (E <= 128 J): thread i holds experts i, i + 128, ... as route keys, and each
// of the K rounds is the warp kernel's argmax lifted to the block -- a tree over the thread's J keys, the warp's largest
// key (redux), the block's through shared memory, the lowest id holding it (redux, shared memory). Same keys, same
// order (higher key, then lower id), so the same picks and weights as route_warp_kernel for every input. Why: the warp
// form's round is a serial chain over 28 keys a lane for K3's 896 experts (18.0 -> 15.3 us a launch, session 45, for
// 16 rounds); here a thread holds 7 and a round costs two barriers. The round's two shared slots alternate between
// even and odd rounds: a slot is written again two rounds later, after every thread has passed the barriers that
// follow its last read, so two barriers a round suffice.
template <int J>
__global__ void __launch_bounds__(128)
    route_block_kernel(int E, int K, const float* __restrict__ logits, const float* __restrict__ bias, bool renormalize,
                       float scale, int32_t* __restrict__ topk_idx, float* __restrict__ topk_w) {
  pdl::begin();
  __shared__ uint32_t s_top[2][4], s_id[2][4];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, t = blockIdx.x;
  const float* lt = logits + static_cast<int64_t>(t) * E;
  uint32_t key[J];
  route_keys<J, 128>(key, tid, E, lt, bias);
  int my_pick = 0;  // thread k (k < K <= 32: warp 0) keeps the rank-k pick
  for (int k = 0; k < K; ++k) {
    int slot0;
    const uint32_t v0 = best_key<J>(key, slot0);
    const int b = k & 1;
    const uint32_t wtop = __reduce_max_sync(0xffffffffu, v0);
    if (lane == 0) s_top[b][warp] = wtop;
    __syncthreads();
    const uint32_t top = max(max(s_top[b][0], s_top[b][1]), max(s_top[b][2], s_top[b][3]));  // > 0: K <= E
    const uint32_t mine = v0 == top ? static_cast<uint32_t>(tid + 128 * slot0) : 0xffffffffu;
    const uint32_t wid = __reduce_min_sync(0xffffffffu, mine);
    if (lane == 0) s_id[b][warp] = wid;
    __syncthreads();
    const int bi = static_cast<int>(min(min(s_id[b][0], s_id[b][1]), min(s_id[b][2], s_id[b][3])));
    zero_key<J>(key, tid == (bi & 127) ? bi >> 7 : J);  // the owner zeroes the picked slot's key
    if (tid == k) my_pick = bi;
  }
  if (warp != 0) return;
  write_picks(lane, K, my_pick, lt, renormalize, scale, t, topk_idx, topk_w);
}

// ------------------------------------------------------------------------------------------------- plan

// One block. Pairs with an expert id outside [0, E) are dropped (slot_of = -1: they add nothing).
__global__ void __launch_bounds__(kPlanThreads)
    plan_kernel(const int32_t* __restrict__ topk_idx, int P, int E, int tok, int32_t* __restrict__ sorted,
                int32_t* __restrict__ slot_of, int4* __restrict__ tiles, int32_t* __restrict__ num_tiles,
                int32_t* __restrict__ expert_off) {
  pdl::begin();
  __shared__ int cnt[kMaxE];  // counts, then per-expert scatter cursors
  __shared__ int warp_p[32], warp_t[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < E; e += kPlanThreads) cnt[e] = 0;
  __syncthreads();
  for (int p = tid; p < P; p += kPlanThreads) {
    const int e = topk_idx[p];
    if (static_cast<unsigned>(e) < static_cast<unsigned>(E)) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  // Each thread owns a contiguous run of experts; block-wide exclusive scan of (pairs, tiles).
  const int per = (E + kPlanThreads - 1) / kPlanThreads;
  const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
  int my_p = 0, my_t = 0;
  for (int e = e0; e < e1; ++e) {
    my_p += cnt[e];
    my_t += (cnt[e] + tok - 1) / tok;
  }
  int ip = my_p, it = my_t;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, ip, o), b = __shfl_up_sync(0xffffffffu, it, o);
    if (lane >= o) {
      ip += a;
      it += b;
    }
  }
  if (lane == 31) {
    warp_p[warp] = ip;
    warp_t[warp] = it;
  }
  __syncthreads();
  if (warp == 0) {
    const int vp = warp_p[lane], vt = warp_t[lane];
    int sp = vp, st = vt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, sp, o), b = __shfl_up_sync(0xffffffffu, st, o);
      if (lane >= o) {
        sp += a;
        st += b;
      }
    }
    warp_p[lane] = sp - vp;
    warp_t[lane] = st - vt;
  }
  __syncthreads();
  int off_p = warp_p[warp] + ip - my_p, off_t = warp_t[warp] + it - my_t;
  for (int e = e0; e < e1; ++e) {
    const int c = cnt[e];
    cnt[e] = off_p;
    if (expert_off) expert_off[e] = off_p;
    for (int j = 0; j < c; j += tok) tiles[off_t++] = make_int4(e, off_p + j, min(tok, c - j), 0);
    off_p += c;
  }
  if (tid == kPlanThreads - 1) {  // the last thread ends at the totals
    *num_tiles = off_t;
    if (expert_off) expert_off[E] = off_p;
  }
  __syncthreads();
  for (int p = tid; p < P; p += kPlanThreads) {
    const int e = topk_idx[p];
    if (static_cast<unsigned>(e) < static_cast<unsigned>(E)) {
      const int s = atomicAdd(&cnt[e], 1);
      sorted[s] = p;
      slot_of[p] = s;
    } else {
      slot_of[p] = -1;
    }
  }
}

// ----------------------------------------------------------------------------------------- expert tiles
// (TileArgs, the tensor-core tile and its helpers: moe_tc_tile.cuh)

__device__ __forceinline__ uint32_t word(const uint4& q, int k) {
  return k == 0 ? q.x : k == 1 ? q.y : k == 2 ? q.z : q.w;
}

// acc[i][t] += wf[i][0..7] . x_t[0..7] for the tile's pairs t < cnt (x_t: 2 float4 at xg + t*tstride).
template <int NR, int TOK>
__device__ __forceinline__ void fma_tokens(float (&acc)[NR][TOK], const float (&wf)[NR][8], const float4* xg,
                                           int tstride, int cnt) {
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
    if (t < cnt) {  // block-uniform
      const float4 xa = xg[t * tstride], xb = xg[t * tstride + 1];
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        float a = acc[i][t];
        a = fmaf(wf[i][0], xa.x, a);
        a = fmaf(wf[i][1], xa.y, a);
        a = fmaf(wf[i][2], xa.z, a);
        a = fmaf(wf[i][3], xa.w, a);
        a = fmaf(wf[i][4], xb.x, a);
        a = fmaf(wf[i][5], xb.y, a);
        a = fmaf(wf[i][6], xb.z, a);
        a = fmaf(wf[i][7], xb.w, a);
        acc[i][t] = a;
      }
    }
  }
}

// acc[i][t] += sc[i] * (wf[i][0..7] . x_t[0..7]): the MXFP4 form, the group scale applied to the dot product.
template <int NR, int TOK>
__device__ __forceinline__ void fma_tokens_scaled(float (&acc)[NR][TOK], const float (&wf)[NR][8], const float (&sc)[NR],
                                                  const float4* xg, int tstride, int cnt) {
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
    if (t < cnt) {  // block-uniform
      const float4 xa = xg[t * tstride], xb = xg[t * tstride + 1];
#pragma unroll
      for (int i = 0; i < NR; ++i) {
        float d = wf[i][0] * xa.x;
        d = fmaf(wf[i][1], xa.y, d);
        d = fmaf(wf[i][2], xa.z, d);
        d = fmaf(wf[i][3], xa.w, d);
        d = fmaf(wf[i][4], xb.x, d);
        d = fmaf(wf[i][5], xb.y, d);
        d = fmaf(wf[i][6], xb.z, d);
        d = fmaf(wf[i][7], xb.w, d);
        acc[i][t] = fmaf(d, sc[i], acc[i][t]);
      }
    }
  }
}

// NMAT 2: out = glu(gate . in, up . in); NMAT 1: out = w0 . in. R rows per warp of each matrix.
template <bool MX, int NMAT, int R, int TOK, bool GATHER>
__global__ void __launch_bounds__(kTileThreads, min_blocks<TOK>()) expert_tile_kernel(const TileArgs a) {
  pdl::begin();
  constexpr int CG = chunk_groups<TOK>();
  constexpr int NR = NMAT * R;
  extern __shared__ float4 xs4[];  // [TOK][CG][kGroupF4]
  __shared__ int src_row[TOK];
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;  // whole block: grid sized from an upper bound
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // bf16 widths need only be multiples of 8 (tiny Kimi-Linear: I = 48): the last group may be partial, its
  // missing 8-column pieces are neither staged nor read. MXFP4 widths are multiples of 32.
  const int rows = a.rows, cols = a.cols, groups = (cols + 31) >> 5, cols8 = cols >> 3;
  if (threadIdx.x < TOK)
    src_row[threadIdx.x] =
        threadIdx.x < cnt ? (GATHER ? a.sorted[start + threadIdx.x] / a.K : start + static_cast<int>(threadIdx.x)) : 0;

  // Rows past the end re-read the last row (never stored): warps must stay for __syncthreads. The R rows
  // sit at the same offsets in gate and up, so one offset per row (in 16-byte units; for MXFP4 also the
  // scale index of group 0) serves both; fewer live pointers keep the kernel within its register budget.
  const int row_base = (blockIdx.y * kTileWarps + warp) * R;
  const int64_t mat_units = static_cast<int64_t>(rows) * (MX ? groups : cols / 8);  // uint4s per expert matrix
  const uint4* wb[NMAT];
  const uint8_t* sb[NMAT];
#pragma unroll
  for (int m = 0; m < NMAT; ++m) {
    wb[m] = static_cast<const uint4*>(m == 0 ? a.w0 : a.w1) + e * mat_units;
    sb[m] = MX ? (m == 0 ? a.s0 : a.s1) + e * mat_units : nullptr;  // scales: one byte per group
  }
  int roff[R];
#pragma unroll
  for (int r = 0; r < R; ++r) roff[r] = min(row_base + r, rows - 1) * (MX ? groups : cols / 8);

  float acc[NR][TOK];
#pragma unroll
  for (int i = 0; i < NR; ++i)
#pragma unroll
    for (int t = 0; t < TOK; ++t) acc[i][t] = 0.f;

  for (int c0 = 0; c0 < groups; c0 += CG) {
    const int cg = min(CG, groups - c0);
    __syncthreads();  // src_row ready; the previous chunk's readers are done
    const int per_tok = cg * 8;  // float4s per pair in this chunk
    for (int i = threadIdx.x; i < cnt * per_tok; i += kTileThreads) {
      const int t = i / per_tok, rem = i - t * per_tok, g = rem >> 3, q = rem & 7;
      if (!MX && (c0 + g) * 8 + q >= cols >> 2) continue;  // past the end of a partial group
      const float4* src = reinterpret_cast<const float4*>(a.in + static_cast<int64_t>(src_row[t]) * cols) +
                          static_cast<int64_t>(c0 + g) * 8 + q;
      xs4[(t * CG + g) * kGroupF4 + q] = __ldg(src);
    }
    __syncthreads();
    for (int g = lane; g < cg; g += 32) {
      const int gg = c0 + g;
      const float4* xg = xs4 + g * kGroupF4;
      if constexpr (MX) {
        uint4 q[NR];
        float sc[NR];
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          q[i] = __ldg(wb[i / R] + roff[i % R] + gg);
          sc[i] = e8m0_scale_x2p14(__ldg(sb[i / R] + roff[i % R] + gg));
        }
#pragma unroll
        for (int k8 = 0; k8 < 4; ++k8) {
          // Unscaled E2M1 values; each 8-column dot product is scaled once (an FMA per row and pair
          // instead of 8 multiplies per row): the kernel is issue-bound (ncu: SM 64%, DRAM 23%).
          float wf[NR][8];
#pragma unroll
          for (int i = 0; i < NR; ++i) e2m1x8_to_float_x2m14(word(q[i], k8), wf[i]);
          fma_tokens_scaled<NR, TOK>(acc, wf, sc, xg + 2 * k8, CG * kGroupF4, cnt);
        }
      } else {
#pragma unroll
        for (int k8 = 0; k8 < 4; ++k8) {
          if (gg * 4 + k8 >= cols8) break;  // partial last group (lane-divergent only there)
          float wf[NR][8];
#pragma unroll
          for (int i = 0; i < NR; ++i) {
            const uint4 v = __ldg(wb[i / R] + roff[i % R] + gg * 4 + k8);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const float2 f = bf16x2_to_float2(word(v, j));
              wf[i][2 * j] = f.x;
              wf[i][2 * j + 1] = f.y;
            }
          }
          fma_tokens<NR, TOK>(acc, wf, xg + 2 * k8, CG * kGroupF4, cnt);
        }
      }
    }
  }

  // After warp_sum every lane holds every row's sum; lane r stores row r.
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
    if (t < cnt) {
      float v[NR];
#pragma unroll
      for (int i = 0; i < NR; ++i) v[i] = warp_sum(acc[i][t]);
      float* orow = a.out + static_cast<int64_t>(start + t) * rows;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = row_base + r;
        if (lane == r && row < rows) orow[row] = NMAT == 2 ? glu(v[r], v[NMAT == 2 ? R + r : r], a.act, a.beta, a.lbeta) : v[r];
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------- host
template <bool MX, int TOK>
cudaError_t launch_tiles(const ExpertBank& w, int n_tiles_bound, TileArgs a, float* y, cudaStream_t stream) {
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + kGateUpRowsPerBlock - 1) / kGateUpRowsPerBlock));
  (void)pdl::launch(expert_tile_kernel<MX, 2, kGateUpR, TOK, true>, g1, kTileThreads, tile_smem<TOK>(), stream, a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = round_hidden_mxfp8(a, stream);
  if (e != cudaSuccess) return e;
  to_down_args(a, w, a.out, y);
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + kDownRowsPerBlock - 1) / kDownRowsPerBlock));
  (void)pdl::launch(expert_tile_kernel<MX, 1, kDownR, TOK, false>, g2, kTileThreads, tile_smem<TOK>(), stream, a);
  return cudaGetLastError();
}

template <bool MX, bool SPLIT>
cudaError_t launch_tc(const ExpertBank& w, int n_tiles_bound, TileArgs a, float* y, cudaStream_t stream) {
  constexpr int gu_rows = kTcBRows / 2, down_rows = kTcBRows;
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + gu_rows - 1) / gu_rows));
  (void)pdl::launch(expert_tc_kernel<MX ? WeightFormat::MXFP4 : WeightFormat::BF16, 2, true, SPLIT>, g1, kTcThreads, 0, stream, a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  e = round_hidden_mxfp8(a, stream);
  if (e != cudaSuccess) return e;
  to_down_args(a, w, a.out, y);
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + down_rows - 1) / down_rows));
  (void)pdl::launch(expert_tc_kernel<MX ? WeightFormat::MXFP4 : WeightFormat::BF16, 1, false, SPLIT>, g2, kTcThreads, 0, stream, a);
  return cudaGetLastError();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

size_t align256(size_t b) { return (b + 255) & ~static_cast<size_t>(255); }

int64_t tile_bound(int64_t P, int E, int tok) { return (P + tok - 1) / tok + std::min<int64_t>(E, P); }

// K3_MOE_DECODE=simt: Auto takes the SIMT tiles below the tensor-core threshold (the pre-session-4 rule),
// for before/after comparisons in one binary.
bool simt_forced_by_env() {
  static const bool v = [] {
    const char* s = std::getenv("K3_MOE_DECODE");
    return s && std::strcmp(s, "simt") == 0;
  }();
  return v;
}

}  // namespace

MoePath moe_experts_auto_path(int n, int K, int E, WeightFormat format) {
  const int64_t P = static_cast<int64_t>(n) * K;
  if (simt_forced_by_env()) return P >= static_cast<int64_t>(kTcMinPairsPerExpert) * E ? MoePath::TensorCore : MoePath::Simt;
  if (P > 8 * static_cast<int64_t>(E)) return MoePath::TensorCore;
  // Session 13 (CudaMoe.Timing, Kimi-Linear bf16): the GEMV path at n = 1 / 2 / 4 49.6 / 76.8 / 136.8 us vs
  // 75.9 / 111.5 / 175.5 SIMT (60.3 / 94.1 / 152.7 decode), even at n = 8 (P = E / 4). Not for MXFP4: its lanes
  // read 128 bytes of activations per 16 bytes of weights from L1 (K3 n = 1: 649 vs 212 us SIMT).
  if ((format == WeightFormat::BF16 || moe_gemv_mode() == 2) && P * 8 <= static_cast<int64_t>(E) && moe_gemv_enabled())
    return MoePath::Gemv;
  // bf16 experts, session 8 (moe_skinny.cu; K3_MOE_SKINNY=0 restores the rule below): the decode path from a
  // quarter pair per expert (Kimi-Linear: batch 8 and up).
  if (format == WeightFormat::BF16 && moe_skinny_enabled())
    return P * 4 >= static_cast<int64_t>(E) ? MoePath::TcDecode : MoePath::Simt;
  // MXFP4: the decode kernel at every decode size since session 21's ring variant (CudaMoe.Timing, K3 QAT scales,
  // docs/perf/cuda/s21-2-moe-timing.log): n = 1 185.5 us vs SIMT 211.9, n = 2 305.4 vs 379.5 (session 4, the
  // register kernel on wide scales: n = 1 281 vs 211, hence the old P * 16 >= E threshold). bf16: Kimi-Linear
  // n = 64 (P = 2 E) SIMT 982 vs decode 1173, n = 256 (8 E) decode 1562 vs 1803 (64-pair tiles).
  if (format == WeightFormat::MXFP4 || P > 2 * static_cast<int64_t>(E)) return MoePath::TcDecode;
  return MoePath::Simt;
}

bool moe_experts_use_tc(int n, int K, int E, WeightFormat format) {
  return moe_experts_auto_path(n, K, E, format) == MoePath::TensorCore;
}

cudaError_t moe_route(int n, int E, int K, const float* logits, const float* bias, bool renormalize, float scale,
                      int32_t* topk_idx, float* topk_w, cudaStream_t stream, RouteForm form) {
  if (n < 0 || E <= 0 || E > kMaxE || K <= 0 || K > kMaxK || K > E) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (!logits || !topk_idx || !topk_w) return cudaErrorInvalidValue;  // bias may be null: no bias
  if (E > 32 * 32) form = RouteForm::Scan;
  // The rule: four warps a token wherever they fit. CudaMoe.RouteTiming, call s46-1 (H100, a graph of 200 launches,
  // n = 1 / 8 / 64): Kimi-Linear E 256 K 8 warp 4.92-5.03 us, block 2.96-3.14; K3 E 896 K 16 warp 14.85-15.35,
  // block 6.74-7.15; the scan kernel 8.3-8.5 / 19.0-19.8.
  // K3_ROUTE_FORM=warp|scan: the model's routing in that form instead (before / after in one binary).
  static const RouteForm env_form = [] {
    const char* v = std::getenv("K3_ROUTE_FORM");
    if (v && std::strcmp(v, "warp") == 0) return RouteForm::Warp;
    if (v && std::strcmp(v, "scan") == 0) return RouteForm::Scan;
    return RouteForm::Block;
  }();
  if (form == RouteForm::Auto) form = env_form;
  const unsigned warp_blocks = static_cast<unsigned>((n + 3) / 4), blocks = static_cast<unsigned>(n);
  if (form == RouteForm::Warp) {
    if (E <= 32 * 8) {
      (void)pdl::launch(route_warp_kernel<8>, warp_blocks, 128, 0, stream, n, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
    } else if (E <= 32 * 28) {  // K3's 896 experts: no padding slots to scan
      (void)pdl::launch(route_warp_kernel<28>, warp_blocks, 128, 0, stream, n, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
    } else {
      (void)pdl::launch(route_warp_kernel<32>, warp_blocks, 128, 0, stream, n, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
    }
  } else if (form == RouteForm::Block) {
    if (E <= 128 * 2) {
      (void)pdl::launch(route_block_kernel<2>, blocks, 128, 0, stream, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
    } else if (E <= 128 * 7) {  // K3's 896 experts: no padding slots
      (void)pdl::launch(route_block_kernel<7>, blocks, 128, 0, stream, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
    } else {
      (void)pdl::launch(route_block_kernel<8>, blocks, 128, 0, stream, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
    }
  } else {
    (void)pdl::launch(route_kernel, blocks, kRouteThreads, 0, stream, E, K, logits, bias, renormalize, scale, topk_idx, topk_w);
  }
  return cudaGetLastError();
}

MoeWorkspace::MoeWorkspace(int max_tokens, int K, int E, int I, int X)
    : max_tokens_(max_tokens), K_(K), E_(E), I_(I), X_(X) {
  if (max_tokens <= 0 || K <= 0 || K > kMaxK || E <= 0 || E > kMaxE || K > E || I <= 0 || X <= 0 || I % 8 != 0 ||
      X % 8 != 0)
    throw Error("MoeWorkspace: unsupported shape (max_tokens " + std::to_string(max_tokens) + ", K " +
                std::to_string(K) + ", E " + std::to_string(E) + ", I " + std::to_string(I) + ", X " +
                std::to_string(X) + "): need K <= 32, K <= E <= 4096, I and X multiples of 8 (of 32 for MXFP4 experts)");
  const int64_t P = static_cast<int64_t>(max_tokens) * K;
  if (P > (int64_t{1} << 30)) throw Error("MoeWorkspace: max_tokens * K too large");
  max_tiles_ = static_cast<int>(tile_bound(P, E, 2));  // the smallest tile size (GGUF grouped: 2) needs the most tiles
  const size_t b_nt = align256(sizeof(int32_t));
  const size_t b_sorted = align256(static_cast<size_t>(P) * sizeof(int32_t));
  const size_t b_slot = b_sorted;
  const size_t b_tiles = align256(static_cast<size_t>(max_tiles_) * sizeof(int4));
  const size_t b_off = align256(static_cast<size_t>(E + 1) * sizeof(int32_t));
  const size_t b_hidden = align256(static_cast<size_t>(P) * I * sizeof(float));
  const size_t b_y = align256(static_cast<size_t>(P) * X * sizeof(float));
  const size_t b_dec = align256(decode_scratch_bytes(max_tokens, K, E, I, X, dec_pairs_, dec_tokens_));
  bytes_ = b_nt + b_sorted + b_slot + b_tiles + b_off + b_hidden + b_y + b_dec;
  cudaError_t e = cudaMalloc(&base_, bytes_);
  if (e != cudaSuccess) {
    base_ = nullptr;
    throw Error("MoeWorkspace: cudaMalloc of " + std::to_string(bytes_) + " bytes failed: " + cudaGetErrorString(e));
  }
  auto* p = static_cast<char*>(base_);
  num_tiles_ = reinterpret_cast<int32_t*>(p);
  p += b_nt;
  sorted_ = reinterpret_cast<int32_t*>(p);
  p += b_sorted;
  slot_of_ = reinterpret_cast<int32_t*>(p);
  p += b_slot;
  tiles_ = reinterpret_cast<int32_t*>(p);
  p += b_tiles;
  expert_off_ = reinterpret_cast<int32_t*>(p);
  p += b_off;
  hidden_ = reinterpret_cast<float*>(p);
  p += b_hidden;
  y_ = reinterpret_cast<float*>(p);
  p += b_y;
  dec_xb_ = reinterpret_cast<uint16_t*>(p);
  p += align256(2 * static_cast<size_t>(dec_tokens_) * X * 2);
  dec_hb_ = reinterpret_cast<uint16_t*>(p);
  p += align256(2 * static_cast<size_t>(dec_pairs_) * I * 2);
  dec_part_ = reinterpret_cast<float*>(p);
  dec_part_floats_ = static_cast<int64_t>(dec_pairs_) * std::max(2 * I, X);
}

bool moe_shared_fusable(const ExpertBank& w, int64_t gate_rows, int64_t gate_cols, int64_t down_rows, int64_t down_cols,
                        int n, const MoeWorkspace& ws) {
  const int K = ws.K_;  // the layer's top-k
  static const bool enabled = [] {
    const char* v = std::getenv("K3_MOE_SHARED_FUSED");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled && w.format == WeightFormat::BF16 && !w.empty() && n >= 1 && n <= ws.max_tokens_ &&
         K > 0 && w.E == ws.E_ && w.I == ws.I_ && w.X == ws.X_ && gate_rows == w.I && gate_cols == w.X && down_rows == w.X &&
         down_cols == w.I && static_cast<int64_t>(n) * (K + 1) <= static_cast<int64_t>(ws.max_tokens_) * K &&
         moe_experts_auto_path(n, K, w.E, w.format) == MoePath::Gemv;
}

cudaError_t moe_experts_with_shared(const ExpertBank& w, const void* shared_gate, const void* shared_up,
                                    const void* shared_down, int n, int K, const float* x, const int32_t* topk_idx,
                                    const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                                    MoeWorkspace& ws, cudaStream_t stream) {
  if (K != ws.K_ || !moe_shared_fusable(w, w.I, w.X, w.X, w.I, n, ws)) return cudaErrorInvalidValue;
  if (!x || !topk_idx || !topk_w || !out || !aligned16(x) || !aligned16(out) || !aligned16(w.gate) || !aligned16(w.up) ||
      !aligned16(w.down) || !aligned16(shared_gate) || !aligned16(shared_up) || !aligned16(shared_down))
    return cudaErrorInvalidValue;
  if (act == GluAct::SiTU && (situ_beta == 0.f || situ_linear_beta == 0.f)) return cudaErrorInvalidValue;
  const SharedGluBf16 sh{static_cast<const uint16_t*>(shared_gate), static_cast<const uint16_t*>(shared_up),
                         static_cast<const uint16_t*>(shared_down)};
  return moe_gemv_experts_shared(w, sh, n, K, x, topk_idx, topk_w, act, situ_beta, situ_linear_beta, ws.hidden_, ws.y_, out,
                                 stream);
}

MoeWorkspace::~MoeWorkspace() {
  if (base_) cudaFree(base_);
}

cudaError_t moe_experts_body(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx,
                             const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                             MoeWorkspace& ws, cudaStream_t stream, MoePrecision precision, MoePath path, bool round_hidden);

// The paths MoePrecision::Mxfp8's tile form can take (its tiles run at Bf16 with the GLU outputs rounded to MXFP8).
static bool tile_form_path(MoePath p) {
  return p == MoePath::Auto || p == MoePath::TensorCore || p == MoePath::Wgmma || p == MoePath::WgmmaRing;
}

// MoePrecision::Mxfp8, two forms with the CPU backend's numerics (core/mxfp8.h: x and each GLU output row rounded to
// MXFP8). Decode (Auto where moe_w4a8_supported, the batch fits the decode scratch and the bf16 rule would decode,
// or TcDecode): the W4A8 kernels (moe_decode_w4a8.h), the plan in 8-pair tiles; their scratch is carved from buffers
// the other paths use (no extra device memory): x's codes in the expert-output rows y_, h's in the hidden rows, both
// partial sums in the decode path's partial buffer (the down partials overwrite the gate/up ones, which the GLU
// launch has read by then).
// Otherwise (prefill sizes, BF16 / GGUF experts, other devices; Auto, TensorCore or Wgmma) the tile form: x rounded to
// MXFP8 values into the decode partial buffer, the bf16 tensor-core tiles on them (an MXFP8 value is a bf16 value:
// products exact, sums in fp32) with the GLU outputs rounded between gate+up and down; tokens in chunks that fit
// that buffer (>= 8192 tokens a chunk: only a longer prefill re-reads the experts).
cudaError_t moe_experts_mxfp8(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx,
                              const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                              MoeWorkspace& ws, cudaStream_t stream, MoePath path) {
  const int P = n * K;
  const bool w4a8 = moe_w4a8_supported(w) && P <= ws.dec_pairs_ && n <= ws.dec_tokens_;
  // Auto: the W4A8 kernels where the bf16 rule would take its decode kernels (up to 8 pairs an expert).
  if (path == MoePath::TcDecode || (path == MoePath::Auto && w4a8 && !moe_experts_use_tc(n, K, w.E, w.format))) {
    if (!w4a8) return cudaErrorInvalidValue;  // (an MXFP4 bank's scales: checked by moe_experts_body)
    const int64_t bound = tile_bound(P, w.E, 8);
    if (bound > ws.max_tiles_) return cudaErrorInvalidValue;
    auto* tiles = reinterpret_cast<int4*>(ws.tiles_);
    (void)pdl::launch(plan_kernel, 1, kPlanThreads, 0, stream, topk_idx, P, w.E, 8, ws.sorted_, ws.slot_of_, tiles, ws.num_tiles_,
                      static_cast<int32_t*>(nullptr));
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    W4a8Scratch s;
    s.max_tokens = ws.dec_tokens_;
    s.max_pairs = ws.dec_pairs_;
    s.x8 = reinterpret_cast<uint8_t*>(ws.y_);                                     // n X bytes of 4 P X
    s.xs = s.x8 + align256(static_cast<size_t>(n) * w.X);                          // n X / 32
    s.h8 = reinterpret_cast<uint8_t*>(ws.hidden_);                                 // P I bytes of 4 P I
    s.hs = s.h8 + align256(static_cast<size_t>(P) * w.I);                          // P I / 32
    s.part = ws.dec_part_;
    s.part_floats = ws.dec_part_floats_;
    return moe_w4a8_experts(w, n, K, 8, x, ws.sorted_, ws.slot_of_, tiles, ws.num_tiles_, static_cast<int>(bound), topk_w,
                            act, situ_beta, situ_linear_beta, out, s, stream);
  }
  if (!tile_form_path(path)) return cudaErrorInvalidValue;
  const int chunk = static_cast<int>(std::min<int64_t>(n, ws.dec_part_floats_ / w.X));
  if (chunk < 1) return cudaErrorInvalidValue;
  float* xq = ws.dec_part_;
  for (int t0 = 0; t0 < n; t0 += chunk) {
    const int c = std::min(chunk, n - t0);
    cudaError_t e = fake_quant_mxfp8_rows(x + static_cast<int64_t>(t0) * w.X, xq, c, w.X, stream);
    if (e == cudaSuccess)
      e = moe_experts_body(w, c, K, xq, topk_idx + static_cast<int64_t>(t0) * K, topk_w + static_cast<int64_t>(t0) * K,
                           act, situ_beta, situ_linear_beta, out + static_cast<int64_t>(t0) * w.X, ws, stream,
                           MoePrecision::Bf16, path, true);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t moe_experts(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx,
                        const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                        MoeWorkspace& ws, cudaStream_t stream, MoePrecision precision, MoePath path) {
  return moe_experts_body(w, n, K, x, topk_idx, topk_w, act, situ_beta, situ_linear_beta, out, ws, stream, precision, path,
                          false);
}

// moe_experts; round_hidden (MoePrecision::Mxfp8's tile form, from moe_experts_mxfp8 with x already rounded): the
// tensor-core tiles at any n, the GLU outputs rounded to MXFP8 between gate+up and down (TileArgs::mxfp8_hidden_rows).
// GGUF block experts' path (quant_moe.h): per pair (MoePath::Gemv), grouped or mma (TcDecode), or the tensor-core tiles
// (TensorCore). Auto becomes quant_moe_choice's pick; a forced TcDecode is checked against what the bank and the decode
// scratch allow (fits: the n K pairs fit the workspace's decode scratch). gguf_mma: the decode tiles on the tensor cores
// (quant_moe_mma) rather than the fp32 grouped kernels.
static cudaError_t gguf_moe_path(const ExpertBank& w, int n, int K, bool fits, MoePath& path, bool& gguf_mma) {
  const WeightFormat df = expert_down_format(w);
  if (w.X % weight_layout(w.format).block_elems != 0 || w.I % weight_layout(df).block_elems != 0 || path == MoePath::Simt)
    return cudaErrorInvalidValue;
  if (path == MoePath::Auto) {  // quant_moe_choice's Grouped / Mma have checked quant_moe_{grouped,mma}_supported
    const QuantMoeKernels k = quant_moe_choice(w, n, K);
    gguf_mma = k == QuantMoeKernels::Mma && fits;
    path = k == QuantMoeKernels::PerPair                                ? MoePath::Gemv
           : k == QuantMoeKernels::Grouped || k == QuantMoeKernels::Mma ? (fits ? MoePath::TcDecode : MoePath::TensorCore)
                                                                        : MoePath::TensorCore;
  } else if (path == MoePath::TcDecode) {  // forced: the tensor-core decode tiles only when asked for (tests, A/B)
    gguf_mma = quant_moe_mma_mode() == 1 && quant_moe_mma_supported(w);
    if (!fits || (!gguf_mma && !quant_moe_grouped_supported(w))) return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

cudaError_t moe_experts_body(const ExpertBank& w, int n, int K, const float* x, const int32_t* topk_idx,
                             const float* topk_w, GluAct act, float situ_beta, float situ_linear_beta, float* out,
                             MoeWorkspace& ws, cudaStream_t stream, MoePrecision precision, MoePath path, bool round_hidden) {
  if (n < 0 || n > ws.max_tokens_) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (K != ws.K_ || w.E != ws.E_ || w.I != ws.I_ || w.X != ws.X_) return cudaErrorInvalidValue;
  if (!x || !topk_idx || !topk_w || !out || !w.gate || !w.up || !w.down) return cudaErrorInvalidValue;
  // The experts' one dispatch point on the weight format: mx selects the kernels' MXFP4 instantiations;
  // GGUF blocks: quant_moe.h's kernels (the tiles of quant_moe_tc.cu, grouped, or per pair), picked below.
  bool mx = false;
  const bool gguf = is_gguf_block(w.format);
  switch (w.format) {
    case WeightFormat::MXFP4: mx = true; break;
    case WeightFormat::BF16: mx = false; break;
    default:
      if (!gguf) return cudaErrorInvalidValue;
  }
  if (!aligned16(x) || !aligned16(out) || !aligned16(w.gate) || !aligned16(w.up) || !aligned16(w.down))
    return cudaErrorInvalidValue;
  if (act == GluAct::SiTU && (situ_beta == 0.f || situ_linear_beta == 0.f)) return cudaErrorInvalidValue;
  if (mx && (!w.gate_scales || !w.up_scales || !w.down_scales || w.I % 32 != 0 || w.X % 32 != 0))
    return cudaErrorInvalidValue;
  if (precision == MoePrecision::Mxfp8) {
    if (round_hidden) return cudaErrorInvalidValue;  // the tile form runs its tiles at Bf16
    return moe_experts_mxfp8(w, n, K, x, topk_idx, topk_w, act, situ_beta, situ_linear_beta, out, ws, stream, path);
  }
  // The tile form: the tensor-core tiles whatever n is (Auto keeps its wgmma / mma.sync choice).
  if (round_hidden && !tile_form_path(path)) return cudaErrorInvalidValue;
  if (round_hidden && gguf) path = MoePath::TensorCore;
  bool gguf_mma = false;  // GGUF decode tiles on the tensor cores (quant_moe_mma) rather than the fp32 grouped kernels
  if (gguf) {
    const cudaError_t e = gguf_moe_path(w, n, K, static_cast<int64_t>(n) * K <= ws.dec_pairs_, path, gguf_mma);
    if (e != cudaSuccess) return e;
    if (path == MoePath::Gemv)
      return quant_moe_experts(w, n, K, x, topk_idx, topk_w, act, situ_beta, situ_linear_beta, ws.hidden_, out, stream);
  }
  if (precision != MoePrecision::Bf16x2 && precision != MoePrecision::Bf16) return cudaErrorInvalidValue;
  if (path != MoePath::Auto && path != MoePath::Simt && path != MoePath::TensorCore && path != MoePath::TcDecode &&
      path != MoePath::Gemv && path != MoePath::Wgmma && path != MoePath::WgmmaRs && path != MoePath::Cutlass &&
      path != MoePath::WgmmaRing)
    return cudaErrorInvalidValue;
  // CUTLASS's grouped GEMMs (BF16 banks, sm_90a): forced, or Auto's tensor-core choice unless K3_MOE_CUTLASS=0.
  const bool want_cutlass = !round_hidden && (path == MoePath::Cutlass ||
                                               (path == MoePath::Auto && moe_cutlass::enabled_by_env() &&
                                                moe_experts_auto_path(n, K, w.E, w.format) == MoePath::TensorCore));
  const bool cutlass_path = want_cutlass && moe_cutlass::supports(w) && moe_cutlass::can_run_on(ws.cutlass_, stream);
  if (path == MoePath::Cutlass && !cutlass_path) return cudaErrorInvalidValue;
  if (cutlass_path) path = MoePath::TensorCore;  // the plan's 64-pair tiles (only its slots and offsets are read)
  // The warpgroup-MMA tiles: forced, or Auto's tensor-core choice unless K3_MOE_WGMMA=0 (not for GGUF blocks); their
  // register-A form forced, or Auto's with K3_MOE_WGMMA=rs (MXFP4 only).
  const bool forced_wg = path == MoePath::Wgmma || path == MoePath::WgmmaRs || path == MoePath::WgmmaRing;
  const bool wg = !gguf && moe_wg::supports(w) && (forced_wg || (path == MoePath::Auto && moe_wg::enabled_by_env()));
  const bool wg_rs = wg && mx && (path == MoePath::WgmmaRs || (path == MoePath::Auto && moe_wg::register_a_by_env()));
  const bool wg_ring = wg && mx && moe_wg::ring_supports(w) &&
                       (path == MoePath::WgmmaRing || (path == MoePath::Auto && moe_wg::ring_by_default()));
  if (forced_wg && !wg) return cudaErrorInvalidValue;
  if (path == MoePath::WgmmaRs && !wg_rs) return cudaErrorInvalidValue;
  if (path == MoePath::WgmmaRing && !wg_ring) return cudaErrorInvalidValue;
  if (forced_wg) path = MoePath::TensorCore;
  const int P = n * K;
  MoePath chosen = round_hidden ? MoePath::TensorCore : path == MoePath::Auto ? moe_experts_auto_path(n, K, w.E, w.format) : path;
  if (chosen == MoePath::Gemv)  // pairs in place: no plan, no tiles; h in the tiled path's hidden buffer
    return moe_gemv_experts(w, mx, n, K, x, topk_idx, topk_w, act, situ_beta, situ_linear_beta, ws.hidden_, ws.y_, out,
                            stream);
  // The session-8 bf16 rule assumes the skinny kernels; shapes they do not take (I or X not a multiple of
  // 32) keep the session-4 rule: SIMT up to 2 pairs per expert.
  if (path == MoePath::Auto && chosen == MoePath::TcDecode && !mx && !moe_skinny_supported(w, 8) &&
      P <= 2 * static_cast<int64_t>(w.E))
    chosen = MoePath::Simt;
  const bool tc = chosen == MoePath::TensorCore;
  bool dec = chosen == MoePath::TcDecode;
  if (dec && (P > ws.dec_pairs_ || n > ws.dec_tokens_)) {
    if (path == MoePath::TcDecode) return cudaErrorInvalidValue;
    dec = false;  // not reached: Auto decodes below 4 pairs per expert, within the capacity
  }
  // Decode tiles: 8 pairs (one n8 MMA column block) up to 2 pairs per expert on average, else 16.
  // (bf16 on the skinny decode kernels: 8 up to 4 pairs per expert; a 16-pair tile doubles the activation
  // reads and MMAs of every block, a second 8-pair tile re-reads one expert's weights.)
  const bool skinny = dec && !mx && moe_skinny_enabled();
  // GGUF decode: 8-pair tiles for the tensor-core kernels (quant_moe_mma), 2 for the fp32 grouped ones.
  gguf_mma = gguf_mma && dec;
  const int tok = tc && wg_ring     ? moe_wg::ring_tile_pairs()
                  : tc              ? kTcM
                  : gguf_mma        ? kQuantMoeMmaTilePairs
                  : dec && gguf     ? quant_moe_grouped_tile_pairs()
                  : dec             ? (P <= (skinny ? 4 : 2) * w.E ? 8 : 16)
                  : P <= w.E        ? 4
                                    : 8;
  const int64_t bound = tile_bound(P, w.E, tok);
  if (bound > ws.max_tiles_) return cudaErrorInvalidValue;  // cannot happen for n <= max_tokens
  auto* tiles = reinterpret_cast<int4*>(ws.tiles_);
  (void)pdl::launch(plan_kernel, 1, kPlanThreads, 0, stream, topk_idx, P, w.E, tok, ws.sorted_, ws.slot_of_, tiles, ws.num_tiles_,
                    cutlass_path ? ws.expert_off_ : nullptr);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int nb = static_cast<int>(bound);
  const bool split = precision == MoePrecision::Bf16x2;
  if (cutlass_path) {  // by slot into y, then the tiles' combine
    const moe_cutlass::Args ca{&w, n, K, x, ws.sorted_, ws.expert_off_, act, situ_beta, situ_linear_beta, split, ws.hidden_, ws.y_};
    moe_cutlass::Output co;
    if ((e = moe_cutlass::run(ca, ws.max_tokens_ * ws.K_, ws.cutlass_, stream, &co)) != cudaSuccess) return e;
    if (co.merged_off)
      return moe_combine_merged(n, w.X, K, w.E, co.part, co.merged_off, ws.slot_of_, topk_w, out, stream);
    if (co.bf16)
      return moe_combine_bf16(n, w.X, K, reinterpret_cast<const uint16_t*>(co.part), ws.slot_of_, topk_w, out, stream);
    return moe_combine(n, w.X, K, co.part, co.split_stride, co.splits, ws.slot_of_, topk_w, out, stream);
  }
  if (gguf_mma)  // the decode scratch: x's and hidden's bf16 halves, the 32-column sums in the partial-sum buffer
    return quant_moe_mma(w, n, K, x, ws.sorted_, ws.slot_of_, tiles, ws.num_tiles_, nb, topk_w, act, situ_beta, situ_linear_beta,
                         split, ws.dec_xb_, ws.dec_hb_, ws.dec_part_, ws.hidden_, ws.y_, out, stream);
  if (dec && gguf)  // activations gathered by slot into the decode path's partial-sum buffer (>= P * X floats)
    return quant_moe_grouped(w, n, K, x, ws.slot_of_, tiles, ws.num_tiles_, nb, topk_w, act, situ_beta, situ_linear_beta,
                             ws.dec_part_, ws.hidden_, ws.y_, out, stream);
  if (dec) {
    DecodeScratch ds;
    ds.max_pairs = ws.dec_pairs_;
    ds.max_tokens = ws.dec_tokens_;
    ds.xb = ws.dec_xb_;
    ds.hb = ws.dec_hb_;
    ds.part = ws.dec_part_;
    ds.part_floats = ws.dec_part_floats_;
    if (skinny && moe_skinny_supported(w, tok))
      return moe_skinny_experts(w, n, K, tok, x, ws.sorted_, ws.slot_of_, tiles, ws.num_tiles_, nb, topk_w, act,
                                situ_beta, situ_linear_beta, split, out, ds, stream);
    return moe_decode_experts(w, mx, n, K, tok, x, ws.sorted_, ws.slot_of_, tiles, ws.num_tiles_, nb, topk_w, act,
                              situ_beta, situ_linear_beta, split, out, ds, stream);
  }
  TileArgs gu = gate_up_args(w, K, x, act, situ_beta, situ_linear_beta, ws.sorted_, tiles, ws.num_tiles_, ws.hidden_);
  const int64_t P_cap = static_cast<int64_t>(ws.max_tokens_) * ws.K_;  // hidden_'s rows
  if (round_hidden) gu.mxfp8_hidden_rows = P;
  if (tc && gguf)
    e = launch_tc_gguf(w, nb, gu, ws.y_, stream);
  else if (tc && wg_ring)
    e = moe_wg::launch_ring(w, n, nb, gu, P_cap, split, ws.y_, stream);
  else if (tc && wg)
    e = moe_wg::launch(w, nb, gu, split, wg_rs, ws.y_, stream);
  else if (tc && mx)
    e = split ? launch_tc<true, true>(w, nb, gu, ws.y_, stream) : launch_tc<true, false>(w, nb, gu, ws.y_, stream);
  else if (tc)
    e = split ? launch_tc<false, true>(w, nb, gu, ws.y_, stream) : launch_tc<false, false>(w, nb, gu, ws.y_, stream);
  else if (mx)
    e = tok == 4 ? launch_tiles<true, 4>(w, nb, gu, ws.y_, stream) : launch_tiles<true, 8>(w, nb, gu, ws.y_, stream);
  else
    e = tok == 4 ? launch_tiles<false, 4>(w, nb, gu, ws.y_, stream) : launch_tiles<false, 8>(w, nb, gu, ws.y_, stream);
  if (e != cudaSuccess) return e;
  return moe_combine(n, w.X, K, ws.y_, 0, 1, ws.slot_of_, topk_w, out, stream);
}

}  // namespace k3::cuda
