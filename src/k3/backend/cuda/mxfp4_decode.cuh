// Device helpers shared by the MXFP4 kernels (mxfp4_gemv.cu, moe_kernels.cu): E2M1 / E8M0 decode and
// bf16 unpacking. Header-only, __forceinline__, CUDA translation units only.
//
// E2M1 -> fp16 by bit placement: sign to bit 15, (e1 e0 m) to bits 11..9 gives the E2M1 value times
// 2^-14 exactly (e = 0 lands on fp16 subnormals, which is what E2M1 e = 0 means), two at a time as
// half2; the 2^14 is folded into the group scale (e8m0_scale_x2p14).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace k3::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// 2^(s-127) * 2^14 (the fp16 decode's bias); s == 255 is NaN.
__device__ __forceinline__ float e8m0_scale_x2p14(uint32_t s) {
  if (s <= 240u) return __uint_as_float((s + 14u) << 23);
  if (s == 255u) return __uint_as_float(0x7fc00000u);
  return ldexpf(1.0f, static_cast<int>(s) - 113);
}

// The 8 E2M1 values packed in w (element 2i = low nibble of byte i), times 2^-14, as four half2:
// h[0] = (elem 0, elem 4), h[1] = (1, 5), h[2] = (2, 6), h[3] = (3, 7).
__device__ __forceinline__ void e2m1x8_to_half2(uint32_t w, uint32_t h[4]) {
  h[0] = ((w & 0x00080008u) << 12) | ((w & 0x00070007u) << 9);  // low nibbles of bytes 0, 2
  h[1] = ((w & 0x00800080u) << 8) | ((w & 0x00700070u) << 5);   // high nibbles of bytes 0, 2
  h[2] = ((w & 0x08000800u) << 4) | ((w & 0x07000700u) << 1);   // low nibbles of bytes 1, 3
  h[3] = ((w & 0x80008000u)) | ((w & 0x70007000u) >> 3);        // high nibbles of bytes 1, 3
}

// The 8 values as fp32 in element order, times 2^-14 (unscaled: multiply a dot product of them by
// e8m0_scale_x2p14(s) once instead of every value).
__device__ __forceinline__ void e2m1x8_to_float_x2m14(uint32_t w, float out[8]) {
  uint32_t h[4];
  e2m1x8_to_half2(w, h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
    out[i] = f.x;
    out[i + 4] = f.y;
  }
}

// The same 8 values as fp32 in element order, each multiplied by `scale` (pass e8m0_scale_x2p14(s)).
__device__ __forceinline__ void e2m1x8_to_float(uint32_t w, float scale, float out[8]) {
  uint32_t h[4];
  e2m1x8_to_half2(w, h);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h[i]));
    out[i] = f.x * scale;
    out[i + 4] = f.y * scale;
  }
}

// Two bf16 (low half = lower element) to fp32, exactly.
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

}  // namespace k3::cuda
