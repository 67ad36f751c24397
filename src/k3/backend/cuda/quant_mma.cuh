// The tensor-core block GEMV's device code (quant_gemv_mma.cu explains the fragment mapping and the numerics): the
// K-quant decoders into mma.sync fragments, the kernel over a dense matrix or the routed experts' tiles (quant_moe_mma.cu),
// and the activation prep. Included by those two .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "k3/backend/cuda/mma_bf16.cuh"
#include "k3/backend/cuda/smem_ptx.cuh"
#include "k3/backend/cuda/moe_glu.cuh"
#include "k3/backend/cuda/pdl.cuh"
#include "k3/backend/cuda/quant_mma.h"
#include "k3/backend/cuda/quant_part.cuh"
#include "k3/core/weight_format.h"

// An unnamed namespace: each including .cu file gets its own copy of the kernels (no cross-file device linking).
namespace k3::cuda::qmma {
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

// cp.async (quant_mma_rows.cuh's staged x, quant_mma_staged.cuh's staged weights).
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
// 16 bytes from global src (16-byte aligned) to shared dst (a shared address, or a generic pointer into shared memory).
__device__ __forceinline__ void cp16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp16(void* dst, const void* src) { cp16(smem_addr(dst), src); }
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared-memory loads by 32-bit shared address (quant_mma_staged.cuh's staged weights).
using ptx::lds128;
using ptx::lds32;
using ptx::lds64;
// 4 bytes at a 2-byte aligned shared address (ld32_2a's funnel shift).
__device__ __forceinline__ uint32_t lds32_2a(uint32_t a) {
  const uint32_t lo = lds32(a & ~3u), hi = lds32((a & ~3u) + 2 * (a & 2u));  // the next word when a is 2 mod 4
  return __funnelshift_r(lo, hi, (a & 2u) * 8);
}
__device__ __forceinline__ uint32_t lds16(uint32_t a) {
  unsigned short v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(v) : "r"(a));
  return v;
}

// Where a lane's B fragments come from. Dense (MAPPED false): column j of n8 tile t is activation row min(8 t + j, n - 1)
// (rows past n repeat the last one; their results are discarded) and the sums sit at [sb][8 t + j] (padded with zeros to
// ldx). Experts (MAPPED): column j of a tile's n8 tile t is slot s0 + min(8 t + j, count - 1), whose activation row is
// the slot itself (hidden, by slot) or token sorted[s] / K (x, by token). The lane's B rows are j = g; its accumulator
// columns j = 2tq, 2tq + 1 (whose sub-block sums it needs for the mins).
template <int NT, bool SPLIT, bool MAPPED>
struct Xv {
  const uint16_t* hi;
  const uint16_t* lo;
  int64_t cols;
  int tok[NT];                   // the activation row of the lane's B column g of each n8 tile
  int xt[MAPPED ? NT : 1][2];    // MAPPED: the activation rows of accumulator columns 2tq, 2tq + 1
  const float* xsum;             // [cols / 32][ldx]
  int64_t ldx;
  __device__ static int row_of(const int32_t* sorted, int K, int s) {
    if constexpr (!MAPPED) return s;
    return sorted ? __ldg(sorted + s) / K : s;
  }
  __device__ void init(const QuantMmaActs& a, int64_t ld, const int32_t* sorted, int K, int s0, int count, int g, int tq) {
    hi = a.hi, lo = a.lo, cols = a.cols;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      tok[nt] = row_of(sorted, K, s0 + min(8 * nt + g, count - 1));
      if constexpr (MAPPED)
#pragma unroll
        for (int c = 0; c < 2; ++c) xt[nt][c] = row_of(sorted, K, s0 + min(8 * nt + 2 * tq + c, count - 1));
    }
    xsum = a.xsum + (MAPPED ? 0 : 2 * tq);
    ldx = ld;
  }
  // The B words of tile nt at column col (hi, then lo): T = uint4 (8 columns) or uint2 (4).
  template <class T>
  __device__ T hi_at(int nt, int64_t col) const { return __ldg(reinterpret_cast<const T*>(hi + tok[nt] * cols + col)); }
  template <class T>
  __device__ T lo_at(int nt, int64_t col) const { return __ldg(reinterpret_cast<const T*>(lo + tok[nt] * cols + col)); }
  // The sums of sub-block sb (32 columns) for the lane's two accumulator columns of tile nt.
  __device__ float2 sums(int64_t sb, int nt) const {
    const float* p = xsum + sb * ldx;
    if constexpr (MAPPED) return make_float2(__ldg(p + xt[nt][0]), __ldg(p + xt[nt][1]));
    return *reinterpret_cast<const float2*>(p + 8 * nt);
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
  // The same fields from a row staged in shared memory at address row (16-byte aligned: 144 / 176-byte blocks).
  __device__ static Raw load_s(uint32_t row, int u, int tq) {
    const uint32_t b = row + static_cast<uint32_t>(u >> 2) * kBlockBytes;
    Raw r;
    r.h = lds128(b);
    r.q = lds64(b + kQsOff + 32 * (u & 3) + 8 * tq);
    r.qh = kFifth ? lds64(b + 16 + 8 * tq) : make_uint2(0, 0);
    return r;
  }
  template <int NT, int MT, bool SPLIT, class XV>
  __device__ static void apply(const Raw (&r)[MT][2], int64_t u, const XV& xv, int tq, float (&acc)[MT][NT][4]) {
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
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint4 bh = xv.template hi_at<uint4>(nt, col);
        const uint4 bl = SPLIT ? xv.template lo_at<uint4>(nt, col) : make_uint4(0, 0, 0, 0);
        const float2 X = xv.sums(2 * u + s, nt);
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
  // The same fields from a row staged in shared memory at address row (2-byte aligned, as in global memory).
  __device__ static Raw load_s(uint32_t row, int u, int tq) {
    const uint32_t b = row + static_cast<uint32_t>(u >> 1) * kBlockBytes;
    const uint32_t hf = static_cast<uint32_t>(u & 1);
    Raw r;
#pragma unroll
    for (int k = 0; k < 4; ++k) r.ql[k] = lds32_2a(b + 64 * hf + 16 * k + 4 * tq);
#pragma unroll
    for (int h = 0; h < 2; ++h) r.qh[h] = lds32_2a(b + 128 + 32 * hf + 16 * h + 4 * tq);
    r.sc[0] = lds32_2a(b + 192 + 8 * hf);
    r.sc[1] = lds32_2a(b + 196 + 8 * hf);
    r.d = f16_bits(static_cast<unsigned short>(lds16(b + 208)));
    return r;
  }
  template <int NT, int MT, bool SPLIT, class XV>
  __device__ static void apply(const Raw (&r)[MT][2], int64_t u, const XV& xv, int tq, float (&acc)[MT][NT][4]) {
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
          const uint2 bh = xv.template hi_at<uint2>(nt, col);
          const uint2 bl = SPLIT ? xv.template lo_at<uint2>(nt, col) : make_uint2(0, 0);
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

// The block's 8 warps' R accumulators (flat) summed into warp 0's in a fixed tree -- w += w + 4, then w += w + 2, then
// w += w + 1 -- so that the result does not depend on timing; red is the block's shared scratch.
template <int R>
__device__ __forceinline__ void reduce_warps(float* flat, float (&red)[kWarps / 2][R][32], int warp, int lane) {
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
}

// One m16 tile's accumulators -- rows r0 + g and r0 + g + 8, tokens 8 nt + 2 tq + {0, 1} -- into out [token][rows], the
// rows past the matrix and the tokens past n left out.
template <int NT>
__device__ __forceinline__ void store_tile(const float (&acc)[NT][4], float* out, int64_t rows, int n, int64_t r0, int g, int tq) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t row = r0 + g + 8 * (i >> 1);
      const int c = 8 * nt + 2 * tq + (i & 1);
      if (row < rows && c < n) out[c * rows + row] = acc[nt][i];
    }
}

// The opt-in of Kernel to `bytes` (> 48 KB) of dynamic shared memory, once per device (a host call kept off later
// launches).
template <auto Kernel>
cudaError_t opt_in_smem(int bytes) {
  static std::atomic<uint64_t> opted{0};
  int dev = 0;
  if (const cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if ((opted.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  if (const cudaError_t e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); e != cudaSuccess) return e;
  opted.fetch_or(bit, std::memory_order_release);
  return cudaSuccess;
}

// One launch's work: a dense matrix (tiles == nullptr: rows x cols, the n activation rows), or the routed experts' tiles
// (blockIdx.y = tile: expert td.x's matrix, activation slots td.y .. td.y + td.z - 1, at most 8 NT). GLU: w1 is the up
// matrix beside w0's gate (MT = 2: m16 tile 0 reads gate rows, tile 1 the same up rows) and the result is glu(gate, up).
struct Job {
  const uint8_t* w0 = nullptr;
  const uint8_t* w1 = nullptr;
  int64_t rows = 0, row_bytes = 0, expert_bytes = 0;
  QuantMmaActs a;
  int64_t ldx = 0;                    // xsum's leading dimension
  const int4* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  const int32_t* sorted = nullptr;    // experts: x by token (slot s is token sorted[s] / K); null: activations by slot
  int K = 1;
  float* y = nullptr;                 // [slot or token][rows]
  GluAct act = GluAct::SiLU;
  float beta = 1.f, lbeta = 1.f;
};

// A GROUPED launch's matrices (one format and width, the same x; quant_gemv_mma_group): blocks [first_block[m],
// first_block[m + 1]) take matrix m's rows; w0, y and rows of the Job are unused. Other launches pass NoGroup (no bytes).
constexpr int kMaxGroup = 8;
struct DenseGroup {
  const uint8_t* w[kMaxGroup];
  float* y[kMaxGroup];
  int64_t rows[kMaxGroup];
  int64_t first_block[kMaxGroup];
  int count;
};
struct NoGroup {};
template <bool GROUPED>
using GroupParam = std::conditional_t<GROUPED, DenseGroup, NoGroup>;

// The member of a grouped launch that block bx works on (block-uniform): its matrix w, rows and output y, and bx made
// relative to the member's first block.
__device__ __forceinline__ void group_member(const DenseGroup& grp, int64_t& bx, const uint8_t*& w, int64_t& rows, float*& y) {
  int m = 0;
  while (m + 1 < grp.count && bx >= grp.first_block[m + 1]) ++m;
  w = grp.w[m];
  rows = grp.rows[m];
  y = grp.y[m];
  bx -= grp.first_block[m];
}

template <class P, int NT, int MT, bool SPLIT, bool GLU, bool MAPPED, bool GROUPED = false>
__global__ void __launch_bounds__(kWarps * 32) quant_mma_kernel(const Job j, const __grid_constant__ GroupParam<GROUPED> grp) {
  static_assert(!GLU || MT == 2, "GLU: m16 tile 0 = gate rows, 1 = up rows");
  static_assert(!GROUPED || (!GLU && !MAPPED), "groups are of dense matrices");
  constexpr int R = MT * NT * 4;
  __shared__ float red[kWarps / 2][R][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
  if constexpr (MAPPED) pdl::begin();
  const uint8_t* w0 = j.w0;
  const uint8_t* w1 = j.w1;
  int64_t rows = j.rows, bx = blockIdx.x;
  float* yout = j.y;
  if constexpr (GROUPED) group_member(grp, bx, w0, rows, yout);
  int s0 = 0, count = j.a.n;
  if constexpr (MAPPED) {  // the experts' tiles (the dense launches are never MAPPED: no registers for the tile's fields)
    if (static_cast<int>(blockIdx.y) >= *j.num_tiles) return;
    const int4 td = j.tiles[blockIdx.y];
    w0 += td.x * j.expert_bytes;
    if (GLU) w1 += td.x * j.expert_bytes;
    s0 = td.y, count = td.z;
  }
  const int64_t r0 = bx * 16 * (GLU ? 1 : MT);
  const uint8_t* rp[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      rp[mt][h] = (GLU && mt == 1 ? w1 : w0) + min(r0 + 16 * (GLU ? 0 : mt) + 8 * h + g, rows - 1) * j.row_bytes;
  Xv<NT, SPLIT, MAPPED> xv;
  xv.init(j.a, j.ldx, j.sorted, j.K, s0, count, g, tq);
  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;
  const int64_t units = j.a.cols / P::kUnitCols;
  if constexpr (!MAPPED) {  // dense: the block's rows into L2 before the wait (pdl.cuh: weights only)
    const int64_t nrows = min(static_cast<int64_t>(16 * (GLU ? 1 : MT)), rows - r0);
    pdl::prefetch_l2(w0 + r0 * j.row_bytes, nrows * j.row_bytes, threadIdx.x, kWarps * 32);
    if (GLU) pdl::prefetch_l2(w1 + r0 * j.row_bytes, nrows * j.row_bytes, threadIdx.x, kWarps * 32);
    pdl::begin();
  }
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
  reduce_warps<R>(&acc[0][0][0], red, warp, lane);
  if (warp != 0) return;
#pragma unroll
  for (int mt = 0; mt < (GLU ? 1 : MT); ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = r0 + 16 * mt + g + 8 * (i >> 1);
        const int c = 8 * nt + 2 * tq + (i & 1);
        if (row >= rows || c >= count) continue;
        const float v = GLU ? moe_dev::glu(acc[0][nt][i], acc[MT - 1][nt][i], j.act, j.beta, j.lbeta) : acc[mt][nt][i];
        yout[(s0 + c) * rows + row] = v;
      }
}

// x -> bf16 hi (+ lo) and the sums of hi + lo over each 32 columns; one thread per 8 columns of one token (a warp
// = 256 columns of one token: cols % 256 == 0), the 32-column sums over 4 lanes by two shuffles.
__global__ void __launch_bounds__(256) quant_mma_prep_kernel(const float* __restrict__ x, int n, int64_t ldx, int64_t cols,
                                                             uint16_t* __restrict__ hi, uint16_t* __restrict__ lo,
                                                             float* __restrict__ xsum) {
  pdl::begin();
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

inline int tiles_for(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

// x [n][cols] -> hi, lo, xsum [cols / 32][ldx] (ldx >= n, a multiple of 8), any n.
inline cudaError_t prep(const float* x, int n, int64_t ldx, int64_t cols, uint16_t* hi, uint16_t* lo, float* xsum, cudaStream_t s) {
  const int64_t threads = ldx * (cols / 8);  // the padding tokens' sums written as zeros
  return pdl::launch(quant_mma_prep_kernel, static_cast<unsigned>((threads + 255) / 256), 256, 0, s, x, n, ldx, cols, hi, lo, xsum);
}

template <class P, int NT, int MT, bool SPLIT, bool GLU, bool MAPPED>
cudaError_t launch(const Job& j, int tiles_bound, cudaStream_t s) {
  const int64_t blocks = (j.rows + 16 * (GLU ? 1 : MT) - 1) / (16 * (GLU ? 1 : MT));
  if (blocks > 0x7fffffff || tiles_bound < 1 || tiles_bound > 65535) return cudaErrorInvalidValue;
  return pdl::launch(quant_mma_kernel<P, NT, MT, SPLIT, GLU, MAPPED>, dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(tiles_bound)),
                     kWarps * 32, 0, s, j, NoGroup{});
}

// The dense KSplit kernel over the group's matrices in one launch (first_block filled here).
template <class P, int NT, int MT, bool SPLIT>
cudaError_t launch_group(const Job& j, DenseGroup g, cudaStream_t s) {
  int64_t blocks = 0;
  for (int m = 0; m < g.count; ++m) {
    g.first_block[m] = blocks;
    blocks += (g.rows[m] + 16 * MT - 1) / (16 * MT);
  }
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  if (blocks == 0) return cudaSuccess;
  return pdl::launch(quant_mma_kernel<P, NT, MT, SPLIT, false, false, true>, dim3(static_cast<unsigned>(blocks), 1u), kWarps * 32, 0,
                     s, j, g);
}

// fn.template run<P>() for the decoder of format f (Q4_K, Q5_K, Q6_K).
template <class Fn>
cudaError_t with_mma_format(WeightFormat f, const Fn& fn) {
  switch (f) {
    case WeightFormat::Q4_K: return fn.template run<MmaQ45<false>>();
    case WeightFormat::Q5_K: return fn.template run<MmaQ45<true>>();
    case WeightFormat::Q6_K: return fn.template run<MmaQ6K>();
    default: return cudaErrorInvalidValue;
  }
}

// Whether the kernels read a matrix of format f whose rows start at base + k row_bytes.
inline bool rows_ok(WeightFormat f, const void* base, int64_t row_bytes, int64_t cols) {
  const int64_t align = f == WeightFormat::Q6_K ? 2 : 16;
  return (f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q6_K) && cols > 0 && cols % 256 == 0 &&
         reinterpret_cast<uintptr_t>(base) % align == 0 && row_bytes % align == 0;
}

}  // namespace
}  // namespace k3::cuda::qmma
