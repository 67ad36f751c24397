// quant_gemv_q8 (quant_kernels.h): the one-token Q4_K / Q5_K / Q6_K GEMV on int8 activations -- the CPU int8 tiers'
// numbers (weight_kernels_avx2int8_k.cpp, and weight_kernels_vnni_k.cpp bit for bit), on the GPU; the one-token rule
// since session 47 (call s47-6: the Kimi-Linear-48B-dims Q4_K_M GGUF at batch 1 +12.9%, docs/perf/cuda.md).
//
// Why: the fp32 block GEMV (quant_gemv.cu v3) decodes every weight to its exact fp32 value, ~10 instructions a weight
// (a PRMT, an fma and a subtraction to decode, an fma to multiply, the nibble masks, the scales), and so runs at about
// half the rate of a plain read of its bytes in a chain of one-token projections (call s47-2: 4096 x 2304 Q4_K 7.50 us
// against 3.62). The CPU's default tiers (avx2int8, avx512bf16, amx) multiply K-quants by llama.cpp's Q8_K activations
// instead -- int8 q = round(x / d) with one scale d = max|x| / 127 per 256 values -- in integer lanes, and llama.cpp's
// CUDA backend does the same with q8_1 and dp4a. Here one dp4a multiplies 4 weights, ~2 instructions a weight.
//
// The numbers are the CPU's, bit for bit, because the integer parts are exact in any order and the float parts follow
// the AVX2 lanes (Q6_K's: BlockQ6K below): in the CPU's Q4_K kernel, int32 lane L (0..7) of a block's sum holds, for each 32-byte chunk p (0..3) of
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
// Measured (call s47-6, the projection chain): Q4_K 4096 x 2304 5.12 us (exact v3 7.44, a read of its bytes 3.61);
// what is left over the read is mostly the block's quantisation of x before its first product.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>

#include "k3/backend/cuda/pdl.cuh"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_tables.h"

namespace k3::cuda {
namespace {

constexpr int kQK = 256, kRounds = 4;
// Shared memory per 256-value block of activations: q[256] int8 in a stride of kQStride bytes (the 4 lane groups of a
// warp read 4 blocks' same offsets: 288 = 72 words puts them 8 banks apart), the 16 per-16 sums of q (int32, the CPU's
// int16 sums), d.
constexpr int kQStride = 288, kQ8Bytes = kQStride + 16 * 4 + 4;

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
  s += __shfl_xor_sync(0xffffffffu, s, 1);  // lanes 2j, 2j + 1: values 16 j .. 16 j + 15
  if ((lane & 1) == 0) sums[k * 16 + lane / 2] = s;
  if (lane == 0) d[k] = dk;
}

// Byte j (0..3) of v as an int; the same as a signed byte.
__device__ __forceinline__ int byte_of(uint32_t v, int j) { return static_cast<int>((v >> (8 * j)) & 0xff); }
__device__ __forceinline__ int sbyte_of(uint32_t v, int j) { return static_cast<int>(static_cast<int8_t>((v >> (8 * j)) & 0xff)); }

// 4 bytes at p (2-byte aligned: Q6_K's 210-byte blocks) from the aligned words around them; never past p + 4 when p is
// 4-aligned (a block's last bytes may end its row).
__device__ __forceinline__ uint32_t ld32u(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  const unsigned sh = 8u * static_cast<unsigned>(a & 3);
  const uint32_t lo = __ldg(w), hi = __ldg(sh ? w + 1 : w);
  return __funnelshift_r(lo, hi, sh);
}

// The per-block terms of AVX lane L: acc = fma(A, S, acc), then (kMin) acc = fma(-M, Q, acc).
struct Terms {
  float A = 0.f, S = 0.f, M = 0.f, Q = 0.f;
};

// Q4_K / Q5_K (kFive): 144 / 176-byte blocks {d, dmin, scales[12], (qh[32],) qs[128]}, 16-byte aligned.
template <bool kFive>
struct BlockK45 {
  static constexpr int kBytes = kFive ? 176 : 144;
  static constexpr bool kMin = true;
  // Held to 64 registers with the early loads (69 / 74 without the bound): 4 blocks an SM, so that 4096 rows (512
  // blocks) stay one wave on 132 SMs -- at 3 they took 1.3 waves, 5.15 -> 5.49 us in call s48-1's chain.
  static constexpr int kEarlyMinBlocks = 4;
  struct Raw {
    uint4 h;
    uint32_t qs[4];
    uint32_t qh;  // Q5_K: qh bytes 4L..4L+3
  };
  __device__ static Raw load(const uint8_t* __restrict__ wb, int L) {
    constexpr int kQs = kFive ? 48 : 16;
    Raw r;
    r.h = __ldg(reinterpret_cast<const uint4*>(wb));
#pragma unroll
    for (int p = 0; p < 4; ++p) r.qs[p] = __ldg(reinterpret_cast<const uint32_t*>(wb + kQs + 32 * p + 4 * L));
    r.qh = kFive ? __ldg(reinterpret_cast<const uint32_t*>(wb + 16 + 4 * L)) : 0u;
    return r;
  }
  // The CPU kernel's int32 lane L: chunk p's low nibbles (values 64p + 4L..) times scale 2p, its high nibbles (64p + 32
  // + 4L..) times scale 2p + 1; the min lane: m[L] times the q sum of sub-block L.
  __device__ static Terms terms(const Raw& r, const int8_t* q, const int* sums, float dx, int L) {
    const uint32_t u0 = r.h.y, u1 = r.h.z, u2 = r.h.w;  // the 6-bit scales and mins as the CPU's k4_scales_mins
    const uint32_t sc_lo = u0 & 0x3f3f3f3fu, sc_hi = (u2 & 0x0f0f0f0fu) | (((u0 >> 6) & 0x03030303u) << 4);
    const uint32_t m_lo = u1 & 0x3f3f3f3fu, m_hi = ((u2 >> 4) & 0x0f0f0f0fu) | (((u1 >> 6) & 0x03030303u) << 4);
    int sumi = 0;
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      uint32_t lo = r.qs[p] & 0x0f0f0f0fu, hi = (r.qs[p] >> 4) & 0x0f0f0f0fu;
      if constexpr (kFive) {  // bits 2p and 2p + 1 of each qh byte, as the CPU's 16-bit shifts give them
        lo |= ((r.qh >> (2 * p)) & 0x01010101u) << 4;
        hi |= ((r.qh >> (2 * p + 1)) & 0x01010101u) << 4;
      }
      const int q0 = *reinterpret_cast<const int*>(q + 64 * p + 4 * L);
      const int q1 = *reinterpret_cast<const int*>(q + 64 * p + 32 + 4 * L);
      const uint32_t sc = p < 2 ? sc_lo : sc_hi;
      sumi += byte_of(sc, (2 * p) & 3) * __dp4a(static_cast<int>(lo), q0, 0) +
              byte_of(sc, (2 * p + 1) & 3) * __dp4a(static_cast<int>(hi), q1, 0);
    }
    const int mq = byte_of(L < 4 ? m_lo : m_hi, L & 3) * (sums[2 * L] + sums[2 * L + 1]);  // the CPU's madd of the pair
    Terms t;
    t.A = __fmul_rn(f16_of(r.h.x & 0xffffu), dx), t.S = __int2float_rn(sumi);
    t.M = __fmul_rn(f16_of(r.h.x >> 16), dx), t.Q = __int2float_rn(mq);
    return t;
  }
};

// Q6_K: 210-byte blocks {ql[128], qh[64], scales[16] (int8), d}, 2-byte aligned.
struct BlockQ6K {
  static constexpr int kBytes = 210;
  static constexpr bool kMin = false;
  static constexpr int kEarlyMinBlocks = 0;  // 78 registers either way (64 would spill)
  struct Raw {
    uint32_t ql[4];  // ql bytes 64h + 4L.. and 64h + 32 + 4L.., h = 0, 1
    uint32_t qh[2];  // qh bytes 32h + 4L..
    uint32_t sc[4];  // the 16 scales
    uint32_t d;      // f16 in the low half
  };
  __device__ static Raw load(const uint8_t* __restrict__ wb, int L) {
    Raw r;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      r.ql[2 * h] = ld32u(wb + 64 * h + 4 * L);
      r.ql[2 * h + 1] = ld32u(wb + 64 * h + 32 + 4 * L);
      r.qh[h] = ld32u(wb + 128 + 32 * h + 4 * L);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) r.sc[j] = ld32u(wb + 192 + 4 * j);
    r.d = __ldg(reinterpret_cast<const uint16_t*>(wb + 208));
    return r;
  }
  // The CPU's q6k_tile lane L: for half h and k = 0..3 the 6-bit quants of values 128h + 32k + 4L.. (low nibbles of ql
  // byte 64h (+ 32 for odd k) + 4L.., high nibbles for k >= 2, qh's bits 2k..2k+1) times scale 8h + 2k (+ 1 for L >= 4);
  // minus 32 times the scaled q sums (scales 2L, 2L + 1 with the per-16 sums 2L, 2L + 1).
  __device__ static Terms terms(const Raw& r, const int8_t* q, const int* sums, float dx, int L) {
    int sumi = 0;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t src = r.ql[2 * h + (k & 1)];
        const uint32_t w = ((k >= 2 ? src >> 4 : src) & 0x0f0f0f0fu) | (((r.qh[h] >> (2 * k)) & 0x03030303u) << 4);
        // scale g = 8h + 2k (+ 1): byte g & 3 of word g >> 2 = 2h + k / 2 (a constant index: no local memory)
        const int scale = sbyte_of(r.sc[2 * h + k / 2], ((2 * k) & 3) + (L >= 4 ? 1 : 0));
        sumi += scale * __dp4a(static_cast<int>(w), *reinterpret_cast<const int*>(q + 128 * h + 32 * k + 4 * L), 0);
      }
    const uint32_t scw = L < 2 ? r.sc[0] : L < 4 ? r.sc[1] : L < 6 ? r.sc[2] : r.sc[3];  // scales 2L, 2L + 1
    const int off = sums[2 * L] * sbyte_of(scw, 2 * (L & 1)) + sums[2 * L + 1] * sbyte_of(scw, 2 * (L & 1) + 1);
    Terms t;
    t.A = __fmul_rn(f16_of(r.d), dx), t.S = __int2float_rn(sumi - off * 32);
    return t;
  }
};

// A row's quants and headers for blocks b0 + 4 r + g (r < kRounds) of lane group g; past the row: the last block,
// read and unused.
template <class B>
__device__ __forceinline__ void load_round_set(typename B::Raw (&raw)[kRounds], const uint8_t* __restrict__ wr, int b0,
                                               int nb, int g, int L) {
#pragma unroll
  for (int r = 0; r < kRounds; ++r) {
    const int b = b0 + 4 * r + g;
    raw[r] = B::load(wr + static_cast<int64_t>(b < nb ? b : nb - 1) * B::kBytes, L);
  }
}

// kEarly: the row's first kRounds x 4 blocks are loaded into registers before the wait for x and before the block
// quantises x, so that the weights' DRAM trip overlaps the previous kernel's tail and x's quantisation (the weights
// do not depend on the previous kernel). Without it they are loaded after the quantisation's barrier.
// kW warps a block, a row a warp: 8, or 16 for Q4_K / Q5_K groups of >= 2048 rows (x quantised once for 16 rows: the
// projection chain 4096 x 2304 4.94 -> 4.67 us, 2304 x 4096 4.98 -> 4.50; the kl48 GGUF b1 unchanged, call s48-7).
template <class B, bool kEarly, int kW>
__global__ void __launch_bounds__(kW * 32, kEarly ? B::kEarlyMinBlocks * 8 / kW : 0)
    quant_gemv_q8_kernel(const __grid_constant__ Q8Group grp, int64_t cols, const float* __restrict__ x) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int nb = static_cast<int>(cols / kQK);
  int8_t* sq = reinterpret_cast<int8_t*>(smem);
  int* ssum = reinterpret_cast<int*>(smem + nb * kQStride);
  float* sd = reinterpret_cast<float*>(smem + nb * kQStride + nb * 64);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, L = lane & 7, g = lane >> 3;
  int m = 0;  // this block's matrix (block-uniform)
  while (m + 1 < grp.count && static_cast<int64_t>(blockIdx.x) >= grp.first_block[m + 1]) ++m;
  const int row = (static_cast<int>(blockIdx.x) - static_cast<int>(grp.first_block[m])) * kW + warp;
  const bool in_range = row < grp.rows[m];
  const uint8_t* __restrict__ wr = grp.W[m] + static_cast<int64_t>(in_range ? row : 0) * nb * B::kBytes;
  typename B::Raw raw[kRounds];
  if (kEarly) {
    load_round_set<B>(raw, wr, 0, nb, g, L);  // an out-of-range warp reads row 0's blocks, unused
    if (in_range && nb > 4 * kRounds)         // the rest of the row (pdl.cuh)
      pdl::prefetch_l2(wr + 4 * kRounds * B::kBytes, static_cast<int64_t>(nb - 4 * kRounds) * B::kBytes, lane, 32);
  } else if (in_range) {
    pdl::prefetch_l2(wr, static_cast<int64_t>(nb) * B::kBytes, lane, 32);  // weights only (pdl.cuh)
  }
  pdl::begin();
  for (int k = warp; k < nb; k += kW) quantise_block(x, k, lane, sq, ssum, sd);
  __syncthreads();
  if (!in_range) return;  // the whole warp (after the block's barrier)
  float acc = 0.f;        // AVX lane L's accumulator (the same in the 4 lane groups)
  for (int b0 = 0; b0 < nb; b0 += 4 * kRounds) {  // warp-uniform
    if (!kEarly || b0 > 0) load_round_set<B>(raw, wr, b0, nb, g, L);
#pragma unroll
    for (int r = 0; r < kRounds; ++r) {
      const int base = b0 + 4 * r;
      if (base >= nb) break;  // warp-uniform
      const int b = base + g;
      const Terms t = b < nb ? B::terms(raw[r], sq + b * kQStride, ssum + b * 16, sd[b], L) : Terms{};
#pragma unroll
      for (int gg = 0; gg < 4; ++gg) {  // the round's blocks into the accumulator in block order
        const int src = 8 * gg + L;
        const float As = __shfl_sync(0xffffffffu, t.A, src), Ss = __shfl_sync(0xffffffffu, t.S, src);
        float Ms = 0.f, Qs = 0.f;
        if constexpr (B::kMin) Ms = __shfl_sync(0xffffffffu, t.M, src), Qs = __shfl_sync(0xffffffffu, t.Q, src);
        if (base + gg < nb) {
          acc = fmaf(As, Ss, acc);
          if constexpr (B::kMin) acc = fmaf(-Ms, Qs, acc);
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

template <bool kEarly, int kW>
cudaError_t launch_format(WeightFormat f, unsigned grid, size_t smem, cudaStream_t s, const Q8Group& g, int64_t cols,
                          const float* x) {
  if (f == WeightFormat::Q4_K)
    return pdl::launch(quant_gemv_q8_kernel<BlockK45<false>, kEarly, kW>, grid, kW * 32, smem, s, g, cols, x);
  if (f == WeightFormat::Q5_K)
    return pdl::launch(quant_gemv_q8_kernel<BlockK45<true>, kEarly, kW>, grid, kW * 32, smem, s, g, cols, x);
  return pdl::launch(quant_gemv_q8_kernel<BlockQ6K, kEarly, kW>, grid, kW * 32, smem, s, g, cols, x);
}

// K3_Q8_WARPS=8: 8 warps a block at every size (the A/B arm of call s48-7).
bool q8_wide_blocks() {
  static const bool on = [] {
    const char* v = std::getenv("K3_Q8_WARPS");
    return !(v && v[0] == '8');
  }();
  return on;
}

// K3_Q8_EARLY=0: the weights loaded after x's quantisation (session 47's form; the A/B arm of call s48-1).
bool q8_early_loads() {
  static const bool on = [] {
    const char* v = std::getenv("K3_Q8_EARLY");
    return !(v && v[0] == '0');
  }();
  return on;
}

}  // namespace

bool quant_gemv_q8_supported(WeightFormat f, int64_t cols) {
  return (f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q6_K) && cols > 0 && cols % kQK == 0 &&
         cols <= kQ8MaxCols;
}

cudaError_t quant_gemv_q8(const WeightMatrix* const* W, float* const* y, int count, const float* x, cudaStream_t s) {
  if (count < 1 || count > kQuantGemvGroupMax) return cudaErrorInvalidValue;
  const WeightFormat f = W[0]->format;
  const int64_t cols = W[0]->cols;
  if (!quant_gemv_q8_supported(f, cols) || reinterpret_cast<uintptr_t>(x) % 16 != 0) return cudaErrorInvalidValue;
  int64_t total_rows = 0;
  for (int m = 0; m < count; ++m) total_rows += W[m]->rows > 0 ? W[m]->rows : 0;
  // 16 warps a block where that still gives >= 128 blocks (one x quantisation per 16 rows); the early form of Q4_K /
  // Q5_K only (Q6_K's 16-warp kernel takes 90 registers: one block an SM).
  const int warps = q8_early_loads() && q8_wide_blocks() && f != WeightFormat::Q6_K && total_rows >= 2048 ? 16 : 8;
  Q8Group g{};
  int64_t blocks = 0;
  for (int m = 0; m < count; ++m) {
    const uintptr_t align = f == WeightFormat::Q6_K ? 2 : 16;
    if (W[m]->format != f || W[m]->cols != cols || W[m]->rows < 0 || reinterpret_cast<uintptr_t>(W[m]->data) % align != 0)
      return cudaErrorInvalidValue;
    g.W[m] = static_cast<const uint8_t*>(W[m]->data);
    g.y[m] = y[m];
    g.rows[m] = W[m]->rows;
    g.first_block[m] = blocks;
    blocks += (W[m]->rows + warps - 1) / warps;
  }
  g.count = count;
  if (blocks == 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(cols / kQK) * kQ8Bytes;
  const unsigned grid = static_cast<unsigned>(blocks);
  if (!q8_early_loads()) return launch_format<false, 8>(f, grid, smem, s, g, cols, x);
  return warps == 16 ? launch_format<true, 16>(f, grid, smem, s, g, cols, x) : launch_format<true, 8>(f, grid, smem, s, g, cols, x);
}

}  // namespace k3::cuda
