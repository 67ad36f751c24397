// Pieces of the bf16 MoE decode GEMVs (moe_gemv.cu): 16-byte loads kept where the code puts them, and
// the 8-column fmaf step.
//
// Why volatile loads: a GEMV lane issues a batch of loads and then multiplies. With plain loads whose use sits in a
// per-chunk `if (column in range)`, NVVM sank each load into its chunk's branch, so a lane issued chunk j + 1's
// loads only after chunk j's multiplies, which wait for chunk j's loads: one to two loads in flight instead of the
// batch (SASS of moe_gemv.cu's gate/up kernel, session 42). volatile asm statements keep their program order and
// are not sunk; the callers clamp addresses into the row so that every load of a batch is unconditional.
#pragma once

#include <cstdint>

#include "k3/backend/cuda/mma_bf16.cuh"

namespace k3::cuda {

// Weights: read once, not kept in L1 (the activations, shared by the block's warps, are): the skinny kernels'
// streaming load (volatile asm, as this header needs).
__device__ __forceinline__ uint4 ld_weights16(const void* p) { return mma_bf16::load_stream(static_cast<const uint4*>(p)); }

// Activations (read-only during the kernel), through L1.
__device__ __forceinline__ float4 ld_acts16(const float* p) {
  float4 v;
  asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// acc + the 8 bf16 weights of w times a then b, fmaf in column order.
__device__ __forceinline__ float fma8_bf16(uint4 w, float4 a, float4 b, float acc) {
  acc = fmaf(__uint_as_float(w.x << 16), a.x, acc);
  acc = fmaf(__uint_as_float(w.x & 0xffff0000u), a.y, acc);
  acc = fmaf(__uint_as_float(w.y << 16), a.z, acc);
  acc = fmaf(__uint_as_float(w.y & 0xffff0000u), a.w, acc);
  acc = fmaf(__uint_as_float(w.z << 16), b.x, acc);
  acc = fmaf(__uint_as_float(w.z & 0xffff0000u), b.y, acc);
  acc = fmaf(__uint_as_float(w.w << 16), b.z, acc);
  acc = fmaf(__uint_as_float(w.w & 0xffff0000u), b.w, acc);
  return acc;
}

}  // namespace k3::cuda
