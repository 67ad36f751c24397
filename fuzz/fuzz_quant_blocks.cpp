// GGUF block formats (quant/gguf_quant.h, the CPU kernels): byte 0 picks one of the 14 formats, the rest
// is up to 3 blocks of it (zero-padded to whole blocks). Any bytes dequantise (quant::dequantize_row and
// the active tier's dequant, dot and gemm) without a crash or an out-of-range table index; the same bytes
// read as floats either quantise (formats k3 writes) or throw k3::Error (non-finite values, f16 overflow,
// formats it only reads).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/core/weight.h"
#include "k3/quant/gguf_quant.h"

namespace {
constexpr k3::WeightFormat kFormats[] = {
    k3::WeightFormat::Q8_0,  k3::WeightFormat::Q4_K,    k3::WeightFormat::Q5_K,   k3::WeightFormat::Q6_K,
    k3::WeightFormat::Q3_K,  k3::WeightFormat::Q2_K,    k3::WeightFormat::IQ4_XS, k3::WeightFormat::IQ3_XXS,
    k3::WeightFormat::IQ3_S, k3::WeightFormat::IQ2_XXS, k3::WeightFormat::IQ2_XS, k3::WeightFormat::IQ2_S,
    k3::WeightFormat::IQ1_S, k3::WeightFormat::IQ1_M};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const k3::WeightFormat f = kFormats[data[0] % (sizeof kFormats / sizeof kFormats[0])];
  const k3::WeightLayout l = k3::weight_layout(f);
  const size_t body = size - 1, bb = static_cast<size_t>(l.block_bytes);
  const int64_t blocks = static_cast<int64_t>(std::min<size_t>(3, (body + bb - 1) / bb));
  if (blocks == 0) return 0;
  std::vector<uint8_t> bytes(static_cast<size_t>(blocks) * bb, 0);
  std::memcpy(bytes.data(), data + 1, std::min(body, bytes.size()));
  const int64_t n = blocks * l.block_elems;
  std::vector<float> y(static_cast<size_t>(n)), x(static_cast<size_t>(2 * n), 1.0f), out(2);
  k3::quant::dequantize_row(f, bytes.data(), n, y.data());
  const k3::WeightMatrix W{f, bytes.data(), nullptr, 1, n};
  k3::cpu::dequant_row(W, 0, y.data());
  k3::cpu::matmul(W, x.data(), 1, out.data());
  k3::cpu::matmul(W, x.data(), 2, out.data());
  // The body's bytes as floats, whole blocks of them.
  const int64_t fn = static_cast<int64_t>(body / 4) / l.block_elems * l.block_elems;
  if (fn > 0) {
    std::vector<float> v(static_cast<size_t>(fn));
    std::memcpy(v.data(), data + 1, static_cast<size_t>(fn) * 4);
    std::vector<uint8_t> q(static_cast<size_t>(k3::row_data_bytes(f, fn)));
    try {
      k3::quant::quantize_row(f, v.data(), fn, nullptr, q.data());
    } catch (const k3::Error&) {
    }
  }
  return 0;
}
