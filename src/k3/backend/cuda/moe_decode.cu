// Tensor-core grouped expert GLU for decode-sized batches (moe_decode.h; CPU reference: moe_layer()).
//
// Why: at decode a (token, expert) pair has ~1-4 tokens per expert, so the layer is a grouped W4A16 GEMV
// over the experts the batch touches (K3: 17.5 MB of MXFP4 per expert). The SIMT tiles spent their issue
// slots on fp32 FMAs and activation re-reads (18-31% of HBM bandwidth); here the arithmetic goes to
// mma.sync m16n8k16 (weights as A: 16 output rows; the tile's tokens as B: 8 columns, padded) and every
// weight byte is loaded once, 16 bytes per lane, straight into A fragments.
//
// Fragment order without shuffles and without repacking the weights: the MMA sums over k, so any
// permutation of k applied to both A and B gives the same sum. Lane (g, tq) of a warp holds A rows g and
// g+8 and k-slots {2tq, 2tq+1, 2tq+8, 2tq+9} of each k16 step; we map those slots, for 8 consecutive steps
// (MXFP4) or 2 (bf16), onto the 32 (8) consecutive columns that the lane's one 16-byte load of each row
// holds in the stored row-major layout. One chunk = the 4 lanes of a row group side by side: 128 columns
// (MXFP4) or 32 (bf16), and for MXFP4 one lane's 32 columns are exactly one E8M0 scale group.
// MXFP4 word (8 nibbles = columns 0..7, low nibble = even column) -> 4 bf16 pairs (n0,n4) (n1,n5) (n2,n6)
// (n3,n7) by shifts and masks (sign to bit 15, e1 e0 m to bits 8..6: the E2M1 value times 2^-126, e = 0
// landing on bf16 subnormals as E2M1 subnormals should), times the group scale 2^(s-1) in bf16 (exact:
// 2 significant bits); scales past 2^127 take a second multiply. Step 2h of the word uses pairs (n_2h,
// n_2h+4) for slots (2tq, 2tq+1) and (n_2h+1, n_2h+5) for (2tq+8, 2tq+9), so the activations are stored
// with each 8 columns permuted to x0 x4 x1 x5 x2 x6 x3 x7 (act_prep_kernel; the GLU finish writes the down
// projection's input the same way); bf16 weights pair adjacent columns, activations in natural order.
//
// Activations: bf16 hi + lo (x = hi + lo, ~fp32, two MMAs into one fp32 accumulator; the same contract as
// the prefill tensor-core path) or hi only (MoePrecision::Bf16). They are staged in shared memory per block
// in segments of the block's K-range, laid out so that a warp's 16-byte B reads are 512 contiguous bytes.
//
// Grid: (tile, row block, K split). Block = 8 warps over distinct rows and the same K range (the staged
// activations serve all 8); a warp owns 4 m16 tiles: gate rows r..r+31 and the same up rows (gate/up), or
// 64 down rows. K is split across blocks when the batch touches few experts (n = 1: 16 experts would give
// 192 blocks), into partial sums summed in a fixed order by the next kernel: results do not depend on the
// schedule. Weights for chunk c+1 are loaded into registers while chunk c computes.
// Launches: act_prep, gate/up, glu_finish (sum splits, GLU, bf16 hi/lo), down, combine (sum splits, rank order);
// folded (moe_dec_fold_enabled, the default since session 49): gate/up (converting x while staging it), down (summing
// the splits and applying the GLU while staging h), combine -- two launches fewer a MoE layer.
#include "k3/backend/cuda/moe_decode.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/env_flag.h"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/moe_slots.cuh"
#include "k3/backend/cuda/mxfp4_decode.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMT = 4;                 // m16 tiles per warp
constexpr int kSmemBytes = 32768;      // staged activations per block
constexpr int64_t kFoldGluMax = 131072;  // the GLU folded into the down kernel's staging up to this many evaluations
constexpr int kGuRowsPerBlock = kWarps * 32;  // I rows (each of gate and up) per gate/up block
constexpr int kDnRowsPerBlock = kWarps * 64;  // X rows per down block

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word_of(const uint4& q, int k) {
  return k == 0 ? q.x : k == 1 ? q.y : k == 2 ? q.z : q.w;
}

// bf16 pair (nibble P, nibble P+4) of q: each E2M1 value times 2^-126.
template <int P>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t q) {
  const uint32_t t = q << (12 - 4 * P);
  return (t & 0x80008000u) | ((t >> 6) & 0x01C001C0u);
}

__device__ __forceinline__ uint32_t bmul2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r =
      __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}

// E8M0 scale s as a bf16x2 factor for values placed at 2^-126: 2^(s-1), both halves, one IMAD (s <= 128).
__device__ __forceinline__ uint32_t scale_x2(uint32_t s) { return s * 0x00800080u + 126u * 0x00800080u; }
// Scales above 2^127 (s > 128) take two factors: 2^126 then 2^(s-127) (NaN for s = 255, like the reference).
__device__ __forceinline__ uint32_t big_scale_x2_a(uint32_t s) { return s <= 128u ? scale_x2(s) : 0x7E807E80u; }
__device__ __forceinline__ uint32_t big_scale_x2_b(uint32_t s) {
  return s <= 128u ? 0x3F803F80u : s == 255u ? 0x7FC07FC0u : s * 0x00800080u;
}

using moe_dev::glu;  // cpu::silu_glu / cpu::situ_glu (moe_glu.cuh)

// Packs 8 floats as bf16 hi and lo (x - hi), in the stored column order (PERM: x0 x4 x1 x5 x2 x6 x3 x7).
template <bool PERM>
__device__ __forceinline__ void pack8(const float (&v)[8], uint4& hi, uint4& lo) {
  uint32_t h[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float a = PERM ? v[i] : v[2 * i], b = PERM ? v[i + 4] : v[2 * i + 1];
    const __nv_bfloat162 hh = __floats2bfloat162_rn(a, b);
    const __nv_bfloat162 ll = __floats2bfloat162_rn(a - __low2float(hh), b - __high2float(hh));
    h[i] = *reinterpret_cast<const uint32_t*>(&hh);
    l[i] = *reinterpret_cast<const uint32_t*>(&ll);
  }
  hi = make_uint4(h[0], h[1], h[2], h[3]);
  lo = make_uint4(l[0], l[1], l[2], l[3]);
}

// h[k] = glu(sum over splits of gate[c + k], the same of up[c + k]) for slot `slot`, k < 8: the splits' partials
// [split][slot][2 I] (gate | up) summed in split order. Unrolled: the splits' loads go out together (a 1-token layer has
// up to 18 splits, one dependent load round each when rolled: 5.5 us a launch under ncu, s46-2); the adds stay in
// split order. glu_finish_kernel and the down kernels' folded staging both run this (the same bits).
__device__ __forceinline__ void glu8_of_partials(const float* __restrict__ part, int64_t split_stride, int splits, int I,
                                                 int slot, int c, GluAct act, float beta, float lbeta, float (&h)[8]) {
  float gs[8] = {}, us[8] = {};
#pragma unroll 6
  for (int s = 0; s < splits; ++s) {  // fixed order
    const float4* p = reinterpret_cast<const float4*>(part + s * split_stride + static_cast<int64_t>(slot) * 2 * I + c);
    const float4* q = reinterpret_cast<const float4*>(part + s * split_stride + static_cast<int64_t>(slot) * 2 * I + I + c);
    const float4 g0 = p[0], g1 = p[1], u0 = q[0], u1 = q[1];
    gs[0] += g0.x; gs[1] += g0.y; gs[2] += g0.z; gs[3] += g0.w;
    gs[4] += g1.x; gs[5] += g1.y; gs[6] += g1.z; gs[7] += g1.w;
    us[0] += u0.x; us[1] += u0.y; us[2] += u0.z; us[3] += u0.w;
    us[4] += u1.x; us[5] += u1.y; us[6] += u1.z; us[7] += u1.w;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) h[k] = glu(gs[k], us[k], act, beta, lbeta);
}

// x [n][X] fp32 -> hi, lo [n][X] bf16 (8-column groups permuted for MXFP4 weights).
template <bool PERM>
__global__ void __launch_bounds__(256) act_prep_kernel(const float* __restrict__ x, int64_t groups,
                                                       uint16_t* __restrict__ hi, uint16_t* __restrict__ lo) {
  pdl::begin();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= groups) return;
  const float4 a = __ldg(reinterpret_cast<const float4*>(x) + 2 * i), b = __ldg(reinterpret_cast<const float4*>(x) + 2 * i + 1);
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint4 h, l;
  pack8<PERM>(v, h, l);
  reinterpret_cast<uint4*>(hi)[i] = h;
  reinterpret_cast<uint4*>(lo)[i] = l;
}

struct KArgs {
  const void* w0 = nullptr;      // gate (GLU2) or down: [E][rows][cols] bf16, or MXFP4 packed [E][rows][cols/2]
  const uint8_t* s0 = nullptr;   // MXFP4 scales [E][rows][cols/32]
  const void* w1 = nullptr;      // up (GLU2)
  const uint8_t* s1 = nullptr;
  int rows = 0, cols = 0;        // one matrix
  const uint16_t* act_hi = nullptr;  // [source rows][cols] bf16: x by token (GLU2) or hidden by slot
  const uint16_t* act_lo = nullptr;
  const int32_t* sorted = nullptr;
  int K = 1;
  const int4* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  float* part = nullptr;         // [split][slot][ldo]
  int64_t split_stride = 0;
  int ldo = 0;
  int nch = 0, cps = 0;          // chunks of the K range, chunks per split
  // The folded staging (moe_dec_fold_enabled): the activations are made while staging, from one of these, instead of
  // read from act_hi / act_lo -- act_prep_kernel's and glu_finish_kernel's steps in the same order (the same bits).
  const float* act_f32 = nullptr;  // gate/up: x [tokens][cols] fp32
  const float* gu_part = nullptr;  // down: the gate/up partials [gu_splits][slot][2 cols] (gate | up)
  int64_t gu_split_stride = 0;
  int gu_splits = 0;
  GluAct act = GluAct::SiLU;
  float beta = 0.f, lbeta = 0.f;
};

// One MXFP4 chunk of a warp: 4 words x MT m16 tiles (kMT in dec_kernel, kRingMT in dec_ring_kernel); sact
// holds the staged activations (see dec_kernel).
template <bool BIG, int NT, int NS, int SEG4, int MT>
__device__ __forceinline__ void mx_chunk(float (&acc)[MT][NT][4], const uint4 (&q)[MT][2], const uint32_t (&s)[MT][2],
                                         const uint4 (&sact)[NS][SEG4], int lc, int g, int tq) {
  constexpr int TOK = 8 * NT;
  uint32_t f1[MT][2], f2[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      f1[i][h] = BIG ? big_scale_x2_a(s[i][h]) : scale_x2(s[i][h]);
      f2[i][h] = BIG ? big_scale_x2_b(s[i][h]) : 0u;
    }
#pragma unroll
  for (int wd = 0; wd < 4; ++wd) {
    uint4 bh[NT], bl[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int si = ((lc * 4 + wd) * TOK + t * 8 + g) * 4 + tq;
      bh[t] = sact[0][si];
      if constexpr (NS == 2) bl[t] = sact[NS - 1][si];
    }
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      uint32_t r[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t w = word_of(q[i][h], wd);
        r[h][0] = bmul2(e2m1_pair<0>(w), f1[i][h]);
        r[h][1] = bmul2(e2m1_pair<1>(w), f1[i][h]);
        r[h][2] = bmul2(e2m1_pair<2>(w), f1[i][h]);
        r[h][3] = bmul2(e2m1_pair<3>(w), f1[i][h]);
        if constexpr (BIG) {
#pragma unroll
          for (int p = 0; p < 4; ++p) r[h][p] = bmul2(r[h][p], f2[i][h]);
        }
      }
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        mma16816(acc[i][t], r[0][0], r[1][0], r[0][1], r[1][1], bh[t].x, bh[t].y);
        mma16816(acc[i][t], r[0][2], r[1][2], r[0][3], r[1][3], bh[t].z, bh[t].w);
        if constexpr (NS == 2) {
          mma16816(acc[i][t], r[0][0], r[1][0], r[0][1], r[1][1], bl[t].x, bl[t].y);
          mma16816(acc[i][t], r[0][2], r[1][2], r[0][3], r[1][3], bl[t].z, bl[t].w);
        }
      }
    }
  }
}

// Stages chunks [seg0, seg1) of the block's activations (hi; lo when NS == 2) in sact, in the layout the chunk
// code reads: [chunk][unit word][token][tq] uint4s, zeros for padded tokens and columns. U: columns per lane unit
// (32 for MXFP4, 8 for bf16 weights). The items are handed out token-slowest, so that at a few tokens the block's
// first threads take the real ones side by side: in the layout's own order only one thread in 8 had real items, several
// in a row of them where the block's K range is long (K3's gate/up at one token: 4 rounds of x loads on 32 threads,
// now 1 on 128). Where the range is 2 chunks (the kl48 GGUF's down kernel, whose folded GLU stalls on its 9 splits'
// loads: 40% of its samples in call s49-4) both orders give one item a thread (call s49-5: 18.0 us either way).
template <int U, int NT, int NS, int SEG4>
__device__ __forceinline__ void stage_acts(const KArgs& a, uint4 (&sact)[NS][SEG4], const int* src_row, int seg0,
                                           int seg1) {
  constexpr int CH = 4 * U, WPU = U / 8, TOK = 8 * NT;
  static_assert(SEG4 <= 4096, "the float division below needs fewer than 2^12 items");
  const int per_tok = (seg1 - seg0) * WPU * 4;  // items of one token: (chunk, unit word, tq)
  const int n4 = per_tok * TOK;
  // it / per_tok in floats: exact, since (it + 1/2) / per_tok is at least 1 / (2 per_tok) >= 2^-13 from an integer and
  // the product's error is below 2^-19 (it < 2^12); an integer division took registers the ring kernels spilled.
  const float inv = 1.f / static_cast<float>(per_tok);
  for (int it = threadIdx.x; it < n4; it += kThreads) {
    const int j = static_cast<int>((static_cast<float>(it) + 0.5f) * inv), r = it - j * per_tok;
    const int tq_ = r & 3, wd = (r >> 2) % WPU, lc = (r >> 2) / WPU;
    const int idx = ((lc * WPU + wd) * TOK + j) * 4 + tq_;  // the layout's index
    const int col = (seg0 + lc) * CH + tq_ * U + wd * 8;
    const int sr = src_row[j];
    uint4 vh = make_uint4(0u, 0u, 0u, 0u), vl = vh;
    if (sr >= 0 && col < a.cols) {
      const int64_t off = static_cast<int64_t>(sr) * a.cols + col;
      if (a.act_f32) {  // act_prep_kernel's conversion of x, here (block-uniform branches)
        const float4* xp = reinterpret_cast<const float4*>(a.act_f32 + off);
        const float4 u = __ldg(xp), w = __ldg(xp + 1);
        const float v[8] = {u.x, u.y, u.z, u.w, w.x, w.y, w.z, w.w};
        pack8<U == 32>(v, vh, vl);
      } else if (a.gu_part) {  // glu_finish_kernel's sum, GLU and conversion, here
        float h[8];
        glu8_of_partials(a.gu_part, a.gu_split_stride, a.gu_splits, a.cols, sr, col, a.act, a.beta, a.lbeta, h);
        pack8<U == 32>(h, vh, vl);
      } else {
        vh = __ldg(reinterpret_cast<const uint4*>(a.act_hi + off));
        if constexpr (NS == 2) vl = __ldg(reinterpret_cast<const uint4*>(a.act_lo + off));
      }
    }
    sact[0][idx] = vh;
    if constexpr (NS == 2) sact[NS - 1][idx] = vl;
  }
}

// One chunk, in one of two straight-line versions (no per-tile branches): scales up to 2^127, or any.
template <int NT, int NS, int SEG4, int MT>
__device__ __forceinline__ void mx_chunk_any(float (&acc)[MT][NT][4], const uint4 (&q)[MT][2], const uint32_t (&s)[MT][2],
                                             const uint4 (&sact)[NS][SEG4], int lc, int g, int tq) {
  bool big = false;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) big |= s[i][h] > 128u;
  if (__any_sync(0xffffffffu, big))
    mx_chunk<true>(acc, q, s, sact, lc, g, tq);
  else
    mx_chunk<false>(acc, q, s, sact, lc, g, tq);
}

// acc[i][t][2h + c] = (row r0[i] + g + 8h, token t*8 + 2tq + c) -> this split's partials (GLU2: the up tiles,
// i >= MT / 2, after the gate rows). Rows past the matrix and padded tokens are not stored.
template <int MT, int NT, bool GLU2>
__device__ __forceinline__ void store_partials(const KArgs& a, const float (&acc)[MT][NT][4], const int (&r0)[MT],
                                               int start, int cnt, int g, int tq) {
  float* part = a.part + static_cast<int64_t>(blockIdx.z) * a.split_stride;
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0[i] + g + 8 * h;
      if (row >= a.rows) continue;
      const int orow = GLU2 && i >= MT / 2 ? a.rows + row : row;
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int j = t * 8 + 2 * tq + c;
          if (j < cnt) part[static_cast<int64_t>(start + j) * a.ldo + orow] = acc[i][t][2 * h + c];
        }
    }
}

// GLU2: gate and up rows (out = part of gate at [0, rows), of up at [rows, 2 rows)); else one matrix.
template <bool MX, int NT, int NS, bool GLU2>
__global__ void __launch_bounds__(kThreads, NT == 1 ? 2 : 1) dec_kernel(const KArgs a) {
  pdl::begin();
  constexpr int U = MX ? 32 : 8;   // columns per lane unit: one 16-byte weight load
  constexpr int CH = 4 * U;        // columns per chunk
  constexpr int WPU = U / 8;       // 16-byte activation words per unit
  constexpr int TOK = 8 * NT;
  constexpr int SEGC = kSmemBytes / (CH * TOK * 2 * NS);  // chunks per staged segment
  static_assert(SEGC >= 1, "segment");
  constexpr int SEG4 = SEGC * WPU * TOK * 4;                // uint4s per staged array
  __shared__ uint4 sact[NS][SEG4];
  __shared__ int src_row[TOK];
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;  // whole block: grid sized from an upper bound
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int rows = a.rows, cols = a.cols;
  const int c_begin = blockIdx.z * a.cps, c_end = min(a.nch, c_begin + a.cps);
  if (threadIdx.x < TOK)
    src_row[threadIdx.x] = static_cast<int>(threadIdx.x) < cnt
                               ? (GLU2 ? a.sorted[start + threadIdx.x] / a.K : start + static_cast<int>(threadIdx.x))
                               : -1;

  // Row offsets in 16-byte units (rows past the matrix re-read its last row; never stored), the lane's tq
  // folded in. For MXFP4 a 16-byte unit is one 32-column scale group, so the same offset indexes the scales.
  // 32-bit: E * rows * cols / 32 (MXFP4) or / 8 (bf16) fits (checked by the caller).
  int r0[kMT];
  int off[kMT][2];
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    r0[i] = GLU2 ? blockIdx.y * kGuRowsPerBlock + warp * 32 + (i % (kMT / 2)) * 16
                 : blockIdx.y * kDnRowsPerBlock + warp * 64 + i * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      off[i][h] = (e * rows + min(r0[i] + g + 8 * h, rows - 1)) * (cols / (MX ? 32 : 8)) + tq;
  }
  const uint4* w0 = static_cast<const uint4*>(a.w0);
  const uint4* w1 = static_cast<const uint4*>(GLU2 ? a.w1 : a.w0);

  auto load = [&](int c, uint4 (&q)[kMT][2], uint32_t (&s)[kMT][2]) {
    const bool ok = c * CH + tq * U < cols;
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool up = GLU2 && i >= kMT / 2;
        q[i][h] = ok ? __ldg((up ? w1 : w0) + off[i][h] + 4 * c) : make_uint4(0u, 0u, 0u, 0u);
        if constexpr (MX) s[i][h] = ok ? __ldg((up ? a.s1 : a.s0) + off[i][h] + 4 * c) : 127u;
      }
  };

  float acc[kMT][NT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][t][k] = 0.f;

  uint4 qn[kMT][2];
  uint32_t sn[kMT][2] = {};
  if (c_begin < c_end) load(c_begin, qn, sn);
  for (int seg0 = c_begin; seg0 < c_end; seg0 += SEGC) {
    const int seg1 = min(c_end, seg0 + SEGC);
    __syncthreads();  // src_row ready; the previous segment's readers are done
    stage_acts<U, NT, NS>(a, sact, src_row, seg0, seg1);
    __syncthreads();
    for (int c = seg0; c < seg1; ++c) {
      uint4 q[kMT][2];
      uint32_t s[kMT][2];
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          q[i][h] = qn[i][h];
          s[i][h] = sn[i][h];
        }
      if (c + 1 < c_end) load(c + 1, qn, sn);
      const int lc = c - seg0;
      if constexpr (MX) {
        mx_chunk_any(acc, q, s, sact, lc, g, tq);
      } else {
        uint4 bh[NT], bl[NT];
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          const int si = (lc * TOK + t * 8 + g) * 4 + tq;
          bh[t] = sact[0][si];
          if constexpr (NS == 2) bl[t] = sact[NS - 1][si];
        }
#pragma unroll
        for (int i = 0; i < kMT; ++i)
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            mma16816(acc[i][t], q[i][0].x, q[i][1].x, q[i][0].y, q[i][1].y, bh[t].x, bh[t].y);
            mma16816(acc[i][t], q[i][0].z, q[i][1].z, q[i][0].w, q[i][1].w, bh[t].z, bh[t].w);
            if constexpr (NS == 2) {
              mma16816(acc[i][t], q[i][0].x, q[i][1].x, q[i][0].y, q[i][1].y, bl[t].x, bl[t].y);
              mma16816(acc[i][t], q[i][0].z, q[i][1].z, q[i][0].w, q[i][1].w, bl[t].z, bl[t].w);
            }
          }
      }
    }
  }

  store_partials<kMT, NT, GLU2>(a, acc, r0, start, cnt, g, tq);
}

// ---- dec_ring_kernel: the MXFP4 kernel on fewer registers (DecVariant::Ring, moe_decode.h) ----
// Why: dec_kernel<true> double-buffers the next chunk's 8 weight uint4s and 8 scales in registers, which holds
// it at 128 registers at NT = 1 (with spills; ~200 at NT = 2): 2 blocks of 8 warps per SM, 4 warps per
// scheduler, the schedulers idle 42% of the time on the E2M1 decode chains (docs/perf/cuda.md, session 17).
// Here a warp owns kRingMT m16 tiles (half of dec_kernel's rows, half its accumulators and chunk registers),
// and the weights of its next S chunks wait in a per-warp shared-memory ring filled by cp.async, moved into
// registers when their chunk starts. Two configurations (DecVariant): Ring, S = 2 in 3 blocks per SM (80
// registers, 64 KB of shared memory per block), and Ring4, S = 1 (dec_kernel's one chunk ahead) in 4 (64
// registers, 48 KB; more spills at NT = 2). Slots are lane-contiguous 16-byte words (conflict-free copies and
// reads), and each lane reads only what it copied itself, so the ring needs no warp barrier. Scales (one byte
// each, under cp.async's 4-byte minimum) stay a one-chunk register double buffer.
// First H200 A/B (standalone harness, K3 dims, L2 flushed, bf16x2): Ring 0.68-0.72x dec_kernel's time at n = 1
// to 256 (n = 8: 953 vs 1332 us), Ring4 0.78-0.85x; bf16 activations 0.89-1.01x. The default since session 21.
// Bitwise equal to dec_kernel<true>: every accumulator takes the same chunks in the same order through the
// same mx_chunk, and the launch keeps dec_kernel's K split (cps) although it has twice the row blocks.
constexpr int kRingMT = 2;                                    // m16 tiles per warp
constexpr int kRingSlots = kWarps * 2 * kRingMT * 32;          // uint4s per stage: [warp][tile i, half h][lane]
template <int S>
constexpr int ring_smem_bytes() { return 16 * S * kRingSlots; }  // dynamic shared memory per block
constexpr int kRingGuRowsPerBlock = kWarps * 8 * kRingMT;      // 8 warps x (kRingMT / 2) gate tiles of 16 rows
constexpr int kRingDnRowsPerBlock = kWarps * 16 * kRingMT;
static_assert(kRingMT % 2 == 0, "gate/up: half the tiles each");

// 16 bytes global -> shared, asynchronously; ok false reads nothing and writes 16 zero bytes (dec_kernel's
// zeros past the columns). The memory clobber keeps the compiler from moving shared loads across it.
__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem, bool ok) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The per-warp weight ring of dec_ring_kernel: chunk c's 2 MT uint4s of this lane sit in stage c % S, one
// cp.async group per chunk (empty past c_end, so wait_group counts chunks).
// Addresses: the lane's unsigned 32-bit uint4 offsets plus 4 c, added to the kernel-parameter base (one
// IMAD.WIDE.U32 each). With signed offsets and a per-chunk column test the compiler rebuilt every 64-bit address
// with sign extension each chunk: ~130 instructions of a ~500-instruction chunk (ncu, session 23).
template <int MT, bool GLU2, int S>
struct WeightRing {
  uint4* slot;            // this lane's slot 0 of stage 0; slot j of stage st at slot[st * kRingSlots + 32 j]
  const uint4* w0;        // gate (GLU2) or down
  const uint4* w1;        // up (GLU2)
  const uint32_t (&off)[MT][2];
  int c_end, c_ok;        // c_ok: chunks below it hold this lane's columns (c * 128 + tq * 32 < cols)

  __device__ __forceinline__ void fetch(int c) const {
    if (c < c_end) {
      const bool ok = c < c_ok;
      const uint32_t dc = ok ? 4u * static_cast<uint32_t>(c) : 0u;
      uint4* st = slot + (c % S) * kRingSlots;
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) cp_async16(st + 32 * (2 * i + h), (GLU2 && i >= MT / 2 ? w1 : w0) + (off[i][h] + dc), ok);
    }
    cp_async_commit();
  }
  // Chunk c's words into q once its copies landed (the S - 1 newer groups may still fly); then the stage
  // takes chunk c + S: each lane overwrites only the slots it has just read.
  __device__ __forceinline__ void take(int c, uint4 (&q)[MT][2]) const {
    cp_async_wait<S - 1>();
    const uint4* st = slot + (c % S) * kRingSlots;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) q[i][h] = st[32 * (2 * i + h)];
    fetch(c + S);
  }
};

// Same grid roles and outputs as dec_kernel<true, NT, NS, GLU2>, on kRingGuRowsPerBlock / kRingDnRowsPerBlock
// rows per block; S ring stages (ring_smem_bytes<S>() of dynamic shared memory), MINB blocks per SM.
template <int NT, int NS, bool GLU2, int S, int MINB>
__global__ void __launch_bounds__(kThreads, MINB) dec_ring_kernel(const KArgs a) {
  pdl::begin();
  constexpr int MT = kRingMT, U = 32, CH = 4 * U, TOK = 8 * NT;
  constexpr int SEGC = kSmemBytes / (CH * TOK * 2 * NS);  // as dec_kernel (the segments do not change sums)
  static_assert(SEGC >= 1, "segment");
  constexpr int SEG4 = SEGC * (U / 8) * TOK * 4;
  __shared__ uint4 sact[NS][SEG4];
  __shared__ int src_row[TOK];
  extern __shared__ uint4 ring[];  // [S][kRingSlots]
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;  // whole block: grid sized from an upper bound
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int c_begin = blockIdx.z * a.cps, c_end = min(a.nch, c_begin + a.cps);
  if (threadIdx.x < TOK)
    src_row[threadIdx.x] = static_cast<int>(threadIdx.x) < cnt
                               ? (GLU2 ? a.sorted[start + threadIdx.x] / a.K : start + static_cast<int>(threadIdx.x))
                               : -1;

  // As dec_kernel: 16-byte-unit offsets of the lane's rows (clamped; never stored past the matrix), which
  // also index the scales.
  int r0[MT];
  uint32_t off[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i) {
    r0[i] = GLU2 ? blockIdx.y * kRingGuRowsPerBlock + warp * (8 * MT) + (i % (MT / 2)) * 16
                 : blockIdx.y * kRingDnRowsPerBlock + warp * (16 * MT) + i * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      off[i][h] = static_cast<uint32_t>(e * a.rows + min(r0[i] + g + 8 * h, a.rows - 1)) * static_cast<uint32_t>(a.cols / 32) + tq;
  }
  const int c_ok = max(0, (a.cols - tq * U + CH - 1) / CH);  // c < c_ok  <=>  c * CH + tq * U < cols
  const WeightRing<MT, GLU2, S> wr{ring + warp * (2 * MT * 32) + lane, static_cast<const uint4*>(a.w0),
                                static_cast<const uint4*>(GLU2 ? a.w1 : a.w0), off, c_end, c_ok};
  // The scales' offsets as opaque values: under the 80-register bound the allocator otherwise rebuilt them from
  // the row arithmetic (min, multiplies, 64-bit adds) every chunk, ~45 instructions of a ~500-instruction chunk.
  uint32_t so[MT][2];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      so[i][h] = off[i][h];
      asm("" : "+r"(so[i][h]));
    }
  auto load_scales = [&](int c, uint32_t (&s)[MT][2]) {
    const bool ok = c < c_ok;
    const uint32_t dc = 4u * static_cast<uint32_t>(c);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) s[i][h] = ok ? __ldg((GLU2 && i >= MT / 2 ? a.s1 : a.s0) + (so[i][h] + dc)) : 127u;
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][t][k] = 0.f;
  uint32_t sn[MT][2] = {};
#pragma unroll
  for (int k = 0; k < S; ++k) wr.fetch(c_begin + k);
  if (c_begin < c_end) load_scales(c_begin, sn);
  for (int seg0 = c_begin; seg0 < c_end; seg0 += SEGC) {
    const int seg1 = min(c_end, seg0 + SEGC);
    __syncthreads();  // src_row ready; the previous segment's readers are done
    stage_acts<32, NT, NS>(a, sact, src_row, seg0, seg1);
    __syncthreads();
    for (int c = seg0; c < seg1; ++c) {
      uint4 q[MT][2];
      uint32_t s[MT][2];
      wr.take(c, q);
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) s[i][h] = sn[i][h];
      if (c + 1 < c_end) load_scales(c + 1, sn);
      mx_chunk_any(acc, q, s, sact, c - seg0, g, tq);
    }
  }
  store_partials<MT, NT, GLU2>(a, acc, r0, start, cnt, g, tq);
}

// Per tile: hidden = glu(sum of gate splits, sum of up splits) -> bf16 hi/lo by slot (PERM for MXFP4 down).
template <bool PERM>
__global__ void __launch_bounds__(256)
    glu_finish_kernel(const float* __restrict__ part, int64_t split_stride, int splits, int I,
                      const int4* __restrict__ tiles, const int32_t* __restrict__ num_tiles, GluAct act, float beta,
                      float lbeta, uint16_t* __restrict__ hb_hi, uint16_t* __restrict__ hb_lo) {
  pdl::begin();
  const int tile = blockIdx.x;
  if (tile >= *num_tiles) return;
  const int4 td = tiles[tile];
  const int start = td.y, cnt = td.z, I8 = I >> 3;
  for (int idx = threadIdx.x; idx < cnt * I8; idx += blockDim.x) {
    const int slot = start + idx / I8, c8 = idx % I8;
    float h[8];
    glu8_of_partials(part, split_stride, splits, I, slot, c8 * 8, act, beta, lbeta, h);
    uint4 hi, lo;
    pack8<PERM>(h, hi, lo);
    const int64_t o = (static_cast<int64_t>(slot) * I) / 8 + c8;
    reinterpret_cast<uint4*>(hb_hi)[o] = hi;
    reinterpret_cast<uint4*>(hb_lo)[o] = lo;
  }
}

// out[t] = sum over k in rank order of w[t][k] * (sum over splits of y[split][slot]).
// A block takes kCombCols float4 columns of one token: its 8 warps sum the splits of the slots k = warp, warp + 8, ...
// (the loads of all K slots in flight at once, unrolled over splits), then warp 0 adds them in rank order. Session 13's
// form (a thread per column walking K x splits loads in turn) took 7.9 us a launch at one token (ncu, s46-2: 26 a
// Kimi-Linear step); the sums are the same expressions in the same order: the same bits.
constexpr int kCombCols = 32;
__global__ void __launch_bounds__(256)
    dec_combine_kernel(int X, int K, const float* __restrict__ part, int64_t split_stride, int splits,
                       const int32_t* __restrict__ slot_of, const float* __restrict__ topk_w, float* __restrict__ out) {
  pdl::begin();
  __shared__ int s_slot[32];
  __shared__ float s_w[32];
  __shared__ float4 s_v[32][kCombCols];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < K) {
    s_slot[threadIdx.x] = slot_of[static_cast<int64_t>(t) * K + threadIdx.x];
    s_w[threadIdx.x] = topk_w[static_cast<int64_t>(t) * K + threadIdx.x];
  }
  __syncthreads();
  const int X4 = X >> 2, c = blockIdx.y * kCombCols + lane;
  if (c < X4)
    for (int k = warp; k < K; k += 8) {
      const int s = s_slot[k];
      if (s < 0) continue;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
      for (int sp = 0; sp < splits; ++sp) {
        const float4 y = __ldg(reinterpret_cast<const float4*>(part + sp * split_stride + static_cast<int64_t>(s) * X) + c);
        v.x += y.x;
        v.y += y.y;
        v.z += y.z;
        v.w += y.w;
      }
      s_v[k][lane] = v;
    }
  __syncthreads();
  if (warp != 0 || c >= X4) return;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int k = 0; k < K; ++k) {
    if (s_slot[k] < 0) continue;
    const float4 v = s_v[k][lane];
    const float w = s_w[k];
    acc.x = fmaf(w, v.x, acc.x);
    acc.y = fmaf(w, v.y, acc.y);
    acc.z = fmaf(w, v.z, acc.z);
    acc.w = fmaf(w, v.w, acc.w);
  }
  reinterpret_cast<float4*>(out + static_cast<int64_t>(t) * X)[c] = acc;
}

// Token t's K slots and weights into shared memory (threads < K; the caller's barrier publishes them).
__device__ __forceinline__ void stage_slots(int t, int K, const int32_t* __restrict__ slot_of,
                                            const float* __restrict__ topk_w, int* s_slot, float* s_w) {
  if (threadIdx.x < K) {
    s_slot[threadIdx.x] = slot_of[static_cast<int64_t>(t) * K + threadIdx.x];
    s_w[threadIdx.x] = topk_w[static_cast<int64_t>(t) * K + threadIdx.x];
  }
}

// The same combine for prefill-sized batches (the tensor-core tiles' and CUTLASS's partials): a block per token walking
// its row four columns a thread at a time, the loads of 8 slots (all their splits) in flight before their sums. The
// decode form above (one 16-byte load a thread, 73 728 blocks of 8 warps at 4096 tokens x 2304 columns) moved 55% of
// the DRAM bandwidth there (ncu, call s59-2: 185 us a Kimi-Linear MoE layer at pp4096; 113 us and 88% with this
// kernel, s59-3). Each slot's value is 0 + its splits in order as there, added in rank order by the same fmaf: the
// same bits.
// off != nullptr (moe_combine_merged): two partials a slot at the merged rows s + off[e], s + off[e + 1] (s_row holds
// the first row, s_step the floats to the second; splits = 2 from the caller), split_stride unused.
constexpr int kCombRowThreads = 128;
__global__ void __launch_bounds__(kCombRowThreads)
    combine_rows_kernel(int X, int K, const float* __restrict__ y, int64_t split_stride, int splits,
                        const int32_t* __restrict__ slot_of, const float* __restrict__ topk_w, float* __restrict__ out,
                        const int32_t* __restrict__ off, int E) {
  pdl::begin();
  __shared__ int s_slot[32];
  __shared__ float s_w[32];
  __shared__ int64_t s_row[32], s_step[32];
  const int t = blockIdx.x;
  stage_slots(t, K, slot_of, topk_w, s_slot, s_w);
  if (threadIdx.x < K) {
    const int s = s_slot[threadIdx.x];
    int64_t row = s, step = split_stride;
    if (off && s >= 0) {
      const int e = moe_dev::expert_of_slot(off, E, s);
      row = s + off[e];
      step = static_cast<int64_t>(off[e + 1] - off[e]) * X;
    }
    s_row[threadIdx.x] = row;
    s_step[threadIdx.x] = step;
  }
  __syncthreads();
  const int X4 = X >> 2;
  for (int c = threadIdx.x; c < X4; c += kCombRowThreads) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k0 = 0; k0 < K; k0 += 8) {
      float4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int sp = 0; sp < splits; ++sp) {
        float4 yv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int s = k0 + j < K ? s_slot[k0 + j] : -1;
          yv[j] = s >= 0 ? __ldg(reinterpret_cast<const float4*>(y + s_row[k0 + j] * X + sp * s_step[k0 + j]) + c)
                         : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          v[j].x += yv[j].x;
          v[j].y += yv[j].y;
          v[j].z += yv[j].z;
          v[j].w += yv[j].w;
        }
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (k0 + j >= K || s_slot[k0 + j] < 0) continue;
        const float w = s_w[k0 + j];
        acc.x = fmaf(w, v[j].x, acc.x);
        acc.y = fmaf(w, v[j].y, acc.y);
        acc.z = fmaf(w, v[j].z, acc.z);
        acc.w = fmaf(w, v[j].w, acc.w);
      }
    }
    reinterpret_cast<float4*>(out + static_cast<int64_t>(t) * X)[c] = acc;
  }
}

// combine_rows_kernel for one split of bf16 partials (moe_combine_bf16): 8 columns a thread (16-byte loads; with 4, the
// first form moved 33% of DRAM bandwidth, 166 us a Kimi-Linear layer at pp4096, s59-8), each widened exactly, the same
// sums in the same order.
__global__ void __launch_bounds__(kCombRowThreads)
    combine_rows_bf16_kernel(int X, int K, const uint16_t* __restrict__ y, const int32_t* __restrict__ slot_of,
                             const float* __restrict__ topk_w, float* __restrict__ out) {
  pdl::begin();
  __shared__ int s_slot[32];
  __shared__ float s_w[32];
  const int t = blockIdx.x;
  stage_slots(t, K, slot_of, topk_w, s_slot, s_w);
  __syncthreads();
  const int X8 = X >> 3;
  for (int c = threadIdx.x; c < X8; c += kCombRowThreads) {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int k0 = 0; k0 < K; k0 += 8) {
      uint4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int s = k0 + j < K ? s_slot[k0 + j] : -1;
        v[j] = s >= 0 ? __ldg(reinterpret_cast<const uint4*>(y + static_cast<int64_t>(s) * X) + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (k0 + j >= K || s_slot[k0 + j] < 0) continue;
        const float w = s_w[k0 + j];
        const uint32_t u[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          acc[2 * q] = fmaf(w, 0.f + __uint_as_float(u[q] << 16), acc[2 * q]);
          acc[2 * q + 1] = fmaf(w, 0.f + __uint_as_float(u[q] & 0xffff0000u), acc[2 * q + 1]);
        }
      }
    }
    float4* o = reinterpret_cast<float4*>(out + static_cast<int64_t>(t) * X) + 2 * c;
    o[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    o[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

}  // namespace

cudaError_t moe_combine(int n, int X, int K, const float* part, int64_t split_stride, int splits, const int32_t* slot_of,
                        const float* topk_w, float* out, cudaStream_t stream) {
  if (K > 32 || X % 4 != 0) return cudaErrorInvalidValue;
  if (n >= kCombineRowsMinTokens) {
    (void)pdl::launch(combine_rows_kernel, n, kCombRowThreads, 0, stream, X, K, part, split_stride, splits, slot_of,
                      topk_w, out, static_cast<const int32_t*>(nullptr), 0);
    return cudaGetLastError();
  }
  const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((X / 4 + kCombCols - 1) / kCombCols));
  (void)pdl::launch(dec_combine_kernel, grid, 256, 0, stream, X, K, part, split_stride, splits, slot_of, topk_w, out);
  return cudaGetLastError();
}

cudaError_t moe_combine_merged(int n, int X, int K, int E, const float* part, const int32_t* off, const int32_t* slot_of,
                               const float* topk_w, float* out, cudaStream_t stream) {
  if (K > 32 || X % 4 != 0 || !off || E <= 0) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(combine_rows_kernel, n, kCombRowThreads, 0, stream, X, K, part, int64_t{0}, 2, slot_of, topk_w, out,
                    off, E);
  return cudaGetLastError();
}

cudaError_t moe_combine_bf16(int n, int X, int K, const uint16_t* part, const int32_t* slot_of, const float* topk_w,
                             float* out, cudaStream_t stream) {
  if (K > 32 || X % 8 != 0) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  (void)pdl::launch(combine_rows_bf16_kernel, n, kCombRowThreads, 0, stream, X, K, part, slot_of, topk_w, out);
  return cudaGetLastError();
}

namespace {

int num_sms() { return device_sm_count(); }

// Blocks per SM the K split aims for (K3_MOE_DEC_BLOCKS_PER_SM overrides: a tuning knob for the timing runs).
int target_blocks_per_sm() {
  static const int v = [] {
    const char* s = std::getenv("K3_MOE_DEC_BLOCKS_PER_SM");
    const int n = s ? std::atoi(s) : 0;
    return n > 0 && n <= 64 ? n : 2;  // 2: swept 2 / 4 / 8 / 16 (session 4): fewer, longer blocks win at n = 1
  }();
  return v;
}

// K splits for one launch: enough blocks to fill the GPU when the batch touches few experts, within the
// partial-sum buffer. Returns the split count; cps = chunks per split (every split non-empty).
int choose_splits(int est_tiles, int row_blocks, int nch, int64_t floats_per_split, int64_t cap, int& cps) {
  const int64_t blocks = static_cast<int64_t>(std::max(1, est_tiles)) * row_blocks;
  const int64_t want = (target_blocks_per_sm() * static_cast<int64_t>(num_sms()) + blocks - 1) / blocks;
  int64_t wk = std::min<int64_t>({want, nch, std::max<int64_t>(1, cap / std::max<int64_t>(1, floats_per_split))});
  wk = std::max<int64_t>(1, wk);
  cps = static_cast<int>((nch + wk - 1) / wk);
  return (nch + cps - 1) / cps;
}

// The ring kernel of one matrix (GLU2: gate/up) on its own row blocks, `splits` K splits as KArgs.cps says.
template <int NT, int NS, bool GLU2, int S, int MINB>
cudaError_t launch_ring(const KArgs& a, int tiles_bound, int splits, cudaStream_t stream) {
  constexpr int rpb = GLU2 ? kRingGuRowsPerBlock : kRingDnRowsPerBlock;
  constexpr int smem = ring_smem_bytes<S>();
  // Past 48 KB of shared memory (static + the ring) needs the opt-in; the carveout preference asks for the
  // shared memory of MINB blocks per SM (L1 serves only the scales and the activation staging). Once per
  // process, as the other kernels here (the current device's attribute).
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(dec_ring_kernel<NT, NS, GLU2, S, MINB>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(dec_ring_kernel<NT, NS, GLU2, S, MINB>, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  const dim3 grid(tiles_bound, (a.rows + rpb - 1) / rpb, splits);
  (void)pdl::launch(dec_ring_kernel<NT, NS, GLU2, S, MINB>, grid, kThreads, smem, stream, a);
  return cudaGetLastError();
}

// One matrix (GLU2: gate and up) of the decode path: dec_kernel, or for MXFP4 the ring kernel `v` names.
// splits / a.cps come from dec_kernel's geometry in every case, so all give the same bits.
template <bool MX, int NT, int NS, bool GLU2>
cudaError_t launch_matrix(const KArgs& a, int tiles_bound, int splits, DecVariant v, cudaStream_t stream) {
  if constexpr (MX) {
    if (v == DecVariant::Ring) return launch_ring<NT, NS, GLU2, 2, 3>(a, tiles_bound, splits, stream);
    if (v == DecVariant::Ring4) return launch_ring<NT, NS, GLU2, 1, 4>(a, tiles_bound, splits, stream);
  }
  constexpr int rpb = GLU2 ? kGuRowsPerBlock : kDnRowsPerBlock;
  (void)pdl::launch(dec_kernel<MX, NT, NS, GLU2>, dim3(tiles_bound, (a.rows + rpb - 1) / rpb, splits), kThreads, 0, stream, a);
  return cudaGetLastError();
}

template <bool MX, int NT, int NS>
cudaError_t launch_dec(const ExpertBank& w, int n, int K, const float* x, const int32_t* sorted, const int32_t* slot_of,
                       const int4* tiles, const int32_t* num_tiles, int tiles_bound, const float* topk_w, GluAct act,
                       float beta, float lbeta, float* out, DecVariant v, const DecodeScratch& s, cudaStream_t stream) {
  constexpr int CH = MX ? 128 : 32;
  const int P = n * K, I = w.I, X = w.X;
  const int est_tiles = std::min(P, w.E);
  uint16_t* xhi = s.xb;
  uint16_t* xlo = s.xb + static_cast<int64_t>(s.max_tokens) * X;
  uint16_t* hhi = s.hb;
  uint16_t* hlo = s.hb + static_cast<int64_t>(s.max_pairs) * I;
  const bool fold = moe_dec_fold_enabled();
  if (!fold) {
    const int64_t groups = static_cast<int64_t>(n) * X / 8;
    (void)pdl::launch(act_prep_kernel<MX>, static_cast<unsigned>((groups + 255) / 256), 256, 0, stream, x, groups, xhi, xlo);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  KArgs a;
  a.w0 = w.gate;
  a.s0 = w.gate_scales;
  a.w1 = w.up;
  a.s1 = w.up_scales;
  a.rows = I;
  a.cols = X;
  a.act_hi = xhi;
  a.act_lo = xlo;
  a.sorted = sorted;
  a.K = K;
  a.tiles = tiles;
  a.num_tiles = num_tiles;
  a.part = s.part;
  a.ldo = 2 * I;
  a.split_stride = static_cast<int64_t>(P) * a.ldo;
  a.nch = (X + CH - 1) / CH;
  a.act_f32 = fold ? x : nullptr;
  // K splits from dec_kernel's row blocks whichever kernel runs: the split decides the sums' order.
  const int rb_gu = (I + kGuRowsPerBlock - 1) / kGuRowsPerBlock;
  const int sp_gu = choose_splits(est_tiles, rb_gu, a.nch, a.split_stride, s.part_floats, a.cps);
  cudaError_t e = launch_matrix<MX, NT, NS, true>(a, tiles_bound, sp_gu, v, stream);
  if (e != cudaSuccess) return e;
  const int64_t gu_stride = a.split_stride, gu_floats = sp_gu * gu_stride;

  a.act_f32 = nullptr;
  a.w0 = w.down;
  a.s0 = w.down_scales;
  a.w1 = nullptr;
  a.s1 = nullptr;
  a.rows = X;
  a.cols = I;
  a.act_hi = hhi;
  a.act_lo = hlo;
  a.ldo = X;
  a.split_stride = static_cast<int64_t>(P) * X;
  a.nch = (I + CH - 1) / CH;
  const int rb_dn = (X + kDnRowsPerBlock - 1) / kDnRowsPerBlock;
  const int sp_dn = choose_splits(est_tiles, rb_dn, a.nch, a.split_stride, s.part_floats, a.cps);
  // Folded: the down kernel stages h from the gate/up partials, so its own partials go after them (when both fit; the
  // split above is the unfolded one's either way: the same sums). Only while the GLUs are few: every row block of the
  // down kernel redoes the GLU of its K range, reading every gate/up split, where the launch does each once. Call
  // s49-2 (H100, batch 1): Kimi-Linear's 8 pairs (8 x 1024 x 9 row blocks = 74k GLUs) +0.8% end to end on the kl48
  // GGUF; K3's 16 pairs (16 x 3072 x 14 = 688k SiTU GLUs) -0.6% on its 3-layer dummy.
  const bool fold_glu = moe_dec_folds_glu(P, I, X) && gu_floats + sp_dn * a.split_stride <= s.part_floats;
  if (fold_glu) {
    a.part = s.part + gu_floats;
    a.gu_part = s.part;
    a.gu_split_stride = gu_stride;
    a.gu_splits = sp_gu;
    a.act = act;
    a.beta = beta;
    a.lbeta = lbeta;
  } else {
    (void)pdl::launch(glu_finish_kernel<MX>, tiles_bound, 256, 0, stream, s.part, gu_stride, sp_gu, I, tiles, num_tiles, act,
                      beta, lbeta, hhi, hlo);
    e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  e = launch_matrix<MX, NT, NS, false>(a, tiles_bound, sp_dn, v, stream);
  if (e != cudaSuccess) return e;
  return moe_combine(n, X, K, a.part, a.split_stride, sp_dn, slot_of, topk_w, out, stream);
}

}  // namespace

namespace {

// The process's DecVariant: K3_MOE_DEC_VARIANT from the environment on first use, then moe_decode_set_variant.
std::atomic<int>& variant_slot() {
  static std::atomic<int> v{[] {
    const char* s = std::getenv("K3_MOE_DEC_VARIANT");
    const DecVariant v = !s                           ? DecVariant::Ring
                         : std::strcmp(s, "reg") == 0   ? DecVariant::Reg
                         : std::strcmp(s, "ring4") == 0 ? DecVariant::Ring4
                                                        : DecVariant::Ring;
    return static_cast<int>(v);
  }()};
  return v;
}

}  // namespace

namespace {
EnvFlag g_fold{"K3_MOE_DEC_FOLD"};
}  // namespace

bool moe_dec_fold_enabled() { return g_fold.on(); }

bool moe_dec_folds_glu(int pairs, int I, int X) {
  const int64_t glus = static_cast<int64_t>(pairs) * I * ((X + kRingDnRowsPerBlock - 1) / kRingDnRowsPerBlock);
  return moe_dec_fold_enabled() && glus <= kFoldGluMax;
}

void force_moe_dec_fold_for_testing(std::optional<bool> on) { g_fold.force(on); }

DecVariant moe_decode_variant() { return static_cast<DecVariant>(variant_slot().load(std::memory_order_relaxed)); }

void moe_decode_set_variant(DecVariant v) { variant_slot().store(static_cast<int>(v), std::memory_order_relaxed); }

size_t decode_scratch_bytes(int max_tokens, int K, int E, int I, int X, int& max_pairs, int& dec_tokens) {
  const int64_t P = static_cast<int64_t>(max_tokens) * K;
  max_pairs = static_cast<int>(std::min<int64_t>(P, std::max<int64_t>(8 * static_cast<int64_t>(E), 8192)));
  dec_tokens = std::min(max_tokens, max_pairs / K);
  const size_t xb = 2 * static_cast<size_t>(dec_tokens) * X * 2;
  const size_t hb = 2 * static_cast<size_t>(max_pairs) * I * 2;
  const size_t part = static_cast<size_t>(max_pairs) * std::max(2 * I, X) * 4;
  return xb + 256 + hb + 256 + part + 256;
}

cudaError_t moe_decode_experts(const ExpertBank& w, bool mx, int n, int K, int tok, const float* x, const int32_t* sorted,
                               const int32_t* slot_of, const int4* tiles, const int32_t* num_tiles, int tiles_bound,
                               const float* topk_w, GluAct act, float beta, float lbeta, bool split, float* out,
                               const DecodeScratch& s, cudaStream_t stream) {
  if (n > s.max_tokens || static_cast<int64_t>(n) * K > s.max_pairs) return cudaErrorInvalidValue;
  const DecVariant v = moe_decode_variant();
#define K3_DEC(MX, NT, NS)                                                                                           \
  launch_dec<MX, NT, NS>(w, n, K, x, sorted, slot_of, tiles, num_tiles, tiles_bound, topk_w, act, beta, lbeta, out, \
                         v, s, stream)
  if (mx) {
    if (tok <= 8) return split ? K3_DEC(true, 1, 2) : K3_DEC(true, 1, 1);
    return split ? K3_DEC(true, 2, 2) : K3_DEC(true, 2, 1);
  }
  if (tok <= 8) return split ? K3_DEC(false, 1, 2) : K3_DEC(false, 1, 1);
  return split ? K3_DEC(false, 2, 2) : K3_DEC(false, 2, 1);
#undef K3_DEC
}

}  // namespace k3::cuda
