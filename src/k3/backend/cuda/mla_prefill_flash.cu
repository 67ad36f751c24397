// MLA prefill attention, fused (see mla_prefill_flash.h for why and the operand layouts).
//
// Grid (query blocks of 64, heads), 128 threads: warp w owns query rows 16 w .. 16 w + 15 of the block. Per step of
// 64 keys the block stages the keys (nope from kv, rope from kr) and the values (transposed, so that a value
// fragment is one 32-bit shared load) as hi / lo bf16 halves in shared memory; each warp forms its 16 x 64 scores
// with mma.sync m16n8k16 (three products per k16 step: lo.hi, hi.lo, hi.hi), masks the causal upper triangle,
// runs the online softmax in fp32 (exp2 with the scale folded in), splits P into halves in registers (the C
// fragment of two adjacent n8 tiles is the A fragment of one k16 step) and accumulates P V the same way.
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): lane = 4 g + c; A: a0 (row g, cols 2c, 2c+1), a1 (row g+8),
// a2 (row g, cols 2c+8, 2c+9), a3 (row g+8, cols 2c+8..); B: b0 (rows 2c, 2c+1 of column g), b1 (rows 2c+8, 2c+9);
// C: c0 c1 (row g, cols 2c, 2c+1), c2 c3 (row g+8). The lower half of a 32-bit register holds the lower index.
#include "k3/backend/cuda/mla_prefill_flash.h"

#include <cuda_bf16.h>

#include <cmath>

#include "k3/backend/cuda/mma_bf16.cuh"

namespace k3::cuda {
namespace {

constexpr int kDn = 128, kDr = 64, kDv = 128, kQk = kDn + kDr;
constexpr int kBq = 64, kBk = 64, kThreads = 128;
constexpr int kQkPad = kQk + 8;   // bf16 row stride of the Q / K tiles: 100 words, fragment loads conflict-free
constexpr int kKeyPad = kBk + 8;  // bf16 row stride of the transposed value tile: 36 words

struct FlashSmem {
  uint16_t q[2][kBq][kQkPad];  // [hi, lo][query][dim]
  uint16_t k[2][kBk][kQkPad];  // [hi, lo][key][dim]
  uint16_t vt[2][kDv][kKeyPad];  // [hi, lo][value dim][key]
};

__device__ __forceinline__ void split_bf16(float x, uint16_t& hi, uint16_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(x - __bfloat162float(h)));
}
__device__ __forceinline__ uint32_t pack2(uint16_t lo_index, uint16_t hi_index) {
  return static_cast<uint32_t>(lo_index) | (static_cast<uint32_t>(hi_index) << 16);
}
__device__ __forceinline__ uint32_t word(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// Four consecutive floats into the hi / lo rows at column d.
__device__ __forceinline__ void store_split4(const float4 v, uint16_t* hi, uint16_t* lo) {
  uint16_t h[4], l[4];
  split_bf16(v.x, h[0], l[0]);
  split_bf16(v.y, h[1], l[1]);
  split_bf16(v.z, h[2], l[2]);
  split_bf16(v.w, h[3], l[3]);
  *reinterpret_cast<uint2*>(hi) = make_uint2(pack2(h[0], h[1]), pack2(h[2], h[3]));
  *reinterpret_cast<uint2*>(lo) = make_uint2(pack2(l[0], l[1]), pack2(l[2], l[3]));
}

// One m16n8k16 step on hi / lo halves: lo.hi + hi.lo + hi.hi (the small terms first).
__device__ __forceinline__ void mma3(float (&acc)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4], uint32_t bh0,
                                     uint32_t bh1, uint32_t bl0, uint32_t bl1) {
  mma_bf16::mma16816(acc, al[0], al[1], al[2], al[3], bh0, bh1);
  mma_bf16::mma16816(acc, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
  mma_bf16::mma16816(acc, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
}

__global__ void __launch_bounds__(kThreads)
    mla_prefill_flash_kernel(const float* __restrict__ q, const float* __restrict__ kv, const float* __restrict__ kr,
                             int64_t kr_stride, int nh, int64_t offset, int64_t n, int64_t past, float scale,
                             float* __restrict__ out) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  FlashSmem& sm = *reinterpret_cast<FlashSmem*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int h = blockIdx.y;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kBq;  // the longest blocks first
  const int64_t S = past + n, kvw = kDn + kDv;

  // The block's queries (rows past n are zeros: finite scores, never stored).
  for (int i = tid; i < kBq * kQk / 4; i += kThreads) {
    const int r = i / (kQk / 4), d = 4 * (i % (kQk / 4));
    const int64_t t = q0 + r;
    const float4 v = t < n ? *reinterpret_cast<const float4*>(q + ((offset + t) * nh + h) * kQk + d) : make_float4(0.f, 0.f, 0.f, 0.f);
    store_split4(v, &sm.q[0][r][d], &sm.q[1][r][d]);
  }

  const float sl2 = scale * 1.4426950408889634f;  // scores in log2 units: exp2f below
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  float o[kDv / 8][4] = {};
  const int rw = 16 * warp;  // the warp's first row in the block
  const int64_t qlast = (q0 + kBq < n ? q0 + kBq : n) - 1;
  const int64_t steps = (past + qlast) / kBk + 1;
  for (int64_t st = 0; st < steps; ++st) {
    const int64_t j0 = st * kBk;
    __syncthreads();  // the previous step's tiles are read (and, at st = 0, the queries are written)
    for (int i = tid; i < kBk * kQk / 4; i += kThreads) {
      const int r = i / (kQk / 4), d = 4 * (i % (kQk / 4));
      const int64_t s = j0 + r;
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (s < S)
        v = d < kDn ? *reinterpret_cast<const float4*>(kv + (s * nh + h) * kvw + d)
                    : *reinterpret_cast<const float4*>(kr + s * kr_stride + (d - kDn));
      store_split4(v, &sm.k[0][r][d], &sm.k[1][r][d]);
    }
    // values transposed; consecutive threads take consecutive keys (2-byte stores side by side in one row)
    for (int i = tid; i < kBk * kDv / 4; i += kThreads) {
      const int r = i % kBk, d = 4 * (i / kBk);
      const int64_t s = j0 + r;
      const float4 v = s < S ? *reinterpret_cast<const float4*>(kv + (s * nh + h) * kvw + kDn + d) : make_float4(0.f, 0.f, 0.f, 0.f);
      const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) split_bf16(e[k], sm.vt[0][d + k][r], sm.vt[1][d + k][r]);
    }
    __syncthreads();

    // scores of the warp's 16 rows x 64 keys
    float sc[kBk / 8][4] = {};
#pragma unroll
    for (int kk = 0; kk < kQk / 16; ++kk) {
      const int col = 16 * kk + 2 * c;
      uint32_t ah[4], al[4];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        uint32_t* a = x ? al : ah;
        a[0] = word(&sm.q[x][rw + g][col]);
        a[1] = word(&sm.q[x][rw + g + 8][col]);
        a[2] = word(&sm.q[x][rw + g][col + 8]);
        a[3] = word(&sm.q[x][rw + g + 8][col + 8]);
      }
#pragma unroll
      for (int j = 0; j < kBk / 8; ++j) {
        const int key = 8 * j + g;
        mma3(sc[j], ah, al, word(&sm.k[0][key][col]), word(&sm.k[0][key][col + 8]), word(&sm.k[1][key][col]),
             word(&sm.k[1][key][col + 8]));
      }
    }

    // causal mask, online softmax (rows g and g + 8 of the warp; a row's 64 scores lie in its lane quad)
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kBk / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = j0 + 8 * j + 2 * c + (e & 1), qpos = past + q0 + rw + g + (e >> 1) * 8;
        const float s = key > qpos ? -INFINITY : sc[j][e] * sl2;
        sc[j][e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
    float alpha[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 1));
      mx[x] = fmaxf(mx[x], __shfl_xor_sync(0xffffffffu, mx[x], 2));
      const float mn = fmaxf(m[x], mx[x]);  // finite: key 0 .. qpos of every row is in step 0
      alpha[x] = exp2f(m[x] - mn);          // m = -inf before the first step: 0
      m[x] = mn;
      l[x] *= alpha[x];
    }
#pragma unroll
    for (int j = 0; j < kBk / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        sc[j][e] = exp2f(sc[j][e] - m[e >> 1]);
        l[e >> 1] += sc[j][e];
      }
#pragma unroll
    for (int jd = 0; jd < kDv / 8; ++jd)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[jd][e] *= alpha[e >> 1];

    // O += P V over the step's 64 keys
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      uint32_t ph[4], pl[4];
#pragma unroll
      for (int f = 0; f < 4; ++f) {  // a0: tile 2kk rows g; a1: 2kk rows g+8; a2: 2kk+1 rows g; a3: 2kk+1 rows g+8
        const float* p = sc[2 * kk + (f >> 1)] + 2 * (f & 1);
        uint16_t h0, l0, h1, l1;
        split_bf16(p[0], h0, l0);
        split_bf16(p[1], h1, l1);
        ph[f] = pack2(h0, h1);
        pl[f] = pack2(l0, l1);
      }
      const int key = 16 * kk + 2 * c;
#pragma unroll
      for (int jd = 0; jd < kDv / 8; ++jd) {
        const int d = 8 * jd + g;
        mma3(o[jd], ph, pl, word(&sm.vt[0][d][key]), word(&sm.vt[0][d][key + 8]), word(&sm.vt[1][d][key]),
             word(&sm.vt[1][d][key + 8]));
      }
    }
  }

  // normalise and store the warp's rows
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 1);
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 2);
  }
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const int64_t t = q0 + rw + g + 8 * x;
    if (t >= n) continue;
    const float inv = 1.0f / l[x];
    float* row = out + ((offset + t) * nh + h) * kDv;
#pragma unroll
    for (int jd = 0; jd < kDv / 8; ++jd)
      *reinterpret_cast<float2*>(row + 8 * jd + 2 * c) = make_float2(o[jd][2 * x] * inv, o[jd][2 * x + 1] * inv);
  }
}

}  // namespace

bool mla_prefill_flash_supports(int dn, int dr, int dv) { return dn == kDn && dr == kDr && dv == kDv; }

cudaError_t mla_prefill_flash(const float* q, const float* kv, const float* kr, int64_t kr_stride, int nh, int dn, int dr,
                              int dv, int64_t offset, int64_t n, int64_t past, float scale, float* out, cudaStream_t stream) {
  if (!mla_prefill_flash_supports(dn, dr, dv) || nh <= 0 || nh > 65535 || n < 0 || past < 0 || offset < 0 ||
      kr_stride % 4 != 0)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kBq - 1) / kBq;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  const int bytes = static_cast<int>(sizeof(FlashSmem));
  const cudaError_t e = cudaFuncSetAttribute(mla_prefill_flash_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e != cudaSuccess) return e;
  mla_prefill_flash_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(nh)), kThreads, bytes, stream>>>(
      q, kv, kr, kr_stride, nh, offset, n, past, scale, out);
  return cudaGetLastError();
}

}  // namespace k3::cuda
