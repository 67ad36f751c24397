// Flag parsing of the cache dtypes (cache_dtype.h).
#include "k3/core/cache_dtype.h"

#include <string>

#include "k3/core/error.h"

namespace k3 {
namespace {

// The value as the error message quotes it: at most 64 characters, non-printable bytes as '?', so a
// hostile or binary flag value cannot garble the one-line error.
std::string quoted(std::string_view v) {
  std::string out = "'";
  for (std::size_t i = 0; i < v.size() && i < 64; ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    out += (c >= 0x20 && c < 0x7F) ? static_cast<char>(c) : '?';
  }
  if (v.size() > 64) out += "...";
  return out + "'";
}

bool parse_common(std::string_view v, CacheDType* out) {
  if (v == "auto" || v == "float32" || v == "fp32") {
    *out = CacheDType::F32;
  } else if (v == "bf16" || v == "bfloat16") {
    *out = CacheDType::BF16;
  } else {
    return false;
  }
  return true;
}

}  // namespace

CacheDType parse_kv_cache_dtype(std::string_view value) {
  CacheDType t{};
  if (parse_common(value, &t)) return t;
  if (value == "fp8" || value == "fp8_e4m3") return CacheDType::FP8_E4M3;
  throw Error("--kv-cache-dtype: unknown value " + quoted(value) +
              " (accepted: auto, float32, fp32, bf16, bfloat16, fp8, fp8_e4m3)");
}

CacheDType parse_mamba_ssm_cache_dtype(std::string_view value) {
  CacheDType t{};
  if (parse_common(value, &t)) return t;
  throw Error("--mamba-ssm-cache-dtype: unknown value " + quoted(value) +
              " (accepted: auto, float32, fp32, bf16, bfloat16)");
}

}  // namespace k3
