// Loads tiles of latent cache rows into shared memory as bf16, for the tensor-core MLA decode kernel
// (mla_decode_tc.cu). One specialisation per stored row type: the kernel is written against `issue`
// (cp.async of a tile into a staging stage, in the stored type) and `convert` (stage -> the bf16 tile the
// MMAs read), with kStageBytes per stage. fp32 rows exist today; bf16 rows would stage at half the bytes
// and convert as a copy, fp8 e4m3 rows at a quarter with a per-byte conversion: each is one more
// specialisation here and one more instantiation in mla_decode_tc.cu.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/mla_decode_tc.h"

namespace k3::cuda::mla_tc {

constexpr int kRowPad = kCd + 8;  // bf16 row stride in shared memory: 1168 B, so 8 rows hit 8 different 16 B bank groups
constexpr int kKeys = 32;        // keys per tile
constexpr int kThreads = 256;

// Row `pos` of sequence `seq` (MlaPaging's layout), as the stored element type.
template <class T>
__device__ __forceinline__ const T* row_ptr(const MlaPaging& pg, int seq, int pos) {
  const int pt = pg.page_tokens[seq];
  const T* page = reinterpret_cast<const T* const*>(pg.pages)[pg.page_start[seq] + pos / pt];
  return page + static_cast<int64_t>(pos % pt) * pg.row_dim;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

template <class T>
struct RowLoader;

// fp32 rows, through a ring of fp32 staging tiles in shared memory filled by cp.async (no registers
// held, so two tiles can be in flight per block). The tile is kKeys x 144 float4; thread t owns float4
// t + 256u (u < 18) of every stage, coalesced along each row, and converts exactly the chunks it copied:
// its own cp.async.wait_group makes them visible to it, so the staging ring needs no barrier.
// Keys at or past `end` become zeros (their scores are masked; zero values keep P.V finite).
template <>
struct RowLoader<float> {
  static constexpr int kVec = kKeys * kCd / 4 / kThreads;  // 18
  static constexpr int kStageBytes = kKeys * kCd * 4;

  __device__ __forceinline__ static void issue(float* stage, const MlaPaging& pg, int seq, int base, int end) {
    const int lane = threadIdx.x & 31;
    // Lane l resolves the page of key base + l once; the copies fetch it by shuffle (one division per tile).
    const int key = base + lane;
    const float* mine = key < end ? row_ptr<float>(pg, seq, key) : nullptr;
    const unsigned long long mine_u = reinterpret_cast<unsigned long long>(mine);
    const uint32_t dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / (kCd / 4), c4 = j % (kCd / 4);
      const auto p = reinterpret_cast<const float*>(__shfl_sync(0xffffffffu, mine_u, r));
      if (p)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst0 + 16 * j), "l"(p + 4 * c4) : "memory");
      else
        reinterpret_cast<float4*>(stage)[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  __device__ __forceinline__ static void convert(const float* stage, __nv_bfloat16* tile) {
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / (kCd / 4), c4 = j % (kCd / 4);
      const float4 v = reinterpret_cast<const float4*>(stage)[j];
      uint2 w;
      w.x = pack_bf16(v.x, v.y);
      w.y = pack_bf16(v.z, v.w);
      *reinterpret_cast<uint2*>(tile + r * kRowPad + 4 * c4) = w;
    }
  }
};

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most `pending` of this thread's most recent groups are still in flight.
template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

}  // namespace k3::cuda::mla_tc
