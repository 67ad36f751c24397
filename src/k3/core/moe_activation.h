// `--moe-activation-dtype`: the precision of the routed experts' activations -- the input row of gate / up and the GLU
// output that down reads, each (token, expert) row on its own, so a token's result does not depend on its batch.
//   F32:   as computed (the default).
//   MXFP8: fake-quantised to MXFP8 along the row (core/mxfp8.h): E4M3 in blocks of 32 with a power-of-two scale, the
//          numerics K3 was trained with.
//   Q8:    fake-quantised to q8 along the row (core/q8_blocks.h): int8 in blocks of 32 with a float scale, the class
//          llama.cpp's quantised-activation products use and the CPU's MXFP4 row-block tier runs at any setting.
#pragma once
#include <cstdint>
#include <string_view>

namespace k3 {

enum class MoeActivationDType : uint8_t { F32, MXFP8, Q8 };

// "float32" / "mxfp8" / "q8".
constexpr const char* moe_activation_dtype_name(MoeActivationDType t) {
  return t == MoeActivationDType::MXFP8 ? "mxfp8" : t == MoeActivationDType::Q8 ? "q8" : "float32";
}
// One of the names above; anything else throws k3::Error naming the flag and the accepted values.
MoeActivationDType parse_moe_activation_dtype(std::string_view value);
// In place over a row of n >= 0 values: what the experts read under t (F32: nothing; the others round each block of
// 32 from the row's start, a short last block on its own).
void fake_quant_moe_row(MoeActivationDType t, float* x, int64_t n);

}  // namespace k3
