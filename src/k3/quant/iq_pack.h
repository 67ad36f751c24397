// The block packers of the codebook i-quants (IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M):
// error weights, signs, then the scale search of iq_scales.h over the codebook search of iq_codebook.h /
// iq1_search.h, then the bits in block_decode_iq.h's layouts. Part of gguf_pack.h's block_packer.
#pragma once

#include "k3/core/weight_format.h"
#include "k3/quant/gguf_pack.h"

namespace k3::quant {

// The packer of a codebook i-quant (null for any other format).
PackBlock codebook_packer(WeightFormat f);

}  // namespace k3::quant
