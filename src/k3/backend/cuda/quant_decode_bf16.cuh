// GGUF blocks to bf16 for the tensor-core tiles (moe_tc_tile.cuh): decode8_bf16<F>(block, g, tables) returns
// elements 8g .. 8g + 7 as 4 packed bf16 pairs (element 2i in the low half of word i).
//
// Why not decode8 (quant_decode.cuh) + a bf16 pack: decode8 reproduces the CPU's fp32 expressions bit for
// bit (separate multiply and subtract with round-to-nearest intrinsics, an int -> float conversion per weight:
// a quarter-rate instruction on Hopper). The tiles round every weight to bf16 anyway, so here the common
// formats take a cheaper route with the same values up to fp32 rounding (one rounding of d * q - m instead of
// two): each quant byte becomes a float by the exponent trick (PRMT puts it under 0x4B000000, the float
// 2^23 + q; one exact FADD removes 2^23 and the format's offset), then one FMA / FMUL applies the scales.
// ~4 instructions per weight instead of ~12 (the Kimi-Linear-shape prefill tiles were bound by the decode:
// docs/perf/cuda.md, session 18). Q4_K, Q5_K, Q6_K and Q8_0 (llama-quantize's K-quant presets put most bytes
// there) take the fast route; every other format decodes exactly and is rounded.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/quant_decode.cuh"

namespace k3::cuda::qdev {

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Byte j of w (0..255) as the float 2^23 + byte.
template <int J>
__device__ __forceinline__ float magic_byte(uint32_t w) {
  return __uint_as_float(__byte_perm(w, 0x4B000000u, J | (4 << 4) | (4 << 8) | (7 << 12)));
}

// 8 unsigned bytes (two words, byte j of the pair = element j) to s * (byte - off) + c, packed bf16.
// off folds into the exact FADD (2^23 + off is exact for off < 2^23).
__device__ __forceinline__ uint4 affine8(uint32_t w0, uint32_t w1, float off, float s, float c) {
  const float m = 8388608.f + off;
  float f[8];
  f[0] = magic_byte<0>(w0), f[1] = magic_byte<1>(w0), f[2] = magic_byte<2>(w0), f[3] = magic_byte<3>(w0);
  f[4] = magic_byte<0>(w1), f[5] = magic_byte<1>(w1), f[6] = magic_byte<2>(w1), f[7] = magic_byte<3>(w1);
#pragma unroll
  for (int j = 0; j < 8; ++j) f[j] = fmaf(s, f[j] - m, c);
  return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
}

__device__ __forceinline__ void words8(const uint8_t* p, uint32_t& w0, uint32_t& w1) {
  const uint64_t v = bytes8(p);
  w0 = static_cast<uint32_t>(v);
  w1 = static_cast<uint32_t>(v >> 32);
}

// Q4_K / Q5_K (quant_decode.cuh q45_k): d * sc * q - dmin * m, q the nibble (and fifth bit).
template <bool kFifth>
__device__ __forceinline__ uint4 q45_k_bf16(const uint8_t* b, int g) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const int sb = g / 4;
  int sc, m;
  k4_scale_min(sb, b + 4, sc, m);
  const int l0 = 8 * (g % 4), shift = 4 * (sb & 1);
  uint32_t w0, w1;
  words8(b + (kFifth ? 48 : 16) + 32 * (sb / 2) + l0, w0, w1);
  w0 = (w0 >> shift) & 0x0F0F0F0Fu;
  w1 = (w1 >> shift) & 0x0F0F0F0Fu;
  if constexpr (kFifth) {
    uint32_t h0, h1;
    words8(b + 16 + l0, h0, h1);
    w0 |= ((h0 >> sb) & 0x01010101u) << 4;
    w1 |= ((h1 >> sb) & 0x01010101u) << 4;
  }
  return affine8(w0, w1, 0.f, d * static_cast<float>(sc), -(dmin * static_cast<float>(m)));
}

// Q6_K (q6_k): d * sc * (q - 32), q = 4 low bits | 2 high bits << 4.
__device__ __forceinline__ uint4 q6_k_bf16(const uint8_t* b, int g) {
  const float d = f16_at(b + 208);
  const int h = g / 16, k = (g % 16) / 4, l0 = 8 * (g % 4);
  uint32_t l0w, l1w, h0w, h1w;
  words8(b + 64 * h + 32 * (k & 1) + l0, l0w, l1w);
  words8(b + 128 + 32 * h + l0, h0w, h1w);
  const int sc = static_cast<int8_t>(b[192 + 8 * h + l0 / 16 + 2 * k]);
  const int lshift = 4 * (k >> 1), hshift = 2 * k;
  const uint32_t w0 = ((l0w >> lshift) & 0x0F0F0F0Fu) | (((h0w >> hshift) & 0x03030303u) << 4);
  const uint32_t w1 = ((l1w >> lshift) & 0x0F0F0F0Fu) | (((h1w >> hshift) & 0x03030303u) << 4);
  return affine8(w0, w1, 32.f, d * static_cast<float>(sc), 0.f);
}

// Q8_0 (q8_0): d * q, q int8: byte ^ 0x80 = q + 128.
__device__ __forceinline__ uint4 q8_0_bf16(const uint8_t* b, int g) {
  const float d = f16_at(b);
  uint32_t w0, w1;
  words8(b + 2 + 8 * g, w0, w1);
  return affine8(w0 ^ 0x80808080u, w1 ^ 0x80808080u, 128.f, d, 0.f);
}

template <WeightFormat F>
__device__ __forceinline__ uint4 decode8_bf16(const uint8_t* b, int g, const IqTables& T) {
  if constexpr (F == WeightFormat::Q4_K) {
    return q45_k_bf16<false>(b, g);
  } else if constexpr (F == WeightFormat::Q5_K) {
    return q45_k_bf16<true>(b, g);
  } else if constexpr (F == WeightFormat::Q6_K) {
    return q6_k_bf16(b, g);
  } else if constexpr (F == WeightFormat::Q8_0) {
    return q8_0_bf16(b, g);
  } else {
    float f[8];
    decode8<F>(b, g, T, f);
    return make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]), pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
  }
}

}  // namespace k3::cuda::qdev
