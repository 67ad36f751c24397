// What the routed experts' wgmma prefill forms share (sm90a/moe_prefill_wgmma.cu: shared-memory and register-A
// bodies; sm90a/moe_prefill_ring.cu: the register-A body fed by a cp.async ring): the block's shape, the 128-byte
// swizzle of a staged K-major operand, small PTX helpers, the MMA by pair count and the accumulators' outputs.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/moe_tc_tile.cuh"
#include "k3/backend/cuda/sm90a/wgmma.cuh"

namespace k3::cuda::moe_wg::detail {

constexpr int kThreads = 256;  // 2 warpgroups
constexpr int kPairs = 64;     // the plan's tensor-core tile (kTcM)
constexpr int kRows = 256;     // weight rows staged per block
constexpr int kKc = 64;        // columns per chunk: 128 bytes of bf16, one swizzle row
constexpr int kWBytes = kRows * 128;
constexpr int kXBytes = kPairs * 128;
constexpr uint32_t kSbo = 1024;  // 8 rows x 128 bytes
static_assert(kPairs == kTcM, "one plan tile per block");

__device__ __forceinline__ uint32_t swz(int row, int chunk) { return row * 128 + (((chunk & 7) ^ (row & 7)) << 4); }
__device__ __forceinline__ void st_shared16(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
// cp.async of 16 bytes, zero-filled when !valid (src is then only a valid address, not read).
__device__ __forceinline__ void cp_async16_or_zero(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void st_shared4(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
}

// One m64nNNk16 MMA into the tile's accumulators: register A (the ring form's tiles take 16 .. 128 pairs in steps of 16) or
// shared-memory A (<= 64).
template <int NN>
__device__ __forceinline__ void mma_rs(float (&d)[NN / 2], const uint32_t (&a)[4], uint64_t db) {
  static_assert(NN % 16 == 0 && NN <= 128, "no such tile width");
  wgmma::mma_rs<NN>(d, a, db);
}
template <int NN>
__device__ __forceinline__ void mma(float (&d)[NN / 2], uint64_t da, uint64_t db) {
  static_assert(NN == 16 || NN == 32 || NN == 48 || NN == 64, "no such tile width");
  wgmma::mma_ss<NN>(d, da, db, 1);
}

template <int N>
__device__ __forceinline__ void zero_acc(float (&acc)[2][N]) {
#pragma unroll
  for (int mm = 0; mm < 2; ++mm)
#pragma unroll
    for (int i = 0; i < N; ++i) acc[mm][i] = 0.f;
}

// Register-A fragments stay allocated and unchanged until the wgmmas reading them have completed: the asm reads
// them as written after the wait, so the compiler cannot reuse their registers for the next chunk's decode.
__device__ __forceinline__ void keep_frags(uint32_t (&af)[4][4]) {
#pragma unroll
  for (int st = 0; st < 4; ++st)
#pragma unroll
    for (int q = 0; q < 4; ++q) asm volatile("" : "+r"(af[st][q])::"memory");
}

// Register-A fragments of one m64 A tile for a 64-column chunk, from the two rows a thread holds (row h: 8 bytes of
// MXFP4 = its 16 columns 16 c .. + 15, and that group's E8M0 scale byte): the k order inside the chunk is permuted so
// that lane c of a quad holds, at k-step s, slots {2c, 2c+1} = columns 16c + 4s + {0, 1} and slots {2c+8, 2c+9} =
// columns 16c + 4s + {2, 3}; register h of k-step s is row h's slots 2c, 2c+1, register 2 + h its slots 2c+8, 2c+9.
// The activations (B) must be staged in the same order (the register-A form's store_x).
__device__ __forceinline__ void decode_a_frags(uint32_t (&af)[4][4], const uint2 (&w)[2], const uint32_t (&sb)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sc = e8m0_scale_x2p14(sb[h]);
    const uint4 lo = e2m1x8_to_bf16(w[h].x, sc), hi = e2m1x8_to_bf16(w[h].y, sc);
    af[0][h] = lo.x, af[0][2 + h] = lo.y, af[1][h] = lo.z, af[1][2 + h] = lo.w;
    af[2][h] = hi.x, af[2][2 + h] = hi.y, af[3][h] = hi.z, af[3][2 + h] = hi.w;
  }
}

// The ring form's cheaper decode (moe_prefill_ring.cu): E2M1 nibbles placed straight into bf16 bit fields -- sign
// to bit 15 / 31, the 3 exponent-mantissa bits to bits 6..8 / 22..24 -- give the value times 2^-126 (e = 0, m = 1 is
// the bf16 subnormal 2^-127), then one bf16x2 multiply by 2^(s-1) (s <= 128) or two (2^127, then 2^(s-128)) applies
// the E8M0 scale: exact (a power of two times a 2-bit significand). The nibbles a shift brings to bits 12..15 and
// 28..31 pair up: (3, 7), (2, 6), (1, 5), (0, 4) of each 8-column word, so the k order differs from decode_a_frags':
// k-step s = 2 word + k / 2, register h (slots 2c, 2c+1) for even k, 2 + h (2c+8, 2c+9) for odd, with the shift 4 k.
__device__ __forceinline__ uint32_t e2m1_pair_x2m126(uint32_t v) { return (v & 0x80008000u) | ((v & 0x70007000u) >> 6); }
__device__ __forceinline__ uint32_t bf16_pow2_pair(uint32_t biased_exp) { return (biased_exp << 7) * 0x00010001u; }
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// NARROW: every scale of the bank is <= 128 (2^1; ExpertStack::max_scale), so one multiply by 2^(s-1) is exact and
// neither the NaN scale (255) nor the second multiply can occur: of a chunk's ~110 decode instructions a thread, the
// scale handling's ~22 (tests, selects, the vote) go -- s64-1's per-instruction samples had them among the busiest
// ALU-pipe instructions of gate+up (math-pipe throttle), in a kernel whose step is issue-bound.
template <bool NARROW = false>
__device__ __forceinline__ void decode_a_frags_bits(uint32_t (&af)[4][4], const uint2 (&w)[2], const uint32_t (&sb)[2]) {
  uint32_t f1[2], f2[2] = {0u, 0u};
  bool wide = false;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t s = sb[h];
    if constexpr (NARROW) {
      f1[h] = bf16_pow2_pair(s + 126u);
    } else {
      f1[h] = s == 255u ? 0x7fc07fc0u : bf16_pow2_pair(s <= 128u ? s + 126u : 254u);  // NaN scale: NaN weights
      f2[h] = bf16_pow2_pair(s <= 128u || s == 255u ? 127u : s - 1u);
      wide = wide || (s > 128u && s != 255u);
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const uint32_t v = q ? w[h].y : w[h].x;
#pragma unroll
      for (int k = 0; k < 4; ++k) af[2 * q + (k >> 1)][(k & 1) ? 2 + h : h] = bf16x2_mul(e2m1_pair_x2m126(v << (4 * k)), f1[h]);
    }
  // The second multiply only where some scale of the warp needs it (> 2^1: rare in trained weights), as a warp-uniform
  // branch: predicated, its 16 multiplies took issue slots in every step (the ring is issue-bound at bf16).
  if constexpr (!NARROW) {
    if (__any_sync(0xffffffffu, wide)) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            uint32_t& r = af[2 * q + (k >> 1)][(k & 1) ? 2 + h : h];
            r = bf16x2_mul(r, f2[h]);
          }
    }
  }
}
// decode_a_frags_bits's k order (the ring form's activation planes): where column col (0..63) of a chunk sits, and which column sits at position pos.
__host__ __device__ constexpr int ring_pos(int col) {
  return 16 * (2 * ((col >> 3) & 1) + ((3 - (col & 3)) >> 1)) + 2 * (col >> 4) + ((col >> 2) & 1) + 8 * ((3 - (col & 3)) & 1);
}
__host__ __device__ constexpr int ring_col(int pos) {
  return 16 * ((pos & 7) >> 1) + 8 * (pos >> 5) +
         ((pos & 1) ? 7 - (2 * ((pos >> 4) & 1) + ((pos >> 3) & 1)) : 3 - (2 * ((pos >> 4) & 1) + ((pos >> 3) & 1)));
}

// The block's outputs from the accumulators (warp q of warpgroup wg, lane l: element 4 j + e = weight row
// 16 q + l / 4 + 8 (e >> 1), pair 8 j + 2 (l % 4) + (e & 1)): NMAT 2 the GLU of gate and up, NMAT 1 the rows.
template <int NMAT, int NN>
__device__ __forceinline__ void store_out(const TileArgs& a, const float (&acc)[2][NN / 2], int n0, int start, int cnt) {
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31;
  const int rows = a.rows;
  const int g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
  for (int j = 0; j < NN / 8; ++j)
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int pair = 8 * j + c2 + (q & 1), row = 16 * wq + g + 8 * (q >> 1);
      if (pair >= cnt) continue;
      float* orow = a.out + static_cast<int64_t>(start + pair) * rows;
      if constexpr (NMAT == 2) {
        const int n = n0 + 64 * wg + row;
        if (n < rows) orow[n] = moe_dev::glu(acc[0][4 * j + q], acc[1][4 * j + q], a.act, a.beta, a.lbeta);
      } else {
#pragma unroll
        for (int mm = 0; mm < 2; ++mm) {
          const int n = n0 + 128 * wg + 64 * mm + row;
          if (n < rows) orow[n] = acc[mm][4 * j + q];
        }
      }
    }
}

}  // namespace k3::cuda::moe_wg::detail
