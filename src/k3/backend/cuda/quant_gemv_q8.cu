// quant_gemv_q8 (quant_kernels.h): the one-token Q4_K / Q5_K GEMV on int8 activations -- the CPU int8 tiers' numbers
// (weight_kernels_avx2int8_k.cpp, and weight_kernels_vnni_k.cpp bit for bit), on the GPU.
//
// Why: the fp32 block GEMV (quant_gemv.cu v3) decodes every weight to its exact fp32 value, ~10 instructions a weight
// (a PRMT, an fma and a subtraction to decode, an fma to multiply, the nibble masks, the scales), and so runs at about
// half the rate of a plain read of its bytes in a chain of one-token projections (call s47-2: 4096 x 2304 Q4_K 7.50 us
// against 3.62). The CPU's default tiers (avx2int8, avx512bf16, amx) multiply K-quants by llama.cpp's Q8_K activations
// instead -- int8 q = round(x / d) with one scale d = max|x| / 127 per 256 values -- in integer lanes, and llama.cpp's
// CUDA backend does the same with q8_1 and dp4a. Here one dp4a multiplies 4 weights, ~2 instructions a weight.
//
// The numbers are the CPU's, bit for bit, because the integer parts are exact in any order and the float parts follow
// the AVX2 lanes: in the CPU kernel, int32 lane L (0..7) of a block's sum holds, for each 32-byte chunk p (0..3) of
// quants, sc[2p] x (the products of quant bytes 4L..4L+3 of the chunk's low nibbles with activation bytes 64p + 4L..)
// + sc[2p + 1] x (the high nibbles' with bytes 64p + 32 + 4L..) -- one dp4a each here -- and its min lane L holds m[L]
// x (the sum of the activations of sub-block L); then per block, in block order, acc_L = fma(dw dx, float(sum_L),
// acc_L) and acc_L = fma(-(dmin dx), float(min_L), acc_L); the row's value is simd::hsum's tree over the 8 lanes,
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)). The activations are quantised as the CPU's q8k_block does: d =
// amax / 127, q = round-half-even(x (127 / amax)), the q sums per 16 values; a block with a NaN or an inf gets d = NaN
// (its outputs NaN, as on the CPU).
//
// Shape: 8 warps a block, a row a warp; the block first quantises x into shared memory (warp w: 256-value blocks w, w
// + 8, ...; ~9 KB of fp32 x read from L2 per block). In a warp, lane = 8 g + L: lane group g takes the row's blocks g,
// g + 4, ... (4 at a time), lane L its AVX lane; a round's 4 blocks are folded into the 8 accumulators in block order by
// shuffles. A row's quants and headers for up to kRounds rounds (16 blocks: 4096 columns) are loaded before the first
// multiply. Q5_K: the fifth bits (qh) of the lane's bytes as on the CPU (bit 2p of qh byte l for the low nibble).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "k3/backend/cuda/pdl.cuh"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_tables.h"

namespace k3::cuda {
namespace {

constexpr int kWarps = 8, kQK = 256, kRounds = 4;
// Shared memory per 256-value block of activations: q[256] int8 in a stride of kQStride bytes (the 4 lane groups of a
// warp read 4 blocks' same offsets: 288 = 72 words puts them 8 banks apart), the 8 sub-block sums of q (int32: the
// CPU's two per-16 sums of a sub-block, added, as its madd does), d.
constexpr int kQStride = 288, kQ8Bytes = kQStride + 8 * 4 + 4;

struct Q8Group {
  const uint8_t* W[kQuantGemvGroupMax];
  float* y[kQuantGemvGroupMax];
  int64_t rows[kQuantGemvGroupMax];
  int64_t first_block[kQuantGemvGroupMax];
  int count;
};

__device__ __forceinline__ float f16_of(uint32_t h) { return __half2float(__ushort_as_half(static_cast<unsigned short>(h))); }

// Block k of x (256 values) as Q8_K into shared memory, by one warp (8 values a lane).
__device__ void quantise_block(const float* __restrict__ x, int k, int lane, int8_t* q, int* sums, float* d) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(x + k * kQK + 8 * lane));
  const float4 b = __ldg(reinterpret_cast<const float4*>(x + k * kQK + 8 * lane + 4));
  const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  float amax = 0.f;
  bool bad = false;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    amax = fmaxf(amax, fabsf(v[i]));
    bad = bad || !isfinite(v[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  bad = __any_sync(0xffffffffu, bad);
  const float dk = bad ? __int_as_float(0x7fc00000) : __fdiv_rn(amax, 127.f);
  const float id = !bad && amax > 0.f ? __fdiv_rn(127.f, amax) : 0.f;
  uint32_t w[2] = {0, 0};
  int s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int qi = bad ? 0 : __float2int_rn(__fmul_rn(v[i], id));  // |x id| <= 127 for finite x; bad: d is NaN anyway
    s += qi;
    w[i / 4] |= static_cast<uint32_t>(qi & 0xff) << (8 * (i % 4));
  }
  *reinterpret_cast<uint2*>(q + k * kQStride + 8 * lane) = make_uint2(w[0], w[1]);
  s += __shfl_xor_sync(0xffffffffu, s, 1);
  s += __shfl_xor_sync(0xffffffffu, s, 2);  // lanes 4j .. 4j + 3: values 32 j .. 32 j + 31 (sub-block j)
  if ((lane & 3) == 0) sums[k * 8 + lane / 4] = s;
  if (lane == 0) d[k] = dk;
}

// One block's raw bytes for AVX lane L: the header (d, dmin, 12 scale bytes) and the lane's quant words.
template <bool kFive>
struct BlockRaw {
  uint4 h;
  uint32_t qs[4];
  uint32_t qh;  // Q5_K: qh bytes 4L..4L+3
};

template <bool kFive>
__device__ __forceinline__ BlockRaw<kFive> load_block(const uint8_t* __restrict__ wb, int L) {
  constexpr int kQs = kFive ? 48 : 16;
  BlockRaw<kFive> r;
  r.h = __ldg(reinterpret_cast<const uint4*>(wb));
#pragma unroll
  for (int p = 0; p < 4; ++p) r.qs[p] = __ldg(reinterpret_cast<const uint32_t*>(wb + kQs + 32 * p + 4 * L));
  r.qh = kFive ? __ldg(reinterpret_cast<const uint32_t*>(wb + 16 + 4 * L)) : 0u;
  return r;
}

// Byte j (0..3) of v as an int.
__device__ __forceinline__ int byte_of(uint32_t v, int j) { return static_cast<int>((v >> (8 * j)) & 0xff); }

// Lane L's integer sums of one block (the CPU kernel's int32 lanes): the products and the min term.
template <bool kFive>
__device__ __forceinline__ void block_sums(const BlockRaw<kFive>& r, const int8_t* q, const int* sums, int L, int& sumi,
                                           int& mq) {
  // The 6-bit scales and mins as the CPU's k4_scales_mins: sc 0..3 | 4..7 and m 0..3 | 4..7 as byte lanes.
  const uint32_t u0 = r.h.y, u1 = r.h.z, u2 = r.h.w;
  const uint32_t sc_lo = u0 & 0x3f3f3f3fu, sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
  const uint32_t m_lo = u1 & 0x3f3f3f3fu, m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
  sumi = 0;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    uint32_t lo = r.qs[p] & 0x0f0f0f0fu, hi = (r.qs[p] >> 4) & 0x0f0f0f0fu;
    if constexpr (kFive) {
      lo |= ((r.qh >> (2 * p)) & 0x01010101u) << 4;
      hi |= ((r.qh >> (2 * p + 1)) & 0x01010101u) << 4;
    }
    const int q0 = *reinterpret_cast<const int*>(q + 64 * p + 4 * L);
    const int q1 = *reinterpret_cast<const int*>(q + 64 * p + 32 + 4 * L);
    const uint32_t sc = p < 2 ? sc_lo : sc_hi;
    sumi += byte_of(sc, (2 * p) & 3) * __dp4a(static_cast<int>(lo), q0, 0) +
            byte_of(sc, (2 * p + 1) & 3) * __dp4a(static_cast<int>(hi), q1, 0);
  }
  mq = byte_of(L < 4 ? m_lo : m_hi, L & 3) * sums[L];
}

template <bool kFive>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_q8_kernel(const __grid_constant__ Q8Group grp, int64_t cols, const float* __restrict__ x) {
  constexpr int kBlockBytes = kFive ? 176 : 144;
  extern __shared__ __align__(16) uint8_t smem[];
  const int nb = static_cast<int>(cols / kQK);
  int8_t* sq = reinterpret_cast<int8_t*>(smem);
  int* ssum = reinterpret_cast<int*>(smem + nb * kQStride);
  float* sd = reinterpret_cast<float*>(smem + nb * kQStride + nb * 32);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, L = lane & 7, g = lane >> 3;
  int m = 0;  // this block's matrix (block-uniform)
  while (m + 1 < grp.count && static_cast<int64_t>(blockIdx.x) >= grp.first_block[m + 1]) ++m;
  const int row = (static_cast<int>(blockIdx.x) - static_cast<int>(grp.first_block[m])) * kWarps + warp;
  const bool in_range = row < grp.rows[m];
  const uint8_t* __restrict__ wr = grp.W[m] + static_cast<int64_t>(in_range ? row : 0) * nb * kBlockBytes;
  if (in_range) pdl::prefetch_l2(wr, static_cast<int64_t>(nb) * kBlockBytes, lane, 32);  // weights only (pdl.cuh)
  pdl::begin();
  for (int k = warp; k < nb; k += kWarps) quantise_block(x, k, lane, sq, ssum, sd);
  __syncthreads();
  if (!in_range) return;  // the whole warp (after the block's barrier)
  float acc = 0.f;        // AVX lane L's accumulator (the same in the 4 lane groups)
  for (int b0 = 0; b0 < nb; b0 += 4 * kRounds) {  // warp-uniform
    BlockRaw<kFive> raw[kRounds];
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int b = b0 + 4 * r + g;
      raw[r] = load_block<kFive>(wr + static_cast<int64_t>(b < nb ? b : nb - 1) * kBlockBytes, L);  // past the row: read, unused
    }
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int base = b0 + 4 * r;
      if (base >= nb) break;  // warp-uniform
      const int b = base + g;
      float sf = 0.f, qf = 0.f, A = 0.f, Mn = 0.f;
      if (b < nb) {
        int sumi, mq;
        block_sums<kFive>(raw[r], sq + b * kQStride, ssum + b * 8, L, sumi, mq);
        const float dx = sd[b];
        sf = __int2float_rn(sumi), qf = __int2float_rn(mq);
        A = __fmul_rn(f16_of(raw[r].h.x & 0xffffu), dx), Mn = __fmul_rn(f16_of(raw[r].h.x >> 16), dx);
      }
#pragma unroll
      for (int gg = 0; gg < 4; ++gg) {  // the round's blocks into the accumulator in block order
        const int src = 8 * gg + L;
        const float As = __shfl_sync(0xffffffffu, A, src), Ss = __shfl_sync(0xffffffffu, sf, src);
        const float Ms = __shfl_sync(0xffffffffu, Mn, src), Qs = __shfl_sync(0xffffffffu, qf, src);
        if (base + gg < nb) {
          acc = fmaf(As, Ss, acc);
          acc = fmaf(-Ms, Qs, acc);
        }
      }
    }
  }
  // simd::hsum: ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), lane L holding a_L.
  const float t = acc + __shfl_down_sync(0xffffffffu, acc, 4);  // lanes 0..3: a_L + a_{L+4}
  const float u = t + __shfl_down_sync(0xffffffffu, t, 2);      // lanes 0, 1: t_L + t_{L+2}
  const float v = u + __shfl_down_sync(0xffffffffu, u, 1);      // lane 0: u_0 + u_1
  if (lane == 0) grp.y[m][row] = v;
}

}  // namespace

bool quant_gemv_q8_supported(WeightFormat f, int64_t cols) {
  return (f == WeightFormat::Q4_K || f == WeightFormat::Q5_K) && cols > 0 && cols % kQK == 0 && cols <= kQ8MaxCols;
}

cudaError_t quant_gemv_q8(const WeightMatrix* const* W, float* const* y, int count, const float* x, cudaStream_t s) {
  if (count < 1 || count > kQuantGemvGroupMax) return cudaErrorInvalidValue;
  const WeightFormat f = W[0]->format;
  const int64_t cols = W[0]->cols;
  if (!quant_gemv_q8_supported(f, cols) || reinterpret_cast<uintptr_t>(x) % 16 != 0) return cudaErrorInvalidValue;
  Q8Group g{};
  int64_t blocks = 0;
  for (int m = 0; m < count; ++m) {
    if (W[m]->format != f || W[m]->cols != cols || W[m]->rows < 0 || reinterpret_cast<uintptr_t>(W[m]->data) % 16 != 0)
      return cudaErrorInvalidValue;
    g.W[m] = static_cast<const uint8_t*>(W[m]->data);
    g.y[m] = y[m];
    g.rows[m] = W[m]->rows;
    g.first_block[m] = blocks;
    blocks += (W[m]->rows + kWarps - 1) / kWarps;
  }
  g.count = count;
  if (blocks == 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(cols / kQK) * kQ8Bytes;
  const unsigned grid = static_cast<unsigned>(blocks);
  return f == WeightFormat::Q4_K ? pdl::launch(quant_gemv_q8_kernel<false>, grid, kWarps * 32, smem, s, g, cols, x)
                                 : pdl::launch(quant_gemv_q8_kernel<true>, grid, kWarps * 32, smem, s, g, cols, x);
}

}  // namespace k3::cuda
