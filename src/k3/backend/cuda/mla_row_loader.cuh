// Loads tiles of latent cache rows into shared memory as bf16, for the tensor-core MLA decode kernel
// (mla_decode_tc.cu). One specialisation per cache dtype (core/cache_dtype.h): the kernel is written
// against `issue` (cp.async of a tile of kKeys rows into a staging stage, in the stored bytes) and
// `convert` (stage -> the bf16 tile the MMAs read), with kStageBytes per stage. Each thread converts
// exactly the bytes it copied itself (its own cp.async.wait_group makes them visible to it), so the
// staging ring needs no barrier. Keys at or past `end` become zeros (their scores are masked; zero values
// keep P.V finite).
//   F32:  kKeys x 144 16-byte chunks, thread t owns chunk t + 256u (u < 18), coalesced along each row;
//         fp32 -> bf16 (round to nearest even) in convert.
//   BF16: kKeys x 72 16-byte chunks (u < 9); convert is a copy.
//   FP8:  rows are 644 bytes (only 4-byte aligned), so 4-byte copies; the 8 threads of row r = t / 8 copy
//         its words sub, sub + 8, ... (sub = t % 8): the scale word (160) is thread sub 0's and reaches
//         the other 7 by shuffle. convert: c_kv = e4m3 code * scale rounded to bf16, k_pe copied.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/cache_dtype.cuh"
#include "k3/backend/cuda/mla_decode_tc.h"
#include "k3/backend/cuda/mla_paging.cuh"

namespace k3::cuda::mla_tc {

constexpr int kRowPad = kCd + 8;  // bf16 row stride in shared memory: 1168 B, so 8 rows hit 8 different 16 B bank groups
constexpr int kKeys = 32;        // keys per tile
constexpr int kThreads = 256;

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

// Lane l of each warp resolves the row of key base + l (null past `end`): one page division per key and
// tile; the copies fetch the address they need by shuffle.
__device__ __forceinline__ unsigned long long lane_row(const MlaSeqRows& rows_of, int base, int end) {
  const int key = base + (threadIdx.x & 31);
  return reinterpret_cast<unsigned long long>(key < end ? rows_of.row(key) : nullptr);
}

template <CacheDType DT>
struct RowLoader;

// Rows of 16-byte chunks (F32 and BF16): thread t copies chunk j = t + 256u of the stage, row j / kChunks.
template <int kRowBytes>
struct ChunkedRows {
  static constexpr int kChunks = kRowBytes / 16;           // per row
  static constexpr int kVec = kKeys * kChunks / kThreads;  // per thread
  static constexpr int kStageBytes = kKeys * kRowBytes;
  static_assert(kKeys * kChunks % kThreads == 0, "whole chunks per thread");

  __device__ __forceinline__ static void issue(uint8_t* stage, const MlaSeqRows& rows_of, int base, int end) {
    const unsigned long long mine = lane_row(rows_of, base, end);
    const uint32_t dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(stage));
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / kChunks, c = j % kChunks;
      const auto p = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, mine, r));
      if (p)
        cp_async16(dst0 + 16 * j, p + 16 * c);
      else
        reinterpret_cast<uint4*>(stage)[j] = make_uint4(0, 0, 0, 0);
    }
  }
};

template <>
struct RowLoader<CacheDType::F32> : ChunkedRows<kCd * 4> {
  __device__ __forceinline__ static void convert(const uint8_t* stage, __nv_bfloat16* tile) {
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / kChunks, c = j % kChunks;
      const float4 v = reinterpret_cast<const float4*>(stage)[j];
      uint2 w;
      w.x = pack_bf16(v.x, v.y);
      w.y = pack_bf16(v.z, v.w);
      *reinterpret_cast<uint2*>(tile + r * kRowPad + 4 * c) = w;
    }
  }
};

template <>
struct RowLoader<CacheDType::BF16> : ChunkedRows<kCd * 2> {
  __device__ __forceinline__ static void convert(const uint8_t* stage, __nv_bfloat16* tile) {
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int j = threadIdx.x + kThreads * u;
      const int r = j / kChunks, c = j % kChunks;
      *reinterpret_cast<uint4*>(tile + r * kRowPad + 8 * c) = reinterpret_cast<const uint4*>(stage)[j];
    }
  }
};

template <>
struct RowLoader<CacheDType::FP8_E4M3> {
  static constexpr int kRowBytes = static_cast<int>(mla_row_bytes(CacheDType::FP8_E4M3, kKr, kCd - kKr));  // 644
  static constexpr int kWords = kRowBytes / 4;                                  // 161
  static constexpr int kCodeWords = kKr / 4;                                    // 128: c_kv codes
  static constexpr int kPeWord = static_cast<int>(mla_fp8_pe_offset(kKr) / 4);  // 128: k_pe (bf16 pairs)
  static constexpr int kScaleWord = static_cast<int>(mla_fp8_scale_offset(kKr, kCd - kKr) / 4);  // 160
  static constexpr int kPerRow = kThreads / kKeys;                              // 8 threads per row
  static constexpr int kVec = (kWords + kPerRow - 1) / kPerRow;                 // 21 words per thread at most
  static constexpr int kStageBytes = kKeys * kRowBytes;
  static_assert(kPeWord == kCodeWords && kScaleWord == kPeWord + (kCd - kKr) / 2 && kWords == kScaleWord + 1,
                "fp8 row layout of core/cache_dtype.h");
  static_assert(kScaleWord % kPerRow == 0, "the scale word is thread sub 0's");
  static_assert(kStageBytes % 16 == 0, "the bf16 tile after the stages stays 16-byte aligned");

  __device__ __forceinline__ static void issue(uint8_t* stage, const MlaSeqRows& rows_of, int base, int end) {
    const unsigned long long mine = lane_row(rows_of, base, end);
    const int sub = threadIdx.x % kPerRow, r = threadIdx.x / kPerRow;  // r < 32 = kKeys
    // Row r is key base + r: lane r of every warp resolved it.
    const auto p = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, mine, r));
    uint8_t* dst_row = stage + r * kRowBytes;
    const uint32_t dst0 = static_cast<uint32_t>(__cvta_generic_to_shared(dst_row));
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int w = sub + kPerRow * u;
      if (w >= kWords) break;
      if (p)
        cp_async4(dst0 + 4 * w, p + 4 * w);
      else
        reinterpret_cast<uint32_t*>(dst_row)[w] = 0u;
    }
  }

  __device__ __forceinline__ static void convert(const uint8_t* stage, __nv_bfloat16* tile) {
    const int sub = threadIdx.x % kPerRow, r = threadIdx.x / kPerRow;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(stage + r * kRowBytes);
    const float mine = sub == 0 ? __uint_as_float(words[kScaleWord]) : 0.f;
    const float scale = __shfl_sync(0xffffffffu, mine, (threadIdx.x & 31) & ~(kPerRow - 1));
    __nv_bfloat16* out = tile + r * kRowPad;
#pragma unroll
    for (int u = 0; u < kVec; ++u) {
      const int w = sub + kPerRow * u;
      if (w < kCodeWords) {
        const float4 v = fp8x4_e4m3_to_f32(words[w]);
        uint2 o;
        o.x = pack_bf16(v.x * scale, v.y * scale);
        o.y = pack_bf16(v.z * scale, v.w * scale);
        *reinterpret_cast<uint2*>(out + 4 * w) = o;
      } else if (w < kScaleWord) {
        *reinterpret_cast<uint32_t*>(out + kKr + 2 * (w - kPeWord)) = words[w];
      }
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
