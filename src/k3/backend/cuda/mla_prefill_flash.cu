// MLA prefill attention, fused (see mla_prefill_flash.h for why and the operand layouts).
//
// Two kernels. The split pass rewrites each expanded key / value row and each rope-key row in place as bf16 hi / lo
// halves (the same bytes: a float becomes two bf16), so that the attention kernel copies its tiles with cp.async
// straight into shared memory and loads fragments with ldmatrix. (Session 40's first form split every tile while
// staging it, with plain loads and no overlap: 1.5x slower than the SGEMM form, call s41-1.)
//
// Attention grid (query blocks of 64, heads), 256 threads, one block an SM (218 KB of shared memory): warps w and
// w + 4 own query rows 16 (w % 4) .. + 15 of the block, warp w the first 32 keys of each step, w + 4 the last 32
// (two warps a scheduler: one was latency-bound at 30% issue, call s41-2's ncu), each with its own online softmax,
// merged at the end. The block's queries are split once into shared memory; the key /
// value tiles of 64 keys are double-buffered: the copy of step s + 1 is in flight while step s computes. Per step
// each warp forms its 16 x 32 scores with mma.sync m16n8k16 (three products per k16 step: lo.hi, hi.lo, hi.hi),
// masks the causal triangle (diagonal steps only), runs the online softmax in fp32 (exp2 with the scale folded
// in), splits P into halves in registers (the C fragment of two adjacent n8 tiles is the A fragment of one k16
// step) and accumulates P V the same way, the value fragments through ldmatrix.trans.
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): lane = 4 g + c; A: a0 (row g, cols 2c, 2c+1), a1 (row g+8),
// a2 (row g, cols 2c+8, 2c+9), a3 (row g+8, cols 2c+8..); B: b0 (rows 2c, 2c+1 of column g), b1 (rows 2c+8, 2c+9);
// C: c0 c1 (row g, cols 2c, 2c+1), c2 c3 (row g+8). The lower half of a 32-bit register holds the lower index.
#include "k3/backend/cuda/mla_prefill_flash.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "k3/backend/cuda/mma_bf16.cuh"
#include "k3/backend/cuda/smem_ptx.cuh"

namespace k3::cuda {
namespace {

using bf16 = __nv_bfloat16;
using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::ldsm_x4;
using ptx::ldsm_x4_t;

constexpr int kDn = 128, kDr = 64, kDv = 128, kQk = kDn + kDr;
constexpr int kBq = 64, kBk = 64, kThreads = 256;
constexpr int kKw = kBk / 2;  // keys of a step per warp: warps w and w + 4 share rows, each takes half the keys
// Row strides in bf16: 400 and 272 bytes (100 and 68 words, both 4 mod 32): the 8 rows of an ldmatrix land on
// distinct banks, and rows stay 16-byte aligned for cp.async.
constexpr int kLdK = kQk + 8, kLdV = kDv + 8;
// The split rows in global memory (bf16 units): an expanded row (key s, head h) at (s nh + h) kRow holds nope hi,
// nope lo, value hi, value lo (128 each); a rope row holds hi, lo (64 each).
constexpr int kRow = 2 * (kDn + kDv);

// X: the halves the products run on -- 2 = hi and lo (~16 mantissa bits, the bf16x2 precision), 1 = hi only (plain
// bf16 operands, --gemm-precision bf16: one product instead of three, half the copies and shared memory).
template <int X>
struct Stage {
  bf16 k[X][kBk][kLdK];  // [hi, lo][key][nope dims, then rope dims]
  bf16 v[X][kBk][kLdV];  // [hi, lo][key][value dim]
};
template <int X>
struct FlashSmem {
  bf16 q[X][kBq][kLdK];  // [hi, lo][query][dim]
  Stage<X> st[2];
};
static_assert(sizeof(FlashSmem<2>) <= 227 * 1024, "one block an SM");
static_assert(2 * sizeof(FlashSmem<1>) <= 228 * 1024 - 2 * 1024, "two blocks an SM (1 KB reserved per block)");
// Blocks an SM the registers must allow: X = 1 fits two in shared memory.
template <int X>
constexpr int kMinBlocks = X == 1 ? 2 : 1;

// Two floats as bf16 hi / lo halves, packed (x in the lower half): hi = bf16(x), lo = bf16(x - hi), two per
// conversion instruction.
__device__ __forceinline__ void split_pair(float x, float y, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
  const float2 hf = __bfloat1622float2(h);
  const __nv_bfloat162 l = __floats2bfloat162_rn(x - hf.x, y - hf.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}
// Four consecutive floats as bf16 halves at hi[0..3] and lo[0..3].
__device__ __forceinline__ void store_split4(const float4 v, void* hi, void* lo) {
  uint32_t h[2], l[2];
  split_pair(v.x, v.y, h[0], l[0]);
  split_pair(v.z, v.w, h[1], l[1]);
  *reinterpret_cast<uint2*>(hi) = make_uint2(h[0], h[1]);
  *reinterpret_cast<uint2*>(lo) = make_uint2(l[0], l[1]);
}

// Four consecutive floats as bf16 (round to nearest even) at hi[0..3].
__device__ __forceinline__ void store_hi4(const float4 v, void* hi) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  *reinterpret_cast<uint2*>(hi) = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
}

// The split pass: one warp a row. Rows 0 .. S nh - 1 are the expanded rows (256 floats), then S rope rows (64
// floats). Every lane reads its floats before any lane writes (__syncwarp): the row is rewritten in place.
// hi_only (the bf16 form): the lo halves, which that form never reads, are not written.
__global__ void __launch_bounds__(256) split_rows_kernel(float* __restrict__ kv, float* __restrict__ kr, int64_t kr_stride,
                                                         int64_t kv_rows, int64_t rope_rows, bool hi_only) {
  auto store = [hi_only](const float4 x, bf16* hi, bf16* lo) {
    if (hi_only) store_hi4(x, hi);
    else store_split4(x, hi, lo);
  };
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < kv_rows + rope_rows; r += warps) {
    if (r < kv_rows) {
      float* row = kv + r * (kDn + kDv);
      const float4 a = reinterpret_cast<const float4*>(row)[lane], b = reinterpret_cast<const float4*>(row + kDn)[lane];
      __syncwarp();
      bf16* o = reinterpret_cast<bf16*>(row);
      store(a, o + 4 * lane, o + kDn + 4 * lane);
      store(b, o + 2 * kDn + 4 * lane, o + 2 * kDn + kDv + 4 * lane);
    } else {
      float* row = kr + (r - kv_rows) * kr_stride;
      const float4 a = lane < kDr / 4 ? reinterpret_cast<const float4*>(row)[lane] : make_float4(0.f, 0.f, 0.f, 0.f);
      __syncwarp();
      bf16* o = reinterpret_cast<bf16*>(row);
      if (lane < kDr / 4) store(a, o + 4 * lane, o + kDr + 4 * lane);
    }
  }
}

// One m16n8k16 step on hi / lo halves: lo.hi + hi.lo + hi.hi (the small terms first).
__device__ __forceinline__ void mma3(float (&acc)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], const uint32_t (&b)[4]) {
  mma_bf16::mma16816(acc, al[0], al[1], al[2], al[3], b[0], b[1]);
  mma_bf16::mma16816(acc, ah[0], ah[1], ah[2], ah[3], b[2], b[3]);
  mma_bf16::mma16816(acc, ah[0], ah[1], ah[2], ah[3], b[0], b[1]);
}

// Starts the copies of keys j0 .. j0 + 63 into a stage (rows at or past S zero-filled); X = 1 copies the hi halves only.
template <int X>
__device__ __forceinline__ void load_stage(Stage<X>& b, const bf16* __restrict__ kv, const bf16* __restrict__ kr,
                                           int64_t kr_ld, int nh, int h, int64_t j0, int64_t S, int tid) {
  constexpr int kKc = (kQk / 8) * X, kVc = (kDv / 8) * X;  // 16-byte chunks of a key row: 48 K, 32 V (X = 2)
  for (int i = tid; i < kBk * kKc; i += kThreads) {
    const int r = i / kKc, c = i % kKc, x = c / (kQk / 8), cc = c % (kQk / 8);
    const int64_t s = j0 + r;
    const bool ok = s < S;
    const bf16* src = !ok ? kv
                      : cc < kDn / 8 ? kv + (s * nh + h) * kRow + x * kDn + 8 * cc
                                     : kr + s * kr_ld + x * kDr + 8 * (cc - kDn / 8);
    cp_async16(&b.k[x][r][8 * cc], src, ok);
  }
  for (int i = tid; i < kBk * kVc; i += kThreads) {
    const int r = i / kVc, c = i % kVc, x = c / (kDv / 8), cc = c % (kDv / 8);
    const int64_t s = j0 + r;
    const bool ok = s < S;
    cp_async16(&b.v[x][r][8 * cc], ok ? kv + (s * nh + h) * kRow + 2 * kDn + x * kDv + 8 * cc : kv, ok);
  }
}

// The warp's 16 x 32 scores of one step: Q (rows rw ..) against the stage's keys kb .. kb + 31.
template <int X>
__device__ __forceinline__ void step_scores(const FlashSmem<X>& sm, const Stage<X>& b, int rw, int kb, int lane,
                                            float (&sc)[kKw / 8][4]) {
#pragma unroll
  for (int j = 0; j < kKw / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
  const int mi = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < kQk / 16; ++kk) {
    uint32_t ah[4];
    ldsm_x4(ah, &sm.q[0][rw + (lane & 15)][16 * kk + 8 * (lane >> 4)]);
    if constexpr (X == 2) {
      uint32_t al[4];
      ldsm_x4(al, &sm.q[1][rw + (lane & 15)][16 * kk + 8 * (lane >> 4)]);
#pragma unroll
      for (int j = 0; j < kKw / 8; ++j) {
        uint32_t bf[4];  // hi cols 16kk.., hi cols 16kk+8.., lo .., lo ..
        ldsm_x4(bf, &b.k[mi >> 1][kb + 8 * j + (lane & 7)][16 * kk + 8 * (mi & 1)]);
        mma3(sc[j], ah, al, bf);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kKw / 8; j += 2) {
        uint32_t bf[4];  // keys 8j.. cols 16kk.., keys 8j.. cols 16kk+8.., keys 8(j+1).. cols 16kk.., cols 16kk+8..
        ldsm_x4(bf, &b.k[0][kb + 8 * (j + (mi >> 1)) + (lane & 7)][16 * kk + 8 * (mi & 1)]);
        mma_bf16::mma16816(sc[j], ah[0], ah[1], ah[2], ah[3], bf[0], bf[1]);
        mma_bf16::mma16816(sc[j + 1], ah[0], ah[1], ah[2], ah[3], bf[2], bf[3]);
      }
    }
  }
}

// O += P V over the warp's 32 keys of a step: P's C fragments re-used as A fragments (two adjacent n8 tiles are one
// k16 step), as hi / lo halves (X = 2) or rounded to bf16 (X = 1); the value fragments through ldmatrix.trans.
template <int X>
__device__ __forceinline__ void step_pv(const Stage<X>& b, int kb, int lane, const float (&sc)[kKw / 8][4],
                                        float (&o)[kDv / 8][4]) {
  const int mi = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < kKw / 16; ++kk) {
    uint32_t ph[4], pl[4];
#pragma unroll
    for (int f = 0; f < 4; ++f) {  // a0: tile 2kk rows g; a1: 2kk rows g+8; a2: 2kk+1 rows g; a3: 2kk+1 rows g+8
      const float* p = sc[2 * kk + (f >> 1)] + 2 * (f & 1);
      if constexpr (X == 2) {
        split_pair(p[0], p[1], ph[f], pl[f]);
      } else {
        const __nv_bfloat162 hb = __floats2bfloat162_rn(p[0], p[1]);
        ph[f] = *reinterpret_cast<const uint32_t*>(&hb);
      }
    }
    if constexpr (X == 2) {
#pragma unroll
      for (int jd = 0; jd < kDv / 8; ++jd) {
        uint32_t bf[4];  // hi keys 16kk.., hi keys 16kk+8.., lo .., lo ..
        ldsm_x4_t(bf, &b.v[mi >> 1][kb + 16 * kk + 8 * (mi & 1) + (lane & 7)][8 * jd]);
        mma3(o[jd], ph, pl, bf);
      }
    } else {
#pragma unroll
      for (int jd = 0; jd < kDv / 8; jd += 2) {
        uint32_t bf[4];  // keys 16kk.. cols 8jd.., keys 16kk+8.. cols 8jd.., then the same for cols 8(jd+1)..
        ldsm_x4_t(bf, &b.v[0][kb + 16 * kk + 8 * (mi & 1) + (lane & 7)][8 * (jd + (mi >> 1))]);
        mma_bf16::mma16816(o[jd], ph[0], ph[1], ph[2], ph[3], bf[0], bf[1]);
        mma_bf16::mma16816(o[jd + 1], ph[0], ph[1], ph[2], ph[3], bf[2], bf[3]);
      }
    }
  }
}

// The causal offset of a warp's step: key - qpos = rel + (key in warp) - (row in warp); INT_MIN when no key of the
// step passes the warp's first row (nothing to mask).
__device__ __forceinline__ int diagonal_rel(int64_t qpos0, int64_t k0) {
  return k0 + kKw - 1 > qpos0 ? static_cast<int>(k0 - qpos0) : INT_MIN;
}

// One step of the online softmax over the warp's 16 x 32 scores (rows g and g + 8; a row's 32 scores lie in its lane
// quad): causal mask where rel says so, running max m and sum l updated, O rescaled, sc replaced by p.
__device__ __forceinline__ void online_softmax_step(float (&sc)[kKw / 8][4], float (&m)[2], float (&l)[2],
                                                    float (&o)[kDv / 8][4], int rel, float sl2, int g, int c) {
  const bool diagonal = rel != INT_MIN;
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < kKw / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool masked = diagonal && rel + 8 * j + 2 * c + (e & 1) > g + (e >> 1) * 8;
      const float s = masked ? -INFINITY : sc[j][e] * sl2;
      sc[j][e] = s;
      mx[e >> 1] = fmaxf(mx[e >> 1], s);
    }
  float alpha[2], mref[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
    mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
    const float mn = fmaxf(m[x], mx[x]);  // -inf while every key this warp has seen is masked (its second half)
    mref[x] = mn == -INFINITY ? 0.f : mn;  // then p = exp2(-inf) = 0 and alpha = 0 (o, l still 0), never NaN
    alpha[x] = exp2f(m[x] - mref[x]);
    m[x] = mn;
    l[x] *= alpha[x];
  }
#pragma unroll
  for (int j = 0; j < kKw / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sc[j][e] = exp2f(sc[j][e] - mref[e >> 1]);
      l[e >> 1] += sc[j][e];
    }
  // exp2f(0) is exactly 1: where no row of the warp found a larger score, O stays as it is (most steps past the
  // first few: the running max settles)
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int jd = 0; jd < kDv / 8; ++jd)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[jd][e] *= alpha[e >> 1];
  }
}

// The two key halves of each row merged: warps 4..7 leave (m, l, o) in `mrg` (the idle stage memory), warps 0..3
// combine, normalise and store rows q0 + rw + g (+ 8) below n.
__device__ __forceinline__ void merge_halves_and_store(float (&o)[kDv / 8][4], float (&m)[2], float (&l)[2], float* mrg,
                                                       int warp, int g, int c, int64_t q0, int rw, int64_t n,
                                                       float* __restrict__ out_rows, int64_t row_stride) {
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
  }
  if (warp >= 4) {
#pragma unroll
    for (int jd = 0; jd < kDv / 8; ++jd)
#pragma unroll
      for (int e = 0; e < 4; ++e) mrg[4 * jd + e] = o[jd][e];
    mrg[kDv / 2] = m[0], mrg[kDv / 2 + 1] = m[1], mrg[kDv / 2 + 2] = l[0], mrg[kDv / 2 + 3] = l[1];
  }
  __syncthreads();
  if (warp >= 4) return;
  float fa[2], fb[2], inv[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float mb = mrg[kDv / 2 + x], mm = fmaxf(m[x], mb);  // finite: half 0 always sees key 0
    fa[x] = exp2f(m[x] - mm);
    fb[x] = exp2f(mb - mm);
    inv[x] = 1.0f / (l[x] * fa[x] + mrg[kDv / 2 + 2 + x] * fb[x]);
  }
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int64_t t = q0 + rw + g + 8 * x;
    if (t >= n) continue;
    float* row = out_rows + t * row_stride;
#pragma unroll
    for (int jd = 0; jd < kDv / 8; ++jd) {
      const float v0 = (o[jd][2 * x] * fa[x] + mrg[4 * jd + 2 * x] * fb[x]) * inv[x];
      const float v1 = (o[jd][2 * x + 1] * fa[x] + mrg[4 * jd + 2 * x + 1] * fb[x]) * inv[x];
      *reinterpret_cast<float2*>(row + 8 * jd + 2 * c) = make_float2(v0, v1);
    }
  }
}

template <int X>
__global__ void __launch_bounds__(kThreads, kMinBlocks<X>)
    mla_prefill_flash_kernel(const float* __restrict__ q, const bf16* __restrict__ kv, const bf16* __restrict__ kr,
                             int64_t kr_ld, int nh, int64_t offset, int64_t n, int64_t past, float scale,
                             float* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  FlashSmem<X>& sm = *reinterpret_cast<FlashSmem<X>*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int h = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBq;  // the longest blocks first
  const int64_t S = past + n;
  const int64_t qlast = (q0 + kBq < n ? q0 + kBq : n) - 1;
  const int64_t steps = (past + qlast) / kBk + 1;

  load_stage(sm.st[0], kv, kr, kr_ld, nh, h, 0, S, tid);
  cp_async_commit();
  // The block's queries, split while the first tile is in flight (rows past n are zeros: finite scores, never stored).
  for (int i = tid; i < kBq * kQk / 4; i += kThreads) {
    const int r = i / (kQk / 4), d = 4 * (i % (kQk / 4));
    const int64_t t = q0 + r;
    const float4 v = t < n ? *reinterpret_cast<const float4*>(q + ((offset + t) * nh + h) * kQk + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (X == 2) store_split4(v, &sm.q[0][r][d], &sm.q[1][r][d]);
    else store_hi4(v, &sm.q[0][r][d]);
  }

  const float sl2 = scale * 1.4426950408889634f;  // scores in log2 units: exp2f below
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kDv / 8][4] = {};
  const int rw = 16 * (warp % 4), kb = kKw * (warp / 4);  // the warp's first row in the block, first key in a step
  for (int64_t st = 0; st < steps; ++st) {
    const int64_t j0 = st * kBk;
    if (st + 1 < steps) {
      load_stage(sm.st[(st + 1) & 1], kv, kr, kr_ld, nh, h, j0 + kBk, S, tid);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this step's tile (and, at step 0, the queries) visible to every warp
    const Stage<X>& b = sm.st[st & 1];

    float sc[kKw / 8][4];
    step_scores(sm, b, rw, kb, lane, sc);

    online_softmax_step(sc, m, l, o, diagonal_rel(past + q0 + rw, j0 + kb), sl2, g, c);

    step_pv(b, kb, lane, sc, o);
    __syncthreads();  // every warp is done with this stage before the next step's copy overwrites it
  }

  static_assert(sizeof(float) * 4 * 32 * (kDv / 2 + 4) <= sizeof(Stage<X>), "the merge fits the idle stage");
  float* mrg = reinterpret_cast<float*>(&sm.st[0]) + ((warp % 4) * 32 + lane) * (kDv / 2 + 4);
  merge_halves_and_store(o, m, l, mrg, warp, g, c, q0, rw, n, out + (offset * nh + h) * kDv, int64_t{nh} * kDv);
}

}  // namespace

bool mla_prefill_flash_supports(int dn, int dr, int dv) { return dn == kDn && dr == kDr && dv == kDv; }

cudaError_t mla_prefill_flash(const float* q, float* kv, float* kr, int64_t kr_stride, int nh, int dn, int dr, int dv,
                              int64_t offset, int64_t n, int64_t past, float scale, float* out, cudaStream_t stream,
                              bool bf16_products) {
  if (!mla_prefill_flash_supports(dn, dr, dv) || nh <= 0 || nh > 65535 || n < 0 || past < 0 || offset < 0 ||
      kr_stride % 4 != 0 || kr_stride < kDr)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kBq - 1) / kBq, S = past + n;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const int64_t rows = S * nh + S;
  const unsigned split_blocks = static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, 4096));
  split_rows_kernel<<<split_blocks, 256, 0, stream>>>(kv, kr, kr_stride, S * nh, S, bf16_products);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(nh));
  auto launch = [&](auto kernel, int bytes) {
    cudaError_t r = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (r != cudaSuccess) return r;
    kernel<<<grid, kThreads, bytes, stream>>>(q, reinterpret_cast<const bf16*>(kv), reinterpret_cast<const bf16*>(kr),
                                              2 * kr_stride, nh, offset, n, past, scale, out);
    return cudaGetLastError();
  };
  return bf16_products ? launch(mla_prefill_flash_kernel<1>, static_cast<int>(sizeof(FlashSmem<1>)))
                       : launch(mla_prefill_flash_kernel<2>, static_cast<int>(sizeof(FlashSmem<2>)));
}

}  // namespace k3::cuda
