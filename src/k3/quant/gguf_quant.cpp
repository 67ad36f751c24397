// Dispatch of gguf_quant.h: validation, then the per-format block packers of gguf_pack.cpp.
#include "k3/quant/gguf_quant.h"

#include <cmath>
#include <string>

#include "k3/core/error.h"
#include "k3/quant/block_decode.h"
#include "k3/quant/gguf_pack.h"

namespace k3::quant {

bool is_gguf_block_format(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q8_0:
    case WeightFormat::Q4_K:
    case WeightFormat::Q5_K:
    case WeightFormat::Q6_K:
    case WeightFormat::Q3_K:
    case WeightFormat::Q2_K:
    case WeightFormat::IQ4_XS:
    case WeightFormat::IQ3_XXS:
    case WeightFormat::IQ3_S:
    case WeightFormat::IQ2_XXS:
    case WeightFormat::IQ2_XS:
    case WeightFormat::IQ2_S:
    case WeightFormat::IQ1_S:
    case WeightFormat::IQ1_M:
    case WeightFormat::Q4_0:
    case WeightFormat::Q4_1:
    case WeightFormat::Q5_0:
    case WeightFormat::Q5_1:
    case WeightFormat::IQ4_NL: return true;
    default: return false;
  }
}

namespace {

void check_row(const char* what, WeightFormat f, int64_t n) {
  if (!is_gguf_block_format(f)) throw Error(std::string(what) + ": " + weight_format_name(f) + " is not a GGUF block format");
  const int64_t e = weight_layout(f).block_elems;
  if (n < 0 || n % e != 0)
    throw Error(std::string(what) + ": a " + weight_format_name(f) + " row needs a multiple of " + std::to_string(e) +
                " values, got " + std::to_string(n));
}

template <WeightFormat F>
void dequant_blocks(const uint8_t* src, int64_t n, float* dst) {
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes;
  for (int64_t b = 0; b < n / E; ++b) decode_block<F>(src + b * B, dst + b * E);
}

}  // namespace

void dequantize_row(WeightFormat f, const uint8_t* src, int64_t n, float* dst) {
  check_row("dequantize_row", f, n);
  switch (f) {
    case WeightFormat::Q8_0: return dequant_blocks<WeightFormat::Q8_0>(src, n, dst);
    case WeightFormat::Q4_K: return dequant_blocks<WeightFormat::Q4_K>(src, n, dst);
    case WeightFormat::Q5_K: return dequant_blocks<WeightFormat::Q5_K>(src, n, dst);
    case WeightFormat::Q6_K: return dequant_blocks<WeightFormat::Q6_K>(src, n, dst);
    case WeightFormat::Q3_K: return dequant_blocks<WeightFormat::Q3_K>(src, n, dst);
    case WeightFormat::Q2_K: return dequant_blocks<WeightFormat::Q2_K>(src, n, dst);
    case WeightFormat::IQ4_XS: return dequant_blocks<WeightFormat::IQ4_XS>(src, n, dst);
    case WeightFormat::IQ3_XXS: return dequant_blocks<WeightFormat::IQ3_XXS>(src, n, dst);
    case WeightFormat::IQ3_S: return dequant_blocks<WeightFormat::IQ3_S>(src, n, dst);
    case WeightFormat::IQ2_XXS: return dequant_blocks<WeightFormat::IQ2_XXS>(src, n, dst);
    case WeightFormat::IQ2_XS: return dequant_blocks<WeightFormat::IQ2_XS>(src, n, dst);
    case WeightFormat::IQ2_S: return dequant_blocks<WeightFormat::IQ2_S>(src, n, dst);
    case WeightFormat::IQ1_S: return dequant_blocks<WeightFormat::IQ1_S>(src, n, dst);
    case WeightFormat::IQ1_M: return dequant_blocks<WeightFormat::IQ1_M>(src, n, dst);
    case WeightFormat::Q4_0: return dequant_blocks<WeightFormat::Q4_0>(src, n, dst);
    case WeightFormat::Q4_1: return dequant_blocks<WeightFormat::Q4_1>(src, n, dst);
    case WeightFormat::Q5_0: return dequant_blocks<WeightFormat::Q5_0>(src, n, dst);
    case WeightFormat::Q5_1: return dequant_blocks<WeightFormat::Q5_1>(src, n, dst);
    case WeightFormat::IQ4_NL: return dequant_blocks<WeightFormat::IQ4_NL>(src, n, dst);
    default: return;
  }
}

bool can_quantize(WeightFormat f) { return block_packer(f) != nullptr; }

bool importance_recommended(WeightFormat f) {
  return f == WeightFormat::IQ2_XXS || f == WeightFormat::IQ2_XS || f == WeightFormat::IQ1_S || f == WeightFormat::IQ1_M;
}

void quantize_row(WeightFormat f, const float* x, int64_t n, const float* importance, uint8_t* dst) {
  check_row("quantize_row", f, n);
  if (!block_packer(f)) throw Error(std::string("quantize_row: k3 cannot write ") + weight_format_name(f) + " yet (it reads it)");
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) throw Error("quantize_row: value " + std::to_string(i) + " is not finite");
    if (importance && !(std::isfinite(importance[i]) && importance[i] > 0))
      throw Error("quantize_row: importance " + std::to_string(i) + " is not a finite positive number");
  }
  const PackBlock pack = block_packer(f);
  const WeightLayout l = weight_layout(f);
  for (int64_t b = 0; b < n / l.block_elems; ++b)
    pack(x + b * l.block_elems, importance ? importance + b * l.block_elems : nullptr, dst + b * l.block_bytes);
}

}  // namespace k3::quant
