// Device-side conversions of the cache dtypes (core/cache_dtype.h): the same bits as the host functions
// there (bf16 round to nearest even with the same NaN handling; fp8 e4m3 via the SATFINITE cvt, which the
// host f32_to_fp8_e4m3 matches on every float), and row loaders for MLA latent rows that the attention
// kernels include. Layouts: core/cache_dtype.h and docs/cache-dtypes.md.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "k3/core/cache_dtype.h"

namespace k3::cuda {

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN keeps its payload's top bits and is made quiet (host k3::f32_to_bf16).
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ uint8_t f32_to_fp8_e4m3_bits(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// Four e4m3 codes (little-endian bytes of `w`: element i in byte i) -> four floats, exactly.
__device__ __forceinline__ float4 fp8x4_e4m3_to_f32(uint32_t w) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 a = __half22float2(__half2(lo)), b = __half22float2(__half2(hi));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float fp8_e4m3_to_f32_dev(uint8_t c) { return fp8x4_e4m3_to_f32(c).x; }

// ---------------------------------------------------------------------------------------------------
// MLA latent rows. A row of dtype DT starts at `row` (4-byte aligned); kr and dr multiples of 4.
// mla_row_load4 gives the four values at i .. i+3 (i a multiple of 4, all four in c_kv or all in k_pe);
// for FP8 the c_kv values come unscaled (multiply by mla_row_ckv_scale once per dot product / weight).

template <CacheDType DT>
__device__ __forceinline__ float mla_row_ckv_scale(const uint8_t* row, int kr, int dr) {
  if constexpr (DT == CacheDType::FP8_E4M3)
    return *reinterpret_cast<const float*>(row + mla_fp8_scale_offset(kr, dr));
  else
    return 1.f;
}

template <CacheDType DT>
__device__ __forceinline__ float4 mla_row_load4(const uint8_t* row, int kr, int i) {
  if constexpr (DT == CacheDType::F32) {
    return *reinterpret_cast<const float4*>(row + static_cast<size_t>(i) * 4);  // needs 16-byte rows
  } else if constexpr (DT == CacheDType::BF16) {
    const uint2 w = *reinterpret_cast<const uint2*>(row + static_cast<size_t>(i) * 2);  // needs 8-byte rows
    return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.y << 16),
                       __uint_as_float(w.y & 0xffff0000u));
  } else {
    if (i < kr) return fp8x4_e4m3_to_f32(*reinterpret_cast<const uint32_t*>(row + i));
    const uint16_t* pe = reinterpret_cast<const uint16_t*>(row + mla_fp8_pe_offset(kr)) + (i - kr);
    const uint32_t w0 = *reinterpret_cast<const uint32_t*>(pe), w1 = *reinterpret_cast<const uint32_t*>(pe + 2);
    return make_float4(__uint_as_float(w0 << 16), __uint_as_float(w0 & 0xffff0000u), __uint_as_float(w1 << 16),
                       __uint_as_float(w1 & 0xffff0000u));
  }
}

// One value (any i < kr + dr), scale applied: the value mla_decode_row gives on the host.
template <CacheDType DT>
__device__ __forceinline__ float mla_row_value(const uint8_t* row, int kr, int dr, int i) {
  if constexpr (DT == CacheDType::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (DT == CacheDType::BF16) {
    return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  } else {
    if (i < kr) return fp8_e4m3_to_f32_dev(row[i]) * mla_row_ckv_scale<DT>(row, kr, dr);
    return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(row + mla_fp8_pe_offset(kr))[i - kr]);
  }
}

}  // namespace k3::cuda
