// `--moe-activation-dtype` (moe_activation.h): the names and the per-row rounding.
#include "k3/core/moe_activation.h"

#include <string>

#include "k3/core/error.h"
#include "k3/core/mxfp8.h"
#include "k3/core/q8_blocks.h"

namespace k3 {

MoeActivationDType parse_moe_activation_dtype(std::string_view value) {
  if (value == "float32") return MoeActivationDType::F32;
  if (value == "mxfp8") return MoeActivationDType::MXFP8;
  if (value == "q8") return MoeActivationDType::Q8;
  std::string shown(value.substr(0, 64));
  for (char& c : shown)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7F) c = '?';
  throw Error("--moe-activation-dtype: unknown value '" + shown + "' (accepted: float32, mxfp8, q8)");
}

void fake_quant_moe_row(MoeActivationDType t, float* x, int64_t n) {
  if (t == MoeActivationDType::MXFP8) fake_quant_mxfp8_row(x, n);
  if (t == MoeActivationDType::Q8) fake_quant_q8_row(x, n);
}

}  // namespace k3
