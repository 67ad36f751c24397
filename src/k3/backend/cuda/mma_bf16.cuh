// bf16 tensor-core building blocks of the skinny kernels (linear_skinny.cu, moe_skinny.cu): mma.sync
// m16n8k16 with fp32 accumulators, a streaming 16-byte weight load, and the two k16 steps of one 32-column
// chunk in the "16 bytes per lane straight into A" layout (linear_skinny.cu's header explains it).
#pragma once
#include <cstdint>

namespace k3::cuda::mma_bf16 {

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Weights are read once: no L1 allocation (L1 stays for the activations every warp re-reads).
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Both k16 steps of one 32-column chunk for one m16 tile and one n8 tile: w0 = row g, w1 = row g + 8, b = the
// 8 activation columns 8 tq .. 8 tq + 7 of token g (step s takes words 2s, 2s + 1 of each).
__device__ __forceinline__ void mma_chunk(float (&acc)[4], const uint4& w0, const uint4& w1, const uint4& b) {
  mma16816(acc, w0.x, w1.x, w0.y, w1.y, b.x, b.y);
  mma16816(acc, w0.z, w1.z, w0.w, w1.w, b.z, b.w);
}

}  // namespace k3::cuda::mma_bf16
