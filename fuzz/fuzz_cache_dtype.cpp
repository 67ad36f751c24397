// Cache dtype flag values (--kv-cache-dtype, --mamba-ssm-cache-dtype): any bytes either name a dtype or
// throw k3::Error; a row of the chosen dtype then round-trips through the CPU row encoder / decoder.
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "k3/backend/cpu/mla_cache_rows.h"
#include "k3/core/cache_dtype.h"
#include "k3/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view v(reinterpret_cast<const char*>(data), size);
  for (auto parse : {k3::parse_kv_cache_dtype, k3::parse_mamba_ssm_cache_dtype}) {
    try {
      const k3::CacheDType dt = parse(v);
      // The input's bytes as floats (NaN, inf, denormals included) through a row of 16 + 4 values.
      float lat[20] = {};
      std::memcpy(lat, data, size < sizeof(lat) ? size : sizeof(lat));
      std::vector<uint8_t> row(static_cast<std::size_t>(k3::mla_row_bytes(dt, 16, 4)));
      float back[20];
      k3::cpu::mla_encode_row(dt, 16, 4, lat, row.data());
      k3::cpu::mla_decode_row(dt, 16, 4, row.data(), back);
    } catch (const k3::Error&) {
    }
  }
  return 0;
}
