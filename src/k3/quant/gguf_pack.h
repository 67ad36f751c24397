// One block of fp32 values -> one GGUF block (the quantisers behind quantize_row, gguf_quant.h): the
// sub-block scales from scale_search.h, then the super-block scale(s) in f16, the sub-scales quantised
// against them, and the quants rounded again under the scales as decoded (block_decode.h), so that the
// stored values are the nearest the final scales allow. The byte layouts are block_decode.h's.
#pragma once
#include <cstdint>

#include "k3/core/weight_format.h"

namespace k3::quant {

// x: block_elems values, w: their importance weights or null; writes block_bytes at out.
using PackBlock = void (*)(const float* x, const float* w, uint8_t* out);

// The packer of a GGUF block format (null for any other format).
PackBlock block_packer(WeightFormat f);

}  // namespace k3::quant
