// The wgmma MLA decode kernel's tile layout and small helpers (mla_decode_wgmma.cu): the 128-byte swizzled K-major
// layout (9 column blocks of 64 bf16 values; row r of a block at 128 r, its 16-byte chunk c at (c ^ (r & 7)) * 16),
// the copy / store helpers, Q's conversion to bf16. Included by .cu files of this folder only (sm_90a).
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/mla_decode_wgmma.h"
#include "k3/backend/cuda/mla_paging.cuh"

namespace k3::cuda::mla_wg::detail {

constexpr int kCd = 576, kKr = 512;
constexpr int kColBlocks = kCd / 64;            // 9 swizzle column blocks of 64 bf16 (128 bytes)
constexpr int kBlockBytes = 64 * 128;           // one column block of 64 rows
constexpr int kTileBytes = kColBlocks * kBlockBytes;  // 73728: Q or one K/V stage
constexpr int kChunks = kCd / 8;                // 16-byte chunks per row: 72
constexpr int kSteps = kCd / 16;                // k16 steps of S
constexpr int kPvSteps = kKeys / 16;            // k16 steps of P V
constexpr uint32_t kSbo = 1024;                 // 8 rows x 128 bytes
// V read N-major (dims contiguous): next 64 dims = the next column block, next 8 keys = kSbo.
constexpr uint32_t kVLbo = kBlockBytes;
constexpr int kQThreads = 256;                  // threads that convert Q (the MMA warpgroups)
static_assert(kHeadsPerBlock == 64 && kKeys == 64, "one wgmma M tile of heads, 64-key tiles");
static_assert(64 * kChunks % kQThreads == 0, "whole chunks per thread");

__device__ __forceinline__ uint32_t swz(int row, int chunk) {  // byte offset of a 16-byte chunk (0..71) of a row
  return (chunk >> 3) * kBlockBytes + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void st_shared16(uint32_t dst, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void st_shared4(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

// Q rows of heads h0 .. h0 + 63 of token t (fp32 in memory) -> bf16 in the swizzled layout; heads >= nh zero.
// Threads 0 .. kQThreads - 1 take part.
__device__ __forceinline__ void load_q(uint32_t dst, const float* __restrict__ q_lat, int t, int nh, int h0) {
#pragma unroll 6
  for (int u = 0; u < 64 * kChunks / kQThreads; ++u) {
    const int j = threadIdx.x + kQThreads * u;
    const int r = j / kChunks, c = j % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (h0 + r < nh) {
      const float4* src = reinterpret_cast<const float4*>(q_lat + (static_cast<int64_t>(t) * nh + h0 + r) * kCd + 8 * c);
      const float4 x = __ldg(src), y = __ldg(src + 1);
      v = make_uint4(pack_bf16(x.x, x.y), pack_bf16(x.z, x.w), pack_bf16(y.x, y.y), pack_bf16(y.z, y.w));
    }
    st_shared16(dst + swz(r, c), v);
  }
}

}  // namespace k3::cuda::mla_wg::detail
