// MLA latent rows in the cache dtypes (mla_cache_rows.h).
#include "k3/backend/cpu/mla_cache_rows.h"

#include <array>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "k3/core/error.h"

namespace k3::cpu {

const float* fp8_e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<std::size_t>(c)] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

namespace {

void encode_fp8_row(int kr, int dr, const float* lat, uint8_t* row) {
  // fmax ignores NaN (as CUDA's fmaxf), so the scale comes from the finite values when there are any.
  float amax = 0.f;
  for (int i = 0; i < kr; ++i) amax = std::fmax(amax, std::fabs(lat[i]));
  const float scale = amax == 0.f ? 1.f : amax / kFp8E4M3Max;
  std::memset(row, 0, static_cast<std::size_t>(mla_row_bytes(CacheDType::FP8_E4M3, kr, dr)));  // padding too
  for (int i = 0; i < kr; ++i) row[i] = f32_to_fp8_e4m3(lat[i] / scale);
  auto* pe = reinterpret_cast<uint16_t*>(row + mla_fp8_pe_offset(kr));
  for (int i = 0; i < dr; ++i) pe[i] = f32_to_bf16(lat[kr + i]);
  std::memcpy(row + mla_fp8_scale_offset(kr, dr), &scale, 4);
}

void decode_fp8_row(int kr, int dr, const uint8_t* row, float* out) {
  float scale;
  std::memcpy(&scale, row + mla_fp8_scale_offset(kr, dr), 4);
  const float* lut = fp8_e4m3_table();
  for (int i = 0; i < kr; ++i) out[i] = lut[row[i]] * scale;
  const auto* pe = reinterpret_cast<const uint16_t*>(row + mla_fp8_pe_offset(kr));
  for (int i = 0; i < dr; ++i) out[kr + i] = bf16_to_f32(pe[i]);
}

}  // namespace

void mla_encode_row(CacheDType dtype, int kr, int dr, const float* lat, void* dst) {
  const int n = kr + dr;
  switch (dtype) {
    case CacheDType::F32:
      std::memcpy(dst, lat, static_cast<std::size_t>(n) * 4);
      return;
    case CacheDType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = f32_to_bf16(lat[i]);
      return;
    }
    case CacheDType::FP8_E4M3: return encode_fp8_row(kr, dr, lat, static_cast<uint8_t*>(dst));
  }
  throw Error("mla_encode_row: unknown cache dtype");
}

void mla_decode_row(CacheDType dtype, int kr, int dr, const void* src, float* out) {
  const int n = kr + dr;
  switch (dtype) {
    case CacheDType::F32:
      std::memcpy(out, src, static_cast<std::size_t>(n) * 4);
      return;
    case CacheDType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) out[i] = bf16_to_f32(s[i]);
      return;
    }
    case CacheDType::FP8_E4M3: return decode_fp8_row(kr, dr, static_cast<const uint8_t*>(src), out);
  }
  throw Error("mla_decode_row: unknown cache dtype");
}

void mla_write_rows(CacheDType dtype, int N, int kr, int dr, const float* lat, void* const* rows) {
  for (int t = 0; t < N; ++t) mla_encode_row(dtype, kr, dr, lat + static_cast<std::size_t>(t) * (kr + dr), rows[t]);
}

void mla_gather_rows(CacheDType dtype, int S, int kr, int dr, const void* const* rows, float* out) {
  for (int s = 0; s < S; ++s) mla_decode_row(dtype, kr, dr, rows[s], out + static_cast<std::size_t>(s) * (kr + dr));
}

}  // namespace k3::cpu
