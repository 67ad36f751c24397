// Loads-only probe for the MLA wgmma decode kernel's copy path (session 52; docs/perf/cuda.md): how fast can one block
// per (token, head block) stream its sequence's 1152-byte BF16 latent rows through two 72 KB stages of 64 rows (beside a
// 72 KB Q region, as the kernel's shared memory is laid out) when the copies are
//   cp    -- 4 producer warps of cp.async, 16 bytes a lane, each warp waiting for all of its copies before it signals the
//            stage full (the kernel's issue_half), or
//   tma   -- one producer thread issuing 9 cp.async.bulk.tensor.2d copies a stage (box 64 columns x 64 rows, 128-byte
//            swizzle: the kernel's layout), completing on the stage's mbarrier by bytes.
// The 8 consumer warps wait for a full stage and release it at once (plus one 16-byte read a lane, summed, so the copies
// cannot be skipped). Grid: 2 head blocks x B tokens (nh 96: both blocks of a token stream the same rows), L keys each.
// Build: nvcc -arch=sm_90a -O3 -std=c++17 mla_copy_paths.cu -o mla_copy_paths; run: ./mla_copy_paths [B] [L].
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kRowBytes = 1152, kKeys = 64, kStageBytes = kKeys * kRowBytes, kThreads = 384;
constexpr int kSmem = 1024 + 3 * kStageBytes + 64;

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile("{\n.reg .pred p;\nW:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(bar),
               "r"(parity)
               : "memory");
}
__device__ __forceinline__ uint32_t swz(int row, int chunk) {
  return (chunk >> 3) * (kKeys * 128) + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

template <bool TMA>
__global__ void __launch_bounds__(kThreads, 1)
    stream_rows(const __grid_constant__ CUtensorMap tmap, const uint8_t* __restrict__ rows, int L, float* __restrict__ sink) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t stage0 = base + kStageBytes;  // [Q][stage 0][stage 1]
  const uint32_t bars = base + 3 * kStageBytes;  // full0, full1, empty0, empty1
  const int tok = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tiles = L / kKeys;
  if (threadIdx.x == 0) {
    mbar_init(bars, TMA ? 1 : 2);
    mbar_init(bars + 8, TMA ? 1 : 2);
    mbar_init(bars + 16, 8);
    mbar_init(bars + 24, 8);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (warp >= 8) {
    const int p = warp - 8, st = p >> 1, half = p & 1;
    if (TMA && p != 0) return;
    for (int t = (TMA ? 0 : st), u = 0; t < tiles; t += (TMA ? 1 : 2), ++u) {
      const int s = TMA ? (t & 1) : st;
      const int use = TMA ? (t >> 1) : u;
      const uint32_t dst = stage0 + s * kStageBytes, full = bars + 8 * s, empty = bars + 16 + 8 * s;
      if (use > 0) mbar_wait(empty, (use - 1) & 1);
      if constexpr (TMA) {
        if (lane == 0) {
          mbar_expect_tx(full, kStageBytes);
          const int r0 = tok * L + t * kKeys;
          for (int b = 0; b < 9; ++b)
            asm volatile(
                "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                    dst + b * kKeys * 128),
                "l"(reinterpret_cast<uint64_t>(&tmap)), "r"(b * 64), "r"(r0), "r"(full)
                : "memory");
        }
      } else {
        const uint8_t* src0 = rows + (static_cast<int64_t>(tok) * L + t * kKeys + 32 * half) * kRowBytes;
#pragma unroll 8
        for (int u2 = 0; u2 < 72; ++u2) {
          const int j = lane + 32 * u2, r = j / 72, c = j % 72;
          const uint32_t d = dst + swz(32 * half + r, c);
          asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src0 + r * kRowBytes + 16 * c) : "memory");
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(full);
      }
    }
    return;
  }
  float acc = 0.f;
  for (int t = 0; t < tiles; ++t) {
    const int s = t & 1;
    mbar_wait(bars + 8 * s, (t >> 1) & 1);
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(stage0 + s * kStageBytes + 16 * (threadIdx.x & 255)));
    acc += v.x + v.w;
    __syncwarp();
    if (lane == 0) mbar_arrive(bars + 16 + 8 * s);
  }
  if (acc == 12345.678f) sink[0] = acc;  // keeps the reads
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                                 const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 64, L = argc > 2 ? std::atoi(argv[2]) : 8192;
  const size_t bytes = static_cast<size_t>(B) * L * kRowBytes;
  uint8_t* rows = nullptr;
  float* sink = nullptr;
  if (cudaMalloc(&rows, bytes) != cudaSuccess || cudaMalloc(&sink, 64) != cudaSuccess) return 1;
  cudaMemset(rows, 0x3c, bytes);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess || !fn) return 2;
  CUtensorMap tmap{};
  const cuuint64_t dims[2] = {576, static_cast<cuuint64_t>(B) * L};
  const cuuint64_t strides[1] = {kRowBytes};
  const cuuint32_t box[2] = {64, kKeys}, estr[2] = {1, 1};
  const CUresult r = reinterpret_cast<EncodeTiled>(fn)(&tmap, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, rows, dims, strides, box, estr,
                                                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                       CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled: %d\n", static_cast<int>(r));
    return 3;
  }
  cudaFuncSetAttribute(stream_rows<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  cudaFuncSetAttribute(stream_rows<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
  const dim3 grid(2, B);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int round = 0; round < 3; ++round)
    for (int tma = 0; tma < 2; ++tma) {
      auto launch = [&] {
        if (tma)
          stream_rows<true><<<grid, kThreads, kSmem>>>(tmap, rows, L, sink);
        else
          stream_rows<false><<<grid, kThreads, kSmem>>>(tmap, rows, L, sink);
      };
      launch();
      cudaEventRecord(e0);
      const int reps = 10;
      for (int i = 0; i < reps; ++i) launch();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float ms = 0;
      cudaEventElapsedTime(&ms, e0, e1);
      const double us = 1000.0 * ms / reps;
      std::printf("round %d %-3s B %d L %d: %8.1f us  rows %.0f MB once: %6.0f GB/s  (%s)\n", round, tma ? "tma" : "cp", B, L,
                  us, bytes / 1e6, bytes / us / 1e3, cudaGetErrorString(cudaGetLastError()));
    }
  return 0;
}
