// GGUF's block formats outside the kernels: dequantising stored rows (the exact values, as llama.cpp's
// dequantize_row_*) and quantising fp32 rows into blocks (what `k3 quantize` calls). Formats, layouts
// and measured errors: docs/quantization.md.
#pragma once
#include <cstdint>

#include "k3/core/weight_format.h"

namespace k3::quant {

// Whether f is a GGUF block format (Q8_0, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS, the codebook i-quants
// IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M, and the 32-element Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL):
// scales inside its blocks.
bool is_gguf_block_format(WeightFormat f);

// Whether quantize_row writes f (a packer exists for it: quant/gguf_pack.h).
bool can_quantize(WeightFormat f);

// Whether f is one of the formats llama.cpp refuses to write without an importance matrix (IQ2_XXS, IQ2_XS,
// IQ1_S, IQ1_M): k3 writes them without one (its default weighting), but warns that an imatrix matters most
// at these sizes.
bool importance_recommended(WeightFormat f);

// n values (a multiple of f's block_elems) from row_data_bytes(f, n) bytes at src. Throws k3::Error for a
// format that is not a GGUF block format or an n that is not a whole number of blocks.
void dequantize_row(WeightFormat f, const uint8_t* src, int64_t n, float* dst);

// Quantises n fp32 values (a multiple of f's block_elems) into row_data_bytes(f, n) bytes at dst,
// minimising the squared error of each group weighted by `importance` (n per-column weights > 0, as
// llama.cpp's imatrix gives; null: all 1, except for the codebook i-quants, where null weighs each value's
// error by sigma^2 + x^2 (iq_scales.h's error_weights: without an imatrix, large weights are the better
// guess of what matters). Writes every GGUF block format: Q8_0, the K-quants, IQ4_XS, the codebook
// i-quants (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M: iq_pack.h) and the 32-element formats.
// Throws k3::Error for a format it cannot write, a partial block, a non-finite input value or weight, or
// values whose f16 scale would overflow.
void quantize_row(WeightFormat f, const float* x, int64_t n, const float* importance, uint8_t* dst);

}  // namespace k3::quant
