// quant_gemv_mma (quant_mma.h): GGUF K-quant blocks on the tensor cores for decode batches.
//
// mma.sync m16n8k16 bf16 -> fp32, weights as A (16 output rows), the batch's tokens as B (8 per n8 tile, NT
// tiles). The MMA sums over k, so any permutation of k applied to A and B alike gives the same sum; we pick,
// per k16 step, the columns that lane (g, tq) can decode from the bytes it loaded, and load x at the same
// columns. Lane (g, tq) holds A rows g and g + 8 and k-slots {2tq, 2tq+1, 2tq+8, 2tq+9}; a step must lie in
// ONE sub-block of the format (one scale per row), because the sub-block's scale multiplies the step's sum:
//   Q4_K / Q5_K (sub-blocks of 32, scale + min): a unit is a 64-column chunk j of a super-block, whose qs bytes
//     32j .. 32j + 31 hold sub-block 2j in the low nibbles and 2j + 1 in the high ones. Lane tq loads bytes
//     8tq .. 8tq + 7 of each of its rows (8 bytes); step s of a sub-block takes stored columns 8tq + 4s + {0..3}
//     (the linear_skinny.cu mapping), so x's B fragment of both steps is one 16-byte load of 8 columns.
//   Q6_K (sub-blocks of 16, one int8 scale): a unit is half a super-block (128 columns); sub-block (a, h) =
//     columns 32a + 16h .. + 15 of the half, lane tq takes 4tq .. 4tq + 3 of it: ql bytes (a odd: 32 +) 16h + 4tq
//     (low nibbles for a < 2, high for a >= 2), qh bytes 16h + 4tq (bits 2a, 2a + 1). Blocks are 210 bytes, only
//     2-byte aligned: each 4-byte field is two aligned loads and a funnel shift.
// Quants become bf16 without a conversion instruction: byte q (< 128) under 0x43 is the bf16 128 + q (one PRMT
// per pair), and one HSUB2 of 128 (Q6_K: 160) leaves q (q - 32) exactly.
//
// Per sub-block and n8 tile: t = sum over the sub-block of q x (two or four MMAs, hi then lo, into a zeroed
// fragment), then acc = fma(-min, xsum, fma(scale, t, acc)) with the CPU's fp32 scale products d * sc and
// dmin * m. Error against the CPU's fp32 weights, in units of 2^-24 of sum(|d sc q| + |dmin m|) |x|: x' vs x
// 2^-17 relative (64 units), the MMA's fp32 sums of exact products (~8 per step), one rounding per sub-block and
// accumulation step (cols / 16), the 3-level block reduction, and the CPU's own rounding of each weight (1-2):
// ~80 + cols / 16 (tests: CudaQuantMma.*). Without lo, x is bf16-rounded (2^-9 relative: 32768 units).
//
// Block: 8 warps on the same 16 MT rows (MT m16 tiles per warp), warp w over units w, w + 8, ... (two units'
// weights loaded before either is used); the 8 warps' sums meet in shared memory in a fixed tree, so the
// result does not depend on timing. Rows past the end are read (clamped to the last row), never written.
// Tokens past n read token n - 1's activations; their columns of the MMA are discarded.
#include "k3/backend/cuda/quant_mma.h"

#include <cuda_bf16.h>

#include "k3/backend/cuda/mma_bf16.cuh"
#include "k3/backend/cuda/quant_part.cuh"
#include "k3/core/weight_format.h"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;
using mma_bf16::mma16816;
using qdev::f16_bits;

__device__ __forceinline__ uint32_t hsub2_bf16(uint32_t a, uint32_t b) {
  const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a), *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&r);
}
// bf16 pairs (byte 0, byte 1) and (byte 2, byte 3) of v as the values byte - off (bytes < 128; OFF = bf16 bits of
// 128 + off).
template <uint32_t OFF>
__device__ __forceinline__ void quant_pairs(uint32_t v, uint32_t& p01, uint32_t& p23) {
  p01 = hsub2_bf16(__byte_perm(v, 0x43434343u, 0x4140), OFF);
  p23 = hsub2_bf16(__byte_perm(v, 0x43434343u, 0x4342), OFF);
}
constexpr uint32_t kOff128 = 0x43004300u;  // bf16 128.0 twice
constexpr uint32_t kOff160 = 0x43204320u;  // bf16 160.0 twice

// 4 bytes at a 2-byte aligned p: the aligned word(s) around them and a funnel shift (reads nothing past p + 3
// when p is 4-byte aligned).
__device__ __forceinline__ uint32_t ld32_2a(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* q = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  const uint32_t lo = __ldg(q), hi = __ldg(q + ((a >> 1) & 1));
  return __funnelshift_r(lo, hi, static_cast<unsigned>(a & 2) * 8);
}

__device__ __forceinline__ uint2 ld_stream_u2(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}

// Where a lane's B fragments come from: token min(8 nt + g, n - 1) of hi / lo, and the sub-block sums.
template <int NT, bool SPLIT>
struct Xv {
  const uint16_t* hi[NT];
  const uint16_t* lo[NT];
  const float* xsum;  // + 2 tq: the lane's two tokens 2tq, 2tq + 1 of each n8 tile
  int ldx;
  __device__ void init(const QuantMmaActs& a, int g, int tq) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int tok = min(8 * nt + g, a.n - 1);
      hi[nt] = a.hi + tok * a.cols;
      lo[nt] = SPLIT ? a.lo + tok * a.cols : nullptr;
    }
    xsum = a.xsum + 2 * tq;
    ldx = (a.n + 7) & ~7;  // quant_mma_ldx
  }
};

// t (zeroed) = the k16 step's sum for one m16 tile and one n8 tile: A regs a[0..3], x's bf16 pair words b0, b1.
template <bool SPLIT>
__device__ __forceinline__ void step_mma(float (&t)[4], const uint32_t (&a)[4], uint32_t bh0, uint32_t bh1, uint32_t bl0,
                                         uint32_t bl1) {
  mma16816(t, a[0], a[1], a[2], a[3], bh0, bh1);
  if (SPLIT) mma16816(t, a[0], a[1], a[2], a[3], bl0, bl1);
}

// ---- Q4_K / Q5_K: unit u = chunk u % 4 of super-block u / 4 (64 columns: sub-blocks 2j low, 2j + 1 high).
template <bool kFifth>
struct MmaQ45 {
  static constexpr int kBlockBytes = kFifth ? 176 : 144, kQsOff = kFifth ? 48 : 16, kUnitCols = 64;
  struct Raw {
    uint4 h;   // d, dmin, the 12 scale bytes
    uint2 q;   // qs bytes 32j + 8tq .. + 7
    uint2 qh;  // Q5_K: qh bytes 8tq .. + 7 (bit 2j: sub-block 2j, 2j + 1: sub-block 2j + 1)
  };
  __device__ static Raw load(const uint8_t* row, int64_t u, int tq) {
    const uint8_t* b = row + (u >> 2) * kBlockBytes;
    Raw r;
    r.h = __ldg(reinterpret_cast<const uint4*>(b));
    r.q = ld_stream_u2(b + kQsOff + 32 * (u & 3) + 8 * tq);
    r.qh = kFifth ? __ldg(reinterpret_cast<const uint2*>(b + 16 + 8 * tq)) : make_uint2(0, 0);
    return r;
  }
  template <int NT, int MT, bool SPLIT>
  __device__ static void apply(const Raw (&r)[MT][2], int64_t u, const Xv<NT, SPLIT>& xv, int tq, float (&acc)[MT][NT][4]) {
    const int j = static_cast<int>(u & 3);
    float dl[MT][2][2], ml[MT][2][2];  // [mt][row g, g + 8][sub-block 2j, 2j + 1]: the CPU's d * sc, dmin * m
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float d = f16_bits(r[mt][h].h.x & 0xFFFF), dmin = f16_bits(r[mt][h].h.x >> 16);
        int sc[2], m[2];
        qpart::k4_pair(r[mt][h].h, j, sc, m);
#pragma unroll
        for (int s = 0; s < 2; ++s) dl[mt][h][s] = __fmul_rn(d, static_cast<float>(sc[s])), ml[mt][h][s] = __fmul_rn(dmin, static_cast<float>(m[s]));
      }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      uint32_t A[MT][2][4];  // [mt][step][reg]
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int st = 0; st < 2; ++st) {
          uint32_t p01[2], p23[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t w = st ? r[mt][h].q.y : r[mt][h].q.x;
            uint32_t v = (s ? w >> 4 : w) & 0x0F0F0F0Fu;
            if (kFifth) v |= (((st ? r[mt][h].qh.y : r[mt][h].qh.x) >> (2 * j + s)) & 0x01010101u) << 4;
            quant_pairs<kOff128>(v, p01[h], p23[h]);
          }
          A[mt][st][0] = p01[0], A[mt][st][1] = p01[1], A[mt][st][2] = p23[0], A[mt][st][3] = p23[1];
        }
      const int64_t col = 64 * u + 32 * s + 8 * tq;
      const float* xs = xv.xsum + (2 * u + s) * xv.ldx;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 bh = __ldg(reinterpret_cast<const uint4*>(xv.hi[nt] + col));
        const uint4 bl = SPLIT ? __ldg(reinterpret_cast<const uint4*>(xv.lo[nt] + col)) : make_uint4(0, 0, 0, 0);
        const float2 X = *reinterpret_cast<const float2*>(xs + 8 * nt);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          float t[4] = {0.f, 0.f, 0.f, 0.f};
          step_mma<SPLIT>(t, A[mt][0], bh.x, bh.y, bl.x, bl.y);
          step_mma<SPLIT>(t, A[mt][1], bh.z, bh.w, bl.z, bl.w);
          float(&c)[4] = acc[mt][nt];
          c[0] = fmaf(-ml[mt][0][s], X.x, fmaf(dl[mt][0][s], t[0], c[0]));
          c[1] = fmaf(-ml[mt][0][s], X.y, fmaf(dl[mt][0][s], t[1], c[1]));
          c[2] = fmaf(-ml[mt][1][s], X.x, fmaf(dl[mt][1][s], t[2], c[2]));
          c[3] = fmaf(-ml[mt][1][s], X.y, fmaf(dl[mt][1][s], t[3], c[3]));
        }
      }
    }
  }
};

// ---- Q6_K: unit u = half u % 2 of super-block u / 2 (128 columns, 8 sub-blocks of 16).
struct MmaQ6K {
  static constexpr int kBlockBytes = 210, kUnitCols = 128;
  struct Raw {
    uint32_t ql[4];  // k = 2 (a & 1) + h: ql bytes 64 hf + 16 k + 4tq .. + 3
    uint32_t qh[2];  // h: qh bytes 32 hf + 16 h + 4tq .. + 3
    uint32_t sc[2];  // the half's 8 int8 scales (sub-block (a, h): byte 2a + h)
    float d;
  };
  __device__ static Raw load(const uint8_t* row, int64_t u, int tq) {
    const uint8_t* b = row + (u >> 1) * kBlockBytes;
    const int hf = static_cast<int>(u & 1);
    Raw r;
#pragma unroll
    for (int k = 0; k < 4; ++k) r.ql[k] = ld32_2a(b + 64 * hf + 16 * k + 4 * tq);
#pragma unroll
    for (int h = 0; h < 2; ++h) r.qh[h] = ld32_2a(b + 128 + 32 * hf + 16 * h + 4 * tq);
    r.sc[0] = ld32_2a(b + 192 + 8 * hf);
    r.sc[1] = ld32_2a(b + 196 + 8 * hf);
    r.d = f16_bits(__ldg(reinterpret_cast<const unsigned short*>(b + 208)));
    return r;
  }
  template <int NT, int MT, bool SPLIT>
  __device__ static void apply(const Raw (&r)[MT][2], int64_t u, const Xv<NT, SPLIT>& xv, int tq, float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int si = 2 * a + h;
        uint32_t A[MT][4];
        float dsc[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t p01[2], p23[2];
#pragma unroll
          for (int rh = 0; rh < 2; ++rh) {
            const Raw& q = r[mt][rh];
            const uint32_t l = q.ql[2 * (a & 1) + h];
            const uint32_t v = ((a >= 2 ? l >> 4 : l) & 0x0F0F0F0Fu) | (((q.qh[h] >> (2 * a)) & 0x03030303u) << 4);
            quant_pairs<kOff160>(v, p01[rh], p23[rh]);
            const int sc = static_cast<int8_t>(static_cast<uint8_t>(q.sc[si >> 2] >> (8 * (si & 3))));
            dsc[mt][rh] = __fmul_rn(q.d, static_cast<float>(sc));
          }
          A[mt][0] = p01[0], A[mt][1] = p01[1], A[mt][2] = p23[0], A[mt][3] = p23[1];
        }
        const int64_t col = 128 * u + 32 * a + 16 * h + 4 * tq;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 bh = __ldg(reinterpret_cast<const uint2*>(xv.hi[nt] + col));
          const uint2 bl = SPLIT ? __ldg(reinterpret_cast<const uint2*>(xv.lo[nt] + col)) : make_uint2(0, 0);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            float t[4] = {0.f, 0.f, 0.f, 0.f};
            step_mma<SPLIT>(t, A[mt], bh.x, bh.y, bl.x, bl.y);
            float(&c)[4] = acc[mt][nt];
            c[0] = fmaf(dsc[mt][0], t[0], c[0]);
            c[1] = fmaf(dsc[mt][0], t[1], c[1]);
            c[2] = fmaf(dsc[mt][1], t[2], c[2]);
            c[3] = fmaf(dsc[mt][1], t[3], c[3]);
          }
        }
      }
  }
};

template <class P, int NT, int MT, bool SPLIT>
__global__ void __launch_bounds__(kWarps * 32)
    quant_mma_kernel(const uint8_t* __restrict__ W, int64_t rows, int64_t row_bytes, QuantMmaActs a, float* __restrict__ y) {
  constexpr int R = MT * NT * 4;
  __shared__ float red[kWarps / 2][R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16 * MT;
  const uint8_t* rp[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) rp[mt][h] = W + min(r0 + 16 * mt + 8 * h + g, rows - 1) * row_bytes;
  Xv<NT, SPLIT> xv;
  xv.init(a, g, tq);
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  const int64_t units = a.cols / P::kUnitCols;
  for (int64_t u = warp; u < units; u += 2 * kWarps) {
    const int64_t u1 = u + kWarps;  // the second unit's loads go out before the first is decoded
    typename P::Raw ra[MT][2], rb[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ra[mt][h] = P::load(rp[mt][h], u, tq);
        rb[mt][h] = P::load(rp[mt][h], u1 < units ? u1 : u, tq);
      }
    P::template apply<NT, MT, SPLIT>(ra, u, xv, tq, acc);
    if (u1 < units) P::template apply<NT, MT, SPLIT>(rb, u1, xv, tq, acc);
  }
  // Fixed tree over the 8 warps: w += w + 4, then w += w + 2, then w += w + 1.
  float* flat = &acc[0][0][0];
#pragma unroll
  for (int half = kWarps / 2; half >= 1; half >>= 1) {
    if (warp >= half && warp < 2 * half)
#pragma unroll
      for (int i = 0; i < R; ++i) red[warp - half][i][lane] = flat[i];
    __syncthreads();
    if (warp < half)
#pragma unroll
      for (int i = 0; i < R; ++i) flat[i] += red[warp][i][lane];
    __syncthreads();
  }
  if (warp != 0) return;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = r0 + 16 * mt + g + 8 * (i >> 1);
        const int tok = 8 * nt + 2 * tq + (i & 1);
        if (row < rows && tok < a.n) y[tok * rows + row] = acc[mt][nt][i];
      }
}

// x -> bf16 hi (+ lo) and the sums of hi + lo over each 32 columns; one thread per 8 columns of one token (a warp
// = 256 columns of one token: cols % 256 == 0), the 32-column sums over 4 lanes by two shuffles.
__global__ void __launch_bounds__(256) quant_mma_prep_kernel(const float* __restrict__ x, int n, int ldx, int64_t cols,
                                                             uint16_t* __restrict__ hi, uint16_t* __restrict__ lo,
                                                             float* __restrict__ xsum) {
  const int64_t groups = cols / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= ldx * groups) return;
  const int tok = static_cast<int>(i / groups);
  const int64_t c8 = i % groups;
  float s = 0.f;
  if (tok < n) {
    const float4 p = __ldg(reinterpret_cast<const float4*>(x) + 2 * i), q = __ldg(reinterpret_cast<const float4*>(x) + 2 * i + 1);
    const float v[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
    uint32_t h[4], l[4];
    float e[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const __nv_bfloat162 hh = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      const float h0 = __low2float(hh), h1 = __high2float(hh);
      const __nv_bfloat162 ll = __floats2bfloat162_rn(v[2 * k] - h0, v[2 * k + 1] - h1);
      h[k] = *reinterpret_cast<const uint32_t*>(&hh);
      l[k] = *reinterpret_cast<const uint32_t*>(&ll);
      e[2 * k] = lo ? h0 + __low2float(ll) : h0;  // exact: hi and lo are 8-bit significands 2^-9 apart at most
      e[2 * k + 1] = lo ? h1 + __high2float(ll) : h1;
    }
    reinterpret_cast<uint4*>(hi)[i] = make_uint4(h[0], h[1], h[2], h[3]);
    if (lo) reinterpret_cast<uint4*>(lo)[i] = make_uint4(l[0], l[1], l[2], l[3]);
    s = ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
  }
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  if ((threadIdx.x & 3) == 0) xsum[(c8 / 4) * ldx + tok] = s;
}

int tiles_for(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

// The m16 tiles per warp when the caller leaves it open (0): two where they won in CudaQuantMma.TimingAtK3Width
// (H200, call s29-1, x split): 32 tokens for every format (4096 x 7168 Q4_K 90.5 -> 57.5 us, Q6_K 92.9 -> 57.9, the
// 163840 x 2304 Q6_K head 980 -> 628), 16 tokens for Q4_K / Q5_K (40.1 -> 28.9, 49.5 -> 36.4; Q6_K lost: 41.6 vs
// 44.3, head 436 vs 462); one at <= 8 tokens (the second tile's registers cost more than the shared x loads save:
// Q6_K 28.1 vs 38.7 at one token).
int default_mt(WeightFormat f, int n) {
  const int nt = tiles_for(n);
  return nt == 4 || (nt == 2 && f != WeightFormat::Q6_K) ? 2 : 1;
}

template <class P, int NT, int MT, bool SPLIT>
cudaError_t launch(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s) {
  const int64_t blocks = (W.rows + 16 * MT - 1) / (16 * MT);
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  quant_mma_kernel<P, NT, MT, SPLIT><<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(
      static_cast<const uint8_t*>(W.data), W.rows, row_data_bytes(W.format, W.cols), a, y);
  return cudaGetLastError();
}

template <class P, int NT, bool SPLIT>
cudaError_t launch_mt(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s, int mt) {
  if constexpr (NT <= 4) {  // two m16 tiles at 8 n8 tiles would hold 256 accumulators
    if (mt == 2) return launch<P, NT, 2, SPLIT>(W, a, y, s);
  }
  return launch<P, NT, 1, SPLIT>(W, a, y, s);
}

template <class P, bool SPLIT>
cudaError_t launch_nt(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s, int mt) {
  switch (tiles_for(a.n)) {
    case 1: return launch_mt<P, 1, SPLIT>(W, a, y, s, mt);
    case 2: return launch_mt<P, 2, SPLIT>(W, a, y, s, mt);
    case 4: return launch_mt<P, 4, SPLIT>(W, a, y, s, mt);
    default: return launch_mt<P, 8, SPLIT>(W, a, y, s, mt);
  }
}

template <class P>
cudaError_t launch_format(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s, int mt) {
  return a.lo ? launch_nt<P, true>(W, a, y, s, mt) : launch_nt<P, false>(W, a, y, s, mt);
}

}  // namespace

bool quant_mma_supported(const WeightMatrix& W) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(W.data);
  if (W.cols <= 0 || W.cols % 256 != 0 || W.rows <= 0) return false;
  switch (W.format) {
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K: return p % 16 == 0;
    case WeightFormat::Q6_K: return p % 2 == 0;
    default: return false;
  }
}

cudaError_t quant_mma_prep(const float* x, int n, int64_t cols, uint16_t* hi, uint16_t* lo, float* xsum, cudaStream_t s) {
  if (n <= 0 || n > kQuantMmaMaxTokens || cols <= 0 || cols % 256 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(hi) % 16 != 0 || reinterpret_cast<uintptr_t>(lo) % 16 != 0 || xsum == nullptr)
    return cudaErrorInvalidValue;
  const int ldx = quant_mma_ldx(n);
  const int64_t threads = ldx * (cols / 8);
  quant_mma_prep_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, s>>>(x, n, ldx, cols, hi, lo, xsum);
  return cudaGetLastError();
}

cudaError_t quant_gemv_mma(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s, int mt) {
  if (!quant_mma_supported(W) || a.n <= 0 || a.n > kQuantMmaMaxTokens || a.cols != W.cols || a.hi == nullptr ||
      a.xsum == nullptr || reinterpret_cast<uintptr_t>(a.hi) % 16 != 0 || reinterpret_cast<uintptr_t>(a.lo) % 16 != 0 ||
      mt < 0 || mt > 2)
    return cudaErrorInvalidValue;
  if (mt == 0) mt = default_mt(W.format, a.n);
  switch (W.format) {
    case WeightFormat::Q4_K: return launch_format<MmaQ45<false>>(W, a, y, s, mt);
    case WeightFormat::Q5_K: return launch_format<MmaQ45<true>>(W, a, y, s, mt);
    default: return launch_format<MmaQ6K>(W, a, y, s, mt);
  }
}

}  // namespace k3::cuda
