// Element types of tensors as stored in checkpoints, and scalar conversions.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace k3 {

enum class DType { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2 };

// Bytes per element.
size_t dtype_size(DType t);
// Safetensors spelling ("F32", "BF16", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string; returns false for unknown types.
bool parse_dtype(std::string_view s, DType* out);
inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest-even, NaN preserved.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float f16_to_f32(uint16_t h);

// MXFP4: FP4 E2M1 element values and the E8M0 block scale (model-spec section 4).
inline constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
inline constexpr int kMxfp4Group = 32;
inline float e8m0_to_f32(uint8_t s) {
  // 2^(s-127); s == 255 is NaN in OCP MX, s == 0 is 2^-127 (denormal in fp32).
  if (s == 255) return __builtin_nanf("");
  uint32_t u = s == 0 ? 0x00400000u : static_cast<uint32_t>(s) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace k3
