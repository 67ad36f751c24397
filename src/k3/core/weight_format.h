// Weight storage formats: the one enum every loader and backend dispatches on, and the layout that says
// how a format stores a matrix. Adding a format (GGUF's Q8_0, Q4_K, IQ2_XXS, ...) is one enum case here,
// one layout row below, one kernel per backend and its tests (docs/architecture.md, "How to add a weight
// format"). Plain C++17 (no <string>): the CUDA sources include it.
#pragma once
#include <cstdint>

namespace k3 {

enum class WeightFormat : uint8_t {
  F32,
  F16,
  BF16,
  MXFP4,  // OCP MX FP4: E2M1 nibbles (element 2i = low nibble of byte i) + one E8M0 scale per 32 (model-spec 4)
  // ggml's MXFP4 block (GGUF type 39): {uint8 e8m0; uint8 qs[16]}, element j = low nibble of qs[j], element
  // j + 16 = high nibble: the same values as MXFP4, the scale inside the block (docs/gguf.md).
  MXFP4_GGML,
  // GGUF's block formats (ggml's byte layouts, scales inside each block; docs/quantization.md):
  Q8_0,    // 32 int8 + one f16 scale
  Q4_K,    // 256: f16 d, dmin, 8 x (6-bit scale, 6-bit min) in 12 bytes, 4-bit quants
  Q5_K,    // Q4_K + a fifth bit per weight
  Q6_K,    // 256: 16 int8 scales, 6-bit quants (4 low + 2 high bits), f16 d
  Q3_K,    // 256: 16 6-bit scales, 3-bit quants (2 low bits + a high-bit mask), f16 d
  Q2_K,    // 256: 16 x (4-bit scale, 4-bit min), 2-bit quants, f16 d, dmin
  IQ4_XS,  // 256: f16 d, 8 6-bit scales, 4-bit indices into the non-linear IQ4_NL codebook
  // GGUF's codebook i-quants (256: groups of 8 or 4 weights as indices into lattice codebooks + signs):
  IQ3_XXS,
  IQ3_S,
  IQ2_XXS,
  IQ2_XS,
  IQ2_S,
  IQ1_S,
  IQ1_M,
  // ggml's 32-element formats: what llama-quantize falls back to for rows that are not whole 256-blocks
  // (and the older Q4_0 / Q5_0 files): read, and written by `k3 quantize` (its fallbacks too).
  Q4_0,    // f16 d + 16 bytes of 4-bit quants: d (q - 8)
  Q4_1,    // f16 d, m + 4-bit quants: d q + m
  Q5_0,    // f16 d + 32 fifth bits + 4-bit quants: d (q - 16)
  Q5_1,    // f16 d, m + fifth bits + 4-bit quants: d q + m
  IQ4_NL,  // f16 d + 4-bit indices into the IQ4_NL codebook
};

// How a format stores a [rows][cols] matrix, row-major. A row is cols / block_elems blocks. The matrix's
// `data` holds block_bytes per block (for formats with in-block scales, as GGUF's, the scales are part of
// those bytes); `scales` holds scale_bytes per block in a separate array (compressed-tensors keeps them
// in a second tensor), rows one after another. Plain floats are blocks of one element without scales.
struct WeightLayout {
  const char* name;  // as users see it ("BF16", "MXFP4")
  int block_elems;   // elements per block along a row; cols must be a multiple
  int block_bytes;   // bytes of a block in `data`
  int scale_bytes;   // bytes of a block in `scales` (0: no separate scale array)
};

constexpr WeightLayout weight_layout(WeightFormat f) {
  switch (f) {
    case WeightFormat::F32: return {"F32", 1, 4, 0};
    case WeightFormat::F16: return {"F16", 1, 2, 0};
    case WeightFormat::BF16: return {"BF16", 1, 2, 0};
    case WeightFormat::MXFP4: return {"MXFP4", 32, 16, 1};
    case WeightFormat::MXFP4_GGML: return {"MXFP4_GGML", 32, 17, 0};
    case WeightFormat::Q8_0: return {"Q8_0", 32, 34, 0};
    case WeightFormat::Q4_K: return {"Q4_K", 256, 144, 0};
    case WeightFormat::Q5_K: return {"Q5_K", 256, 176, 0};
    case WeightFormat::Q6_K: return {"Q6_K", 256, 210, 0};
    case WeightFormat::Q3_K: return {"Q3_K", 256, 110, 0};
    case WeightFormat::Q2_K: return {"Q2_K", 256, 84, 0};
    case WeightFormat::IQ4_XS: return {"IQ4_XS", 256, 136, 0};
    case WeightFormat::IQ3_XXS: return {"IQ3_XXS", 256, 98, 0};
    case WeightFormat::IQ3_S: return {"IQ3_S", 256, 110, 0};
    case WeightFormat::IQ2_XXS: return {"IQ2_XXS", 256, 66, 0};
    case WeightFormat::IQ2_XS: return {"IQ2_XS", 256, 74, 0};
    case WeightFormat::IQ2_S: return {"IQ2_S", 256, 82, 0};
    case WeightFormat::IQ1_S: return {"IQ1_S", 256, 50, 0};
    case WeightFormat::IQ1_M: return {"IQ1_M", 256, 56, 0};
    case WeightFormat::Q4_0: return {"Q4_0", 32, 18, 0};
    case WeightFormat::Q4_1: return {"Q4_1", 32, 20, 0};
    case WeightFormat::Q5_0: return {"Q5_0", 32, 22, 0};
    case WeightFormat::Q5_1: return {"Q5_1", 32, 24, 0};
    case WeightFormat::IQ4_NL: return {"IQ4_NL", 32, 18, 0};
  }
  return {"?", 1, 0, 0};
}

constexpr const char* weight_format_name(WeightFormat f) { return weight_layout(f).name; }
// Bytes of one row of `cols` elements in `data` and in `scales` (cols a multiple of block_elems).
constexpr int64_t row_data_bytes(WeightFormat f, int64_t cols) {
  return cols / weight_layout(f).block_elems * weight_layout(f).block_bytes;
}
constexpr int64_t row_scale_bytes(WeightFormat f, int64_t cols) {
  return cols / weight_layout(f).block_elems * weight_layout(f).scale_bytes;
}
// Block-quantised (more than one element per block): stored as raw bytes, never as a float dtype.
constexpr bool is_block_format(WeightFormat f) { return weight_layout(f).block_elems > 1; }
// Stored bits per weight, scales included (what capacity planning multiplies by).
constexpr double bits_per_weight(WeightFormat f) {
  const WeightLayout l = weight_layout(f);
  return 8.0 * (l.block_bytes + l.scale_bytes) / l.block_elems;
}

}  // namespace k3
