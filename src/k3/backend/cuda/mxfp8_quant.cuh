// MXFP8 on the device: the scale byte and the E4M3 codes of core/mxfp8.h's rule (the host functions define the
// numerics; CudaMxfp8.QuantizeMatchesHost holds these to them bit for bit). For the MoE decode path that multiplies
// MXFP4 weights by MXFP8 activations (--moe-activation-dtype mxfp8): its activations are quantised with these.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "k3/backend/cuda/cache_dtype.cuh"

namespace k3::cuda::mxfp8 {

// The scale byte of a block whose max |x| (NaN ignored, as fmaxf does) is amax: 0 for amax == 0 (and for NaN: a block
// of NaNs only, where fmaxf has nothing else to keep), 254 for inf, else
// floor(log2(amax)) - 8 + 127 clamped to [0, 254] (frexpf's exponent is exact, float subnormals included).
__device__ __forceinline__ uint32_t scale_byte(float amax) {
  if (!(amax > 0.f)) return 0u;
  if (isinf(amax)) return 254u;
  int e2 = 0;
  frexpf(amax, &e2);
  const int e = min(max(e2 - 1 - 8, -127), 127);
  return static_cast<uint32_t>(e + 127);
}

// 2^(127 - s): the factor that brings a block onto E4M3's range (a float for every s in [0, 254]).
__device__ __forceinline__ float inverse_scale(uint32_t s) { return ldexpf(1.0f, 127 - static_cast<int>(s)); }

// x's code under a block's inverse scale: round to nearest even, saturating to +-448, NaN -> 0x7F (the host's
// f32_to_fp8_e4m3). The product by a power of two is exact where it matters (see mxfp8.cpp's code_of).
__device__ __forceinline__ uint8_t code(float x, float inv_scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x * inv_scale, __NV_SATFINITE, __NV_E4M3));
}

// Warp-collective: lane l holds value l of a 32-value block (lanes past a short block hold 0, which changes neither
// the amax nor any code); returns the lane's value rounded to the block's MXFP8 grid, code * 2^(s-127) -- exact in
// float; s = 254 (a block holding inf) overflows to inf as the host does. All 32 lanes must call it.
__device__ __forceinline__ float fake_quant_warp(float v) {
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // fmaxf drops NaN
  const uint32_t s = scale_byte(amax);
  return fp8_e4m3_to_f32_dev(code(v, inverse_scale(s))) * ldexpf(1.0f, static_cast<int>(s) - 127);
}

}  // namespace k3::cuda::mxfp8
