// The MXFP4 decode kernels' FP8 form (moe_decode_fp8.h): activation terms (prep_rows / prep_glu) and the grouped
// expert matrix on mma.sync m16n8k32 e4m3.
//
// Fragments: lane (g, tq) holds A rows g and g + 8 and k-slots {4tq..4tq+3} (a0 / a1) and {16+4tq..16+4tq+3} (a2 /
// a3) of each k32 step, and B (token g) at the same k-slots. One k32 step = one 32-column scale group; the lane's 8
// k-slots map to columns 8tq..8tq+7 of the group: its even columns to the first four, its odd ones to the last four,
// which is where one MXFP4 word of the stored layout (byte i = columns 2i, 2i+1, low nibble first) puts them after
//   even: ((w << 4) & 0x80808080) | ((w << 2) & 0x1C1C1C1C)   (low nibbles: sign to bit 7, e1 e0 m to bits 4..2)
//   odd:  (w & 0x80808080) | ((w >> 2) & 0x1C1C1C1C)          (high nibbles)
// -- each byte the E4M3 whose value is the E2M1 value times 2^-6 (E2M1 e = 0 lands on E4M3 subnormals, as it should).
// The weights reach the warp as in the ring kernel (a per-warp cp.async ring, 16 bytes a lane = one group of one
// row), but a k32 step needs word tq of ONE group from each of the 4 lanes of a row, so lanes read each other's
// copies (a __syncwarp after the wait, and before the stage is refilled); each lane's copy goes to a rotated slot
// (4g + (tq + g / 2) % 4) so that those 4-byte reads are free of bank conflicts.
#include "k3/backend/cuda/moe_decode_fp8.h"

#include <cuda_fp16.h>

#include <cmath>

#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/pdl.cuh"

namespace k3::cuda::f8dec {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMT = 2;                        // m16 tiles a warp (the ring kernel's)
constexpr int kStages = 2;                    // chunks of weights in flight a warp
constexpr int kSlots = kWarps * 2 * kMT * 32;  // uint4s a stage: [warp][tile i, half h][slot]
constexpr int kActBytes = 32768;              // staged activation terms a block
constexpr int kGuRows = kWarps * 8 * kMT;     // gate (= up) rows a gate/up block: a gate and an up tile a warp
constexpr int kDnRows = kWarps * 16 * kMT;

// ---- activation terms ----

// Four values -> four E4M3 bytes (a lowest), and the values those bytes hold.
__device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d, float (&back)[4]) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(b), "f"(a));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(d), "f"(c));
  uint32_t h0, h1;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h0) : "h"(lo));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h1) : "h"(hi));
  const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&h0));
  const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&h1));
  back[0] = f0.x;
  back[1] = f0.y;
  back[2] = f1.x;
  back[3] = f1.y;
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// 8 values of row `row` at column c (c % 8 == 0): x, or the GLU of the summed gate / up split partials.
template <bool GLU>
__device__ __forceinline__ void values8(const float* __restrict__ src, int64_t split_stride, int splits, int cols, int row,
                                        int c, GluAct act, float beta, float lbeta, float (&v)[8]) {
  if constexpr (!GLU) {
    const float4* p = reinterpret_cast<const float4*>(src + static_cast<int64_t>(row) * cols + c);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
    float gs[8] = {}, us[8] = {};
    for (int s = 0; s < splits; ++s) {  // split order, as the ring path's GLU
      const float* base = src + s * split_stride + static_cast<int64_t>(row) * 2 * cols + c;
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(base)), g1 = __ldg(reinterpret_cast<const float4*>(base) + 1);
      const float4 u0 = __ldg(reinterpret_cast<const float4*>(base + cols)), u1 = __ldg(reinterpret_cast<const float4*>(base + cols) + 1);
      gs[0] += g0.x, gs[1] += g0.y, gs[2] += g0.z, gs[3] += g0.w, gs[4] += g1.x, gs[5] += g1.y, gs[6] += g1.z, gs[7] += g1.w;
      us[0] += u0.x, us[1] += u0.y, us[2] += u0.z, us[3] += u0.w, us[4] += u1.x, us[5] += u1.y, us[6] += u1.z, us[7] += u1.w;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = moe_dev::glu(gs[k], us[k], act, beta, lbeta);
  }
}

// The row's power-of-two scale from max |v| (as bits): max / s in (224, 448] (s >= 2^-100); NaN if not finite.
__device__ __forceinline__ float row_scale(uint32_t amax_bits) {
  if (amax_bits >= 0x7F800000u) return __uint_as_float(0x7FC00000u);
  if (amax_bits == 0) return 1.f;
  const uint32_t r = __float_as_uint(__uint_as_float(amax_bits) * (1.f / 448.f));
  uint32_t ex = r >> 23;
  if ((r & 0x7FFFFFu) != 0) ++ex;
  return __uint_as_float(max(ex, 27u) << 23);
}

// A block per row: max |v|, the scale, then each (group, quarter)'s 8 values as kTerms E4M3 terms.
template <bool GLU>
__global__ void __launch_bounds__(256) prep_kernel(const float* __restrict__ src, int64_t split_stride, int splits, int cols,
                                                   GluAct act, float beta, float lbeta, uint2* __restrict__ terms,
                                                   float* __restrict__ scale) {
  pdl::begin();
  __shared__ uint32_t s_max[8];
  __shared__ float s_scale;
  const int row = blockIdx.x, items = cols / 8;
  uint32_t m = 0;
  for (int it = threadIdx.x; it < items; it += blockDim.x) {
    float v[8];
    values8<GLU>(src, split_stride, splits, cols, row, it * 8, act, beta, lbeta, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) m = max(m, __float_as_uint(v[k]) & 0x7FFFFFFFu);  // NaN bits above inf's
  }
  m = __reduce_max_sync(0xffffffffu, m);
  if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t a = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) a = max(a, s_max[w]);
    s_scale = row_scale(a);
    scale[row] = s_scale;
  }
  __syncthreads();
  const float inv = 1.f / s_scale;  // a power of two (or NaN): exact
  for (int it = threadIdx.x; it < items; it += blockDim.x) {
    float v[8];
    values8<GLU>(src, split_stride, splits, cols, row, it * 8, act, beta, lbeta, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] *= inv;
    uint2* out = terms + (static_cast<int64_t>(row) * items + it) * kTerms;  // item = (group, quarter): [group][tq]
#pragma unroll
    for (int t = 0; t < kTerms; ++t) {
      float be[4], bo[4];
      const uint32_t even = e4m3x4(v[0], v[2], v[4], v[6], be), odd = e4m3x4(v[1], v[3], v[5], v[7], bo);
      out[t] = make_uint2(even, odd);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        v[2 * k] -= be[k];
        v[2 * k + 1] -= bo[k];
      }
    }
  }
}

// ---- the matrix kernel ----

__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t e4m3_even(uint32_t w) { return ((w << 4) & 0x80808080u) | ((w << 2) & 0x1C1C1C1Cu); }
__device__ __forceinline__ uint32_t e4m3_odd(uint32_t w) { return (w & 0x80808080u) | ((w >> 2) & 0x1C1C1C1Cu); }
// Byte j of a word of 4 E8M0 scales as the float 2^(s - 127) (s = 0 gives 0 instead of 2^-127, s = 255 infinity
// instead of NaN).
template <int J>
__device__ __forceinline__ float e8m0_of(uint32_t w) {
  return __uint_as_float(J < 3 ? (w << (23 - 8 * J)) & 0x7F800000u : (w >> 1) & 0x7F800000u);
}

__device__ __forceinline__ void cp_async16(uint4* smem, const uint4* gmem) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The staged terms: [chunk][group][term][token][tq] uint2 (a warp's B reads: 256 contiguous bytes).
template <int TOK>
__device__ __forceinline__ int act_index(int lc, int j, int term, int tok, int tq) {
  return (((lc * 4 + j) * kTerms + term) * TOK + tok) * 4 + tq;
}

// One 128-column chunk: 4 groups, each a k32 step per m16 tile and token tile, kTerms MMAs into a fresh D, then D
// times the group's scale into the accumulators.
template <int NT>
__device__ __forceinline__ void chunk(float (&acc)[kMT][NT][4], const uint32_t (&wv)[kMT][2][4], const uint32_t (&sw)[kMT][2],
                                      const uint2* sact, int lc, int g, int tq) {
  constexpr int TOK = 8 * NT;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint2 b[NT][kTerms];
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int term = 0; term < kTerms; ++term) b[t][term] = sact[act_index<TOK>(lc, j, term, t * 8 + g, tq)];
#pragma unroll
    for (int i = 0; i < kMT; ++i) {
      const uint32_t a0 = e4m3_even(wv[i][0][j]), a1 = e4m3_even(wv[i][1][j]);
      const uint32_t a2 = e4m3_odd(wv[i][0][j]), a3 = e4m3_odd(wv[i][1][j]);
      float f0, f1;
      if (j == 0) f0 = e8m0_of<0>(sw[i][0]), f1 = e8m0_of<0>(sw[i][1]);
      if (j == 1) f0 = e8m0_of<1>(sw[i][0]), f1 = e8m0_of<1>(sw[i][1]);
      if (j == 2) f0 = e8m0_of<2>(sw[i][0]), f1 = e8m0_of<2>(sw[i][1]);
      if (j == 3) f0 = e8m0_of<3>(sw[i][0]), f1 = e8m0_of<3>(sw[i][1]);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int term = 0; term < kTerms; ++term) mma_e4m3(d, a0, a1, a2, a3, b[t][term].x, b[t][term].y);
        acc[i][t][0] = fmaf(d[0], f0, acc[i][t][0]);
        acc[i][t][1] = fmaf(d[1], f0, acc[i][t][1]);
        acc[i][t][2] = fmaf(d[2], f1, acc[i][t][2]);
        acc[i][t][3] = fmaf(d[3], f1, acc[i][t][3]);
      }
    }
  }
}

// Chunks [seg0, seg1) of the block's tokens' terms into sact (zeros for padded tokens).
template <int TOK>
__device__ __forceinline__ void stage(const Args& a, uint2* sact, const int* src_row, int seg0, int seg1) {
  const int per_tok = (seg1 - seg0) * 32;  // uint4s a token: (chunk, group, tq, term pair)
  const int groups = a.cols / 32;
  for (int j = 0; j < TOK; ++j) {
    const int sr = src_row[j];
    for (int it = threadIdx.x; it < per_tok; it += kThreads) {
      const int half = it & 1, tq = (it >> 1) & 3, gj = (it >> 3) & 3, lc = it >> 5;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (sr >= 0)
        v = __ldg(reinterpret_cast<const uint4*>(a.terms + ((static_cast<int64_t>(sr) * groups + (seg0 + lc) * 4 + gj) * 4 + tq) * kTerms) + half);
      sact[act_index<TOK>(lc, gj, 2 * half, j, tq)] = make_uint2(v.x, v.y);
      sact[act_index<TOK>(lc, gj, 2 * half + 1, j, tq)] = make_uint2(v.z, v.w);
    }
  }
}

template <int NT, bool GLU2>
__global__ void __launch_bounds__(kThreads, 3) matrix_kernel(const Args a) {
  pdl::begin();
  constexpr int TOK = 8 * NT, SEGC = kActBytes / (4 * kTerms * TOK * 4 * 8);
  static_assert(SEGC >= 1 && kTerms % 2 == 0, "segment");
  __shared__ uint2 sact[SEGC * 4 * kTerms * TOK * 4];
  __shared__ int src_row[TOK];
  __shared__ float s_scale[TOK];
  extern __shared__ uint4 ring[];  // [kStages][kSlots]
  const int tile = blockIdx.x;
  if (tile >= *a.num_tiles) return;
  const int4 td = a.tiles[tile];
  const int e = td.x, start = td.y, cnt = td.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int c_begin = blockIdx.z * a.cps, c_end = min(a.nch, c_begin + a.cps);
  if (threadIdx.x < TOK) {
    const int j = threadIdx.x;
    const int sr = j < cnt ? (GLU2 ? a.sorted[start + j] / a.K : start + j) : -1;
    src_row[j] = sr;
    s_scale[j] = sr >= 0 ? a.scale[sr] : 0.f;
  }
  int r0[kMT];
  uint32_t unit[kMT][2];  // the lane's 16-byte unit (row, group tq) of chunk 0; its scale word is (unit - tq) / 4
#pragma unroll
  for (int i = 0; i < kMT; ++i) {
    r0[i] = GLU2 ? blockIdx.y * kGuRows + warp * 16 : blockIdx.y * kDnRows + warp * 32 + i * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      unit[i][h] = static_cast<uint32_t>(e * a.rows + min(r0[i] + g + 8 * h, a.rows - 1)) * static_cast<uint32_t>(a.cols / 32) + tq;
  }
  const uint4* wq0 = reinterpret_cast<const uint4*>(a.w0);
  const uint4* wq1 = reinterpret_cast<const uint4*>(GLU2 ? a.w1 : a.w0);
  const uint32_t* sq0 = reinterpret_cast<const uint32_t*>(a.s0);
  const uint32_t* sq1 = reinterpret_cast<const uint32_t*>(GLU2 ? a.s1 : a.s0);
  uint4* const my_slot = ring + warp * (2 * kMT * 32) + 4 * g + ((tq + (g >> 1)) & 3);
  const uint32_t* const rd = reinterpret_cast<const uint32_t*>(ring + warp * (2 * kMT * 32) + 4 * g) + tq;
  auto fetch = [&](int c) {
    if (c < c_end) {
      uint4* st = my_slot + (c % kStages) * kSlots;
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) cp_async16(st + 32 * (2 * i + h), (GLU2 && i >= kMT / 2 ? wq1 : wq0) + (unit[i][h] + 4u * c));
    }
    cp_async_commit();
  };
  auto load_scales = [&](int c, uint32_t (&s)[kMT][2]) {
#pragma unroll
    for (int i = 0; i < kMT; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) s[i][h] = __ldg((GLU2 && i >= kMT / 2 ? sq1 : sq0) + ((unit[i][h] - tq) >> 2) + c);
  };

  float acc[kMT][NT][4];
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][t][k] = 0.f;
#pragma unroll
  for (int k = 0; k < kStages; ++k) fetch(c_begin + k);
  uint32_t sn[kMT][2] = {};
  if (c_begin < c_end) load_scales(c_begin, sn);
  for (int seg0 = c_begin; seg0 < c_end; seg0 += SEGC) {
    const int seg1 = min(c_end, seg0 + SEGC);
    __syncthreads();  // src_row ready; the previous segment's readers are done
    stage<TOK>(a, sact, src_row, seg0, seg1);
    __syncthreads();
    for (int c = seg0; c < seg1; ++c) {
      cp_async_wait<kStages - 1>();
      __syncwarp();  // every lane's copies of chunk c have landed
      uint32_t wv[kMT][2][4];
      const uint32_t* st = rd + (c % kStages) * kSlots * 4;
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 4; ++j) wv[i][h][j] = st[4 * (32 * (2 * i + h) + ((j + (g >> 1)) & 3))];
      __syncwarp();  // every lane has read the stage before any refills it
      fetch(c + kStages);
      uint32_t sw[kMT][2];
#pragma unroll
      for (int i = 0; i < kMT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) sw[i][h] = sn[i][h];
      if (c + 1 < c_end) load_scales(c + 1, sn);
      chunk<NT>(acc, wv, sw, sact, c - seg0, g, tq);
    }
  }
  float* part = a.part + static_cast<int64_t>(blockIdx.z) * a.split_stride;
#pragma unroll
  for (int i = 0; i < kMT; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = r0[i] + g + 8 * h;
      if (row >= a.rows) continue;
      const int orow = GLU2 && i >= kMT / 2 ? a.rows + row : row;
#pragma unroll
      for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int j = t * 8 + 2 * tq + c;  // the weights' 2^-6 and the token's scale
          if (j < cnt) part[static_cast<int64_t>(start + j) * a.ldo + orow] = acc[i][t][2 * h + c] * (64.f * s_scale[j]);
        }
    }
}

template <int NT, bool GLU2>
cudaError_t launch(const Args& a, int tiles_bound, int splits, cudaStream_t s) {
  constexpr int smem = 16 * kStages * kSlots;
  static const cudaError_t attr = [] {
    cudaError_t e = cudaFuncSetAttribute(matrix_kernel<NT, GLU2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(matrix_kernel<NT, GLU2>, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  const int rpb = GLU2 ? kGuRows : kDnRows;
  const dim3 grid(tiles_bound, (a.rows + rpb - 1) / rpb, splits);
  (void)pdl::launch(matrix_kernel<NT, GLU2>, grid, kThreads, smem, s, a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t prep_rows(const float* x, int rows, int cols, uint2* terms, float* scale, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (cols % 128 != 0) return cudaErrorInvalidValue;
  (void)pdl::launch(prep_kernel<false>, rows, 256, 0, s, x, int64_t{0}, 0, cols, GluAct::SiLU, 0.f, 0.f, terms, scale);
  return cudaGetLastError();
}

cudaError_t prep_glu(const float* part, int64_t split_stride, int splits, int rows, int I, GluAct act, float beta,
                     float lbeta, uint2* terms, float* scale, cudaStream_t s) {
  if (rows <= 0) return cudaSuccess;
  if (I % 128 != 0) return cudaErrorInvalidValue;
  (void)pdl::launch(prep_kernel<true>, rows, 256, 0, s, part, split_stride, splits, I, act, beta, lbeta, terms, scale);
  return cudaGetLastError();
}

cudaError_t matrix(const Args& a, bool glu2, int nt, int tiles_bound, int splits, cudaStream_t s) {
  if (a.cols % 128 != 0 || a.nch != a.cols / 128) return cudaErrorInvalidValue;
  if (nt == 1) return glu2 ? launch<1, true>(a, tiles_bound, splits, s) : launch<1, false>(a, tiles_bound, splits, s);
  return glu2 ? launch<2, true>(a, tiles_bound, splits, s) : launch<2, false>(a, tiles_bound, splits, s);
}

}  // namespace k3::cuda::f8dec
