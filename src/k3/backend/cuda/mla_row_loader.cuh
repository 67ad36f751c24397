// Loads a tile of latent cache rows into shared memory as bf16, for the tensor-core MLA decode kernel
// (mla_decode_tc.cu). One template per stored row type: the kernel is written against `load` (global
// loads into registers, issued before the previous tile's math so the loads are in flight during it)
// and `store` (convert to bf16, write the shared tile). fp32 rows exist today; bf16 rows would copy
// as-is (9 uint4 per thread), fp8 e4m3 rows convert per byte: each is one more specialisation here.
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

// fp32 rows: the tile is kKeys x 144 float4; thread t takes float4 t + 256u (u < 18), coalesced along each
// row. Keys at or past `end` read as zeros (their scores are masked; zero values keep P.V finite).
template <>
struct RowLoader<float> {
  static constexpr int kVec = kKeys * kCd / 4 / kThreads;  // 18
  float4 v[kVec];

  __device__ __forceinline__ void load(const MlaPaging& pg, int seq, int base, int end) {
    const int lane = threadIdx.x & 31;
    // Lane l resolves the page of key base + l once; the loads fetch it by shuffle (one division per tile).
    const int key = base + lane;
    const float* mine = key < end ? row_ptr<float>(pg, seq, key) : nullptr;
    const unsigned long long mine_u = reinterpret_cast<unsigned long long>(mine);
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / (kCd / 4), c4 = j % (kCd / 4);
      const auto p = reinterpret_cast<const float*>(__shfl_sync(0xffffffffu, mine_u, r));
      v[u] = p ? __ldg(reinterpret_cast<const float4*>(p) + c4) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }

  __device__ __forceinline__ void store(__nv_bfloat16* tile) const {
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / (kCd / 4), c4 = j % (kCd / 4);
      uint2 w;
      w.x = pack_bf16(v[u].x, v[u].y);
      w.y = pack_bf16(v[u].z, v[u].w);
      *reinterpret_cast<uint2*>(tile + r * kRowPad + 4 * c4) = w;
    }
  }
};

}  // namespace k3::cuda::mla_tc
