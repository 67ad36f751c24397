#include "k3/core/dtype.h"

#include <cmath>

namespace k3 {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfo[] = {
    {DType::F64, "F64", 8},         {DType::F32, "F32", 4},       {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},       {DType::I64, "I64", 8},       {DType::I32, "I32", 4},
    {DType::I16, "I16", 2},         {DType::I8, "I8", 1},         {DType::U8, "U8", 1},
    {DType::BOOL, "BOOL", 1},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
};
}  // namespace

size_t dtype_size(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i.size;
  return 0;
}

std::string_view dtype_name(DType t) {
  for (const auto& i : kInfo)
    if (i.type == t) return i.name;
  return "?";
}

bool parse_dtype(std::string_view s, DType* out) {
  for (const auto& i : kInfo)
    if (i.name == s) {
      *out = i.type;
      return true;
    }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31)
    v = man ? __builtin_nanf("") : __builtin_inff();
  else
    v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

}  // namespace k3
