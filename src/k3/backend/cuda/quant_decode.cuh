// Device decoding of GGUF's block formats: decode8<F>(block, g, tables, w) writes elements 8g .. 8g + 7 of
// one block (the block's own scales applied) into w. Every value is the fp32 expression of the CPU's
// quant/block_decode.h (and llama.cpp's dequantize_row_*) evaluated in the same order with round-to-
// nearest intrinsics (__fmul_rn, __fadd_rn, __fsub_rn: nvcc may not fuse them into an fma), so the decoded
// weights are bit for bit the CPU's dequant_row (tests/cuda/test_quant_kernels.cpp checks every format).
// A group of 8 never straddles two scales of any format, so each call reads its scales once.
//
// Block layouts: quant/block_decode.h and block_decode_iq.h. Multi-byte fields sit at even offsets in
// blocks of even size, so 16-bit loads are aligned whenever the matrix is (the arena's 256 bytes); the
// 32-bit fields of IQ2_XXS / IQ3_XXS are read as two halves.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "k3/backend/cuda/quant_tables.h"
#include "k3/core/format_dispatch.h"
#include "k3/core/weight_format.h"

namespace k3::cuda::qdev {

__device__ __forceinline__ unsigned u16_at(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
__device__ __forceinline__ uint32_t u32_at(const uint8_t* p) { return u16_at(p) | (u16_at(p + 2) << 16); }
__device__ __forceinline__ float f16_bits(unsigned h) { return __half2float(__ushort_as_half(static_cast<unsigned short>(h))); }
__device__ __forceinline__ float f16_at(const uint8_t* p) { return f16_bits(u16_at(p)); }
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }

// 8 consecutive bytes (byte j in bits 8j..8j+7) in the widest loads their address allows: one 8-byte load
// for Q4_K / Q5_K / IQ4_XS (blocks of a multiple of 16 bytes, fields at multiples of 8), 16-bit loads for
// Q8_0 / Q6_K / Q3_K (blocks of an even size) -- fewer load instructions than 8 byte loads.
__device__ __forceinline__ uint64_t bytes8(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if ((a & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
  if ((a & 3) == 0) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
    return q[0] | (static_cast<uint64_t>(q[1]) << 32);
  }
  if ((a & 1) == 0) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
    return q[0] | (static_cast<uint64_t>(q[1]) << 16) | (static_cast<uint64_t>(q[2]) << 32) | (static_cast<uint64_t>(q[3]) << 48);
  }
  uint64_t v = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) v |= static_cast<uint64_t>(p[j]) << (8 * j);
  return v;
}
__device__ __forceinline__ unsigned byte_of(uint64_t v, int j) { return static_cast<unsigned>(v >> (8 * j)) & 0xFFu; }

// Q4_K / Q5_K's 6-bit scale and min of sub-block j (quant::k4_scale_min).
__device__ __forceinline__ void k4_scale_min(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q3_K's scale i of 16 (quant::q3_k_scale).
__device__ __forceinline__ int q3_k_scale(const uint8_t* s, int i) {
  const int lo = i < 8 ? s[i] & 0xF : s[i - 8] >> 4;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (lo | (hi << 4)) - 32;
}

// n weights: byte j of grid times db, negated (sign bit flipped, as quant::put_signed) where bit j of signs is set.
template <int N, typename G>
__device__ __forceinline__ void put_signed(float* w, G grid, unsigned signs, float db) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float v = mul(db, static_cast<float>(static_cast<unsigned>(grid >> (8 * j)) & 0xFFu));
    w[j] = __uint_as_float(__float_as_uint(v) ^ (((signs >> j) & 1u) << 31));
  }
}

// IQ1: dl * (g_j + delta), g_j the int8 bytes of an iq1s_grid entry (quant::put_iq1).
__device__ __forceinline__ void put_iq1(float* w, uint64_t grid, float dl, float delta) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    w[j] = mul(dl, __fadd_rn(static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(grid >> (8 * j)))), delta));
}

__device__ __forceinline__ void q8_0(const uint8_t* b, int g, float* w) {
  const float d = f16_at(b);
  const uint64_t q = bytes8(b + 2 + 8 * g);
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = mul(static_cast<float>(static_cast<int8_t>(byte_of(q, j))), d);
}

// Q4_K (kFifth false) and Q5_K: element 8g + j lies in sub-block sb = g / 4 (32 each); the quant bytes of
// sub-blocks 2c and 2c + 1 are shared (low / high nibble).
template <bool kFifth>
__device__ __forceinline__ void q45_k(const uint8_t* b, int g, float* w) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  const int sb = g / 4;
  int sc, m;
  k4_scale_min(sb, b + 4, sc, m);
  const float dl = mul(d, static_cast<float>(sc)), ml = mul(dmin, static_cast<float>(m));
  const int l0 = 8 * (g % 4), shift = 4 * (sb & 1);
  const uint64_t q = bytes8(b + (kFifth ? 48 : 16) + 32 * (sb / 2) + l0);
  const uint64_t qh = kFifth ? bytes8(b + 16 + l0) : 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    int v = (byte_of(q, j) >> shift) & 0xF;
    if (kFifth) v |= ((byte_of(qh, j) >> sb) & 1) << 4;
    w[j] = __fsub_rn(mul(dl, static_cast<float>(v)), ml);
  }
}

// Q6_K: half h = g / 16 (128 elements), quarter k (32) of it, l0 = offset within the quarter.
__device__ __forceinline__ void q6_k(const uint8_t* b, int g, float* w) {
  const float d = f16_at(b + 208);
  const int h = g / 16, k = (g % 16) / 4, l0 = 8 * (g % 4);
  const uint64_t ql = bytes8(b + 64 * h + 32 * (k & 1) + l0);
  const uint64_t qh = bytes8(b + 128 + 32 * h + l0);
  const int sc = static_cast<int8_t>(b[192 + 8 * h + l0 / 16 + 2 * k]);
  const float dsc = mul(d, static_cast<float>(sc));
  const int lshift = 4 * (k >> 1), hshift = 2 * k;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int q = ((byte_of(ql, j) >> lshift) & 0xF) | (((byte_of(qh, j) >> hshift) & 3) << 4);
    w[j] = mul(dsc, static_cast<float>(q - 32));
  }
}

// Q3_K / Q2_K: half (128), shift s4 (which bit pair, 32 elements each), 16-element scale is = g / 2.
__device__ __forceinline__ void q3_k(const uint8_t* b, int g, float* w) {
  const float d = f16_at(b + 108);
  const int half = g / 16, s4 = (g % 16) / 4, i0 = 8 * (g % 4), hbit = 4 * half + s4;
  const float dl = mul(d, static_cast<float>(q3_k_scale(b + 96, g / 2)));
  const uint64_t q = bytes8(b + 32 + 32 * half + i0);
  const uint64_t hm = bytes8(b + i0);
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int v = static_cast<int>((byte_of(q, j) >> (2 * s4)) & 3) - (((byte_of(hm, j) >> hbit) & 1) ? 0 : 4);
    w[j] = mul(dl, static_cast<float>(v));
  }
}

__device__ __forceinline__ void q2_k(const uint8_t* b, int g, float* w) {
  const float d = f16_at(b + 80), dmin = f16_at(b + 82);
  const int half = g / 16, s4 = (g % 16) / 4, i0 = 8 * (g % 4);
  const unsigned sc = b[g / 2];
  const float dl = mul(d, static_cast<float>(sc & 0xF)), ml = mul(dmin, static_cast<float>(sc >> 4));
  const uint64_t q = bytes8(b + 16 + 32 * half + i0);
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = __fsub_rn(mul(dl, static_cast<float>((byte_of(q, j) >> (2 * s4)) & 3)), ml);
}

__device__ __forceinline__ void iq4_xs(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const unsigned scales_h = u16_at(b + 2);
  const int ib = g / 4, p0 = 8 * (g % 4);
  const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
  const float dl = mul(d, static_cast<float>(ls - 32));
  const uint64_t q = bytes8(b + 8 + 16 * ib + (p0 % 16));
  const int shift = p0 >= 16 ? 4 : 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = mul(dl, static_cast<float>(__ldg(T.iq4nl + ((byte_of(q, j) >> shift) & 0xF))));
}

// The 32-element formats (quant::decode_q4_5): group g < 4; the low nibble of qs[j] is element j, the high
// one element j + 16, so groups 0-1 read the low nibbles of qs[8g ..], groups 2-3 the high ones of
// qs[8(g - 2) ..]. `kMin`: Q4_1 / Q5_1 (x = q d + m; q d is exact, so only the addition rounds, as on the
// CPU); else x = (q - offset) d. `hoff`: the byte offset of Q5's fifth-bit word (0: none).
template <int kQs, int kHbits, int kOffset, bool kMin>
__device__ __forceinline__ void q4_5(const uint8_t* b, int g, float* w) {
  const float d = f16_at(b);
  const int j0 = 8 * (g & 1), shift = g >= 2 ? 4 : 0;
  const uint64_t q = bytes8(b + kQs + j0);
  const uint32_t hb = kHbits ? (static_cast<uint32_t>(u16_at(b + kHbits)) | (static_cast<uint32_t>(u16_at(b + kHbits + 2)) << 16)) : 0u;
  const int e0 = 8 * g;  // the first element of the group, for its fifth bits
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int v = static_cast<int>(((byte_of(q, j) >> shift) & 0xF) | (((hb >> (e0 + j)) & 1u) << 4)) - kOffset;
    w[j] = mul(static_cast<float>(v), d);
    if (kMin) w[j] = __fadd_rn(w[j], f16_at(b + 2));
  }
}

__device__ __forceinline__ void iq4_nl(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const uint64_t q = bytes8(b + 2 + 8 * (g & 1));
  const int shift = g >= 2 ? 4 : 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) w[j] = mul(d, static_cast<float>(__ldg(T.iq4nl + ((byte_of(q, j) >> shift) & 0xF))));
}

// The codebook i-quants: group g = sub-block ib = g / 4, group l = g % 4 within it.
__device__ __forceinline__ void iq2_xxs(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const int ib = g / 4, l = g % 4;
  const uint8_t* gr = b + 2 + 8 * ib;
  const uint32_t aux = u32_at(gr + 4);
  const float db = mul(mul(d, __fadd_rn(0.5f, static_cast<float>(aux >> 28))), 0.25f);
  put_signed<8>(w, __ldg(T.iq2xxs + gr[l]), __ldg(T.signs + ((aux >> (7 * l)) & 127)), db);
}

__device__ __forceinline__ float iq2_db(float d, unsigned sc, int l) {
  return mul(mul(d, __fadd_rn(0.5f, static_cast<float>(l < 2 ? sc & 0xF : sc >> 4))), 0.25f);
}

__device__ __forceinline__ void iq2_xs(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const int ib = g / 4, l = g % 4;
  const unsigned q = u16_at(b + 2 + 2 * (4 * ib + l));
  put_signed<8>(w, __ldg(T.iq2xs + (q & 511)), __ldg(T.signs + (q >> 9)), iq2_db(d, b[66 + ib], l));
}

__device__ __forceinline__ void iq2_s(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const int ib = g / 4, l = g % 4;
  const unsigned idx = b[2 + 4 * ib + l] | (((b[66 + ib] >> (2 * l)) & 3) << 8);
  put_signed<8>(w, __ldg(T.iq2s + idx), b[34 + 4 * ib + l], iq2_db(d, b[74 + ib], l));
}

__device__ __forceinline__ void iq3_xxs(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const int ib = g / 4, l = g % 4;
  const uint8_t* q = b + 2 + 8 * ib;
  const uint32_t aux = u32_at(b + 66 + 4 * ib);
  const float db = mul(mul(d, __fadd_rn(0.5f, static_cast<float>(aux >> 28))), 0.5f);
  const unsigned signs = __ldg(T.signs + ((aux >> (7 * l)) & 127));
  put_signed<4>(w, __ldg(T.iq3xxs + q[2 * l]), signs, db);
  put_signed<4>(w + 4, __ldg(T.iq3xxs + q[2 * l + 1]), signs >> 4, db);
}

__device__ __forceinline__ void iq3_s(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const int ib = g / 4, l = g % 4;
  const uint8_t* q = b + 2 + 8 * ib;
  const unsigned qh = b[66 + ib], signs = b[74 + 4 * ib + l];
  const float db = mul(d, static_cast<float>(1 + 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 0xF)));
  put_signed<4>(w, __ldg(T.iq3s + (q[2 * l] | (((qh >> (2 * l)) & 1) << 8))), signs, db);
  put_signed<4>(w + 4, __ldg(T.iq3s + (q[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8))), signs >> 4, db);
}

// +-1/8 by a sign bit (quant::iq1_delta: the sign bit set on 0.125f).
__device__ __forceinline__ float iq1_delta(unsigned negative) { return __uint_as_float(__float_as_uint(0.125f) | (negative << 31)); }

__device__ __forceinline__ void iq1_s(const uint8_t* b, int g, const IqTables& T, float* w) {
  const float d = f16_at(b);
  const int ib = g / 4, l = g % 4;
  const unsigned qh = u16_at(b + 34 + 2 * ib);
  const float dl = mul(d, static_cast<float>(2 * ((qh >> 12) & 7) + 1));
  put_iq1(w, __ldg(T.iq1s + (b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8))), dl, iq1_delta((qh >> 15) & 1));
}

__device__ __forceinline__ void iq1_m(const uint8_t* b, int g, const IqTables& T, float* w) {
  const unsigned s0 = u16_at(b + 48), s1 = u16_at(b + 50), s2 = u16_at(b + 52), s3 = u16_at(b + 54);
  const float d = f16_bits((s0 >> 12) | ((s1 >> 8) & 0x00F0) | ((s2 >> 4) & 0x0F00) | (s3 & 0xF000));
  const int ib = g / 4, l = g % 4;
  const unsigned sc = u16_at(b + 48 + 2 * (ib / 2));
  const float dl = mul(d, static_cast<float>(2 * ((sc >> (6 * (ib % 2) + 3 * (l / 2))) & 7) + 1));
  const unsigned qh = b[32 + 2 * ib + l / 2];
  const unsigned hi = l % 2 == 0 ? qh & 7 : (qh >> 4) & 7;
  const unsigned neg = (qh >> (l % 2 == 0 ? 3 : 7)) & 1;
  put_iq1(w, __ldg(T.iq1s + (b[4 * ib + l] | (hi << 8))), dl, iq1_delta(neg));
}

// 8 activations at p: two 16-byte loads when `aligned` (p 16-byte aligned), else 8 scalar loads (a view at
// an odd offset; a uniform branch).
__device__ __forceinline__ void load_x8(const float* __restrict__ p, bool aligned, float* v) {
  if (aligned) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(p)), b = __ldg(reinterpret_cast<const float4*>(p + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __ldg(p + j);
  }
}

// Elements 8g .. 8g + 7 of the block at b (g < weight_layout(F).block_elems / 8).
template <WeightFormat F>
__device__ __forceinline__ void decode8(const uint8_t* b, int g, const IqTables& T, float* w) {
  if constexpr (F == WeightFormat::Q8_0) q8_0(b, g, w);
  else if constexpr (F == WeightFormat::Q4_K) q45_k<false>(b, g, w);
  else if constexpr (F == WeightFormat::Q5_K) q45_k<true>(b, g, w);
  else if constexpr (F == WeightFormat::Q6_K) q6_k(b, g, w);
  else if constexpr (F == WeightFormat::Q3_K) q3_k(b, g, w);
  else if constexpr (F == WeightFormat::Q2_K) q2_k(b, g, w);
  else if constexpr (F == WeightFormat::IQ4_XS) iq4_xs(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ3_XXS) iq3_xxs(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ3_S) iq3_s(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ2_XXS) iq2_xxs(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ2_XS) iq2_xs(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ2_S) iq2_s(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ1_S) iq1_s(b, g, T, w);
  else if constexpr (F == WeightFormat::IQ1_M) iq1_m(b, g, T, w);
  else if constexpr (F == WeightFormat::Q4_0) q4_5<2, 0, 8, false>(b, g, w);
  else if constexpr (F == WeightFormat::Q4_1) q4_5<4, 0, 0, true>(b, g, w);
  else if constexpr (F == WeightFormat::Q5_0) q4_5<6, 2, 16, false>(b, g, w);
  else if constexpr (F == WeightFormat::Q5_1) q4_5<8, 4, 0, true>(b, g, w);
  else if constexpr (F == WeightFormat::IQ4_NL) iq4_nl(b, g, T, w);
}

}  // namespace k3::cuda::qdev

namespace k3::cuda {

// Calls fn(std::integral_constant<WeightFormat, F>{}) for the GGUF block format f (host code: the kernel
// launchers' one switch, core/format_dispatch.h); cudaErrorInvalidValue for any other format.
template <typename Fn>
cudaError_t with_gguf_format(WeightFormat f, Fn&& fn) {
  return with_gguf_block_format(f, std::forward<Fn>(fn), cudaErrorInvalidValue);
}

}  // namespace k3::cuda
