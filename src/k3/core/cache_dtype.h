// Element types of the KV / state cache (issue 13 item 4), named as vLLM's flags name them:
//   --kv-cache-dtype auto|float32|bf16|fp8       MLA latent rows (c_kv | k_pe), docs/cache-dtypes.md
//   --mamba-ssm-cache-dtype auto|float32|bfloat16 the KDA recurrent state S (the conv state stays fp32)
// Host conversions here are the reference the CPU kernels use and the CUDA kernels must match bit for bit
// (backend/cuda/cache_dtype.cuh). Plain C++17: the CUDA sources include it.
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

#include "k3/core/dtype.h"

namespace k3 {

enum class CacheDType : uint8_t {
  F32,       // today's cache
  BF16,      // round to nearest even
  FP8_E4M3,  // OCP e4m3fn (bias 7, max 448, no inf, NaN = S.1111.111), with a per-row fp32 scale (MLA rows)
};

constexpr int cache_dtype_bytes(CacheDType t) {
  switch (t) {
    case CacheDType::F32: return 4;
    case CacheDType::BF16: return 2;
    case CacheDType::FP8_E4M3: return 1;
  }
  return 0;
}

// The canonical spelling (what `k3 info` / `k3 plan` print): "float32", "bfloat16", "fp8_e4m3".
constexpr const char* cache_dtype_name(CacheDType t) {
  switch (t) {
    case CacheDType::F32: return "float32";
    case CacheDType::BF16: return "bfloat16";
    case CacheDType::FP8_E4M3: return "fp8_e4m3";
  }
  return "?";
}

// Flag values. "auto" is F32 (the cache k3 has always had; vLLM's auto = the model dtype, which for k3's
// fp32 activations is fp32). Anything else throws k3::Error naming the flag, the value and the accepted set.
//   --kv-cache-dtype:        auto, float32, fp32, bf16, bfloat16, fp8, fp8_e4m3
//   --mamba-ssm-cache-dtype: auto, float32, fp32, bf16, bfloat16 (no fp8: the state is re-read every token)
CacheDType parse_kv_cache_dtype(std::string_view value);
CacheDType parse_mamba_ssm_cache_dtype(std::string_view value);

// ---------------------------------------------------------------------------------------------------
// FP8 E4M3 (OCP "e4m3fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals m * 2^-9;
// max finite 0x7E = 448; 0x7F / 0xFF are NaN; no infinities.

inline constexpr float kFp8E4M3Max = 448.0f;

inline float fp8_e4m3_to_f32(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xFu, m = c & 0x7u;
  uint32_t bits;
  if (e == 0xFu && m == 0x7u) {
    bits = sign | 0x7FC00000u;  // NaN
  } else if (e == 0) {
    float v = static_cast<float>(m) * (1.0f / 512.0f);  // exact
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else {
    bits = sign | ((e + 120u) << 23) | (m << 20);  // 2^(e-7) (1 + m/8)
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even; |x| beyond the largest finite value saturates to +-448 (infinities too);
// NaN gives 0x7F. The same bits as CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3).
inline uint8_t f32_to_fp8_e4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7F;                        // NaN (canonical, as CUDA)
  if (a >= 0x43E80000u) return static_cast<uint8_t>(sign | 0x7E);  // >= 464 = 448 + half ulp (tie -> even 448)
  if (a < 0x3C800000u) {                                   // below 2^-6: subnormal codes m * 2^-9
    float ax;
    std::memcpy(&ax, &a, 4);
    const float y = ax * 512.0f;  // exact (power of two, no overflow), < 8
    uint32_t i = static_cast<uint32_t>(y);
    const float frac = y - static_cast<float>(i);  // exact
    if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;
    return static_cast<uint8_t>(sign | i);  // i == 8 is the smallest normal, 0x08
  }
  const uint32_t e = (a >> 23) - 120u;  // 1 .. 15
  const uint32_t rest = a & 0xFFFFFu;   // the 20 mantissa bits dropped
  uint32_t r = (e << 3) | ((a >> 20) & 0x7u);
  if (rest > 0x80000u || (rest == 0x80000u && (r & 1u))) ++r;  // never reaches 0x7F: a < 464
  return static_cast<uint8_t>(sign | r);
}

// ---------------------------------------------------------------------------------------------------
// MLA latent rows: one token's [c_kv (kr = kv_lora_rank values) | k_pe (dr = qk_rope_dim values)] of one
// layer.
//   F32:      kr + dr fp32                                   (K3: 576 * 4 = 2304 bytes)
//   BF16:     kr + dr bf16                                   (K3: 576 * 2 = 1152 bytes)
//   FP8_E4M3: kr e4m3 codes of c_kv | dr bf16 of k_pe | one fp32 scale of c_kv   (K3: 512 + 128 + 4 = 644)
//             c_kv[i] = fp8_e4m3_to_f32(code[i]) * scale,  scale = max_i |c_kv_i| / 448 (1 when all are 0)
//             Each part starts 4-byte aligned (padding bytes are zero).
// k_pe stays bf16 in fp8 rows because the attention logits are far more sensitive to it than the output is
// to c_kv (the same choice as FlashMLA's fp8 MLA cache); measurements in docs/cache-dtypes.md.
// Rows of a page follow each other at mla_row_bytes strides (4-byte aligned when the page is).

constexpr int64_t mla_align4(int64_t n) { return (n + 3) / 4 * 4; }
// Byte offsets inside an FP8_E4M3 row.
constexpr int64_t mla_fp8_pe_offset(int64_t kr) { return mla_align4(kr); }
constexpr int64_t mla_fp8_scale_offset(int64_t kr, int64_t dr) { return mla_align4(mla_fp8_pe_offset(kr) + 2 * dr); }

constexpr int64_t mla_row_bytes(CacheDType t, int64_t kr, int64_t dr) {
  switch (t) {
    case CacheDType::F32: return (kr + dr) * 4;
    case CacheDType::BF16: return (kr + dr) * 2;
    case CacheDType::FP8_E4M3: return mla_fp8_scale_offset(kr, dr) + 4;
  }
  return 0;
}

}  // namespace k3
