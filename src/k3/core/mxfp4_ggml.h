// Conversions between the two MXFP4 layouts (core/weight_format.h): the HF / compressed-tensors one (packed
// nibbles, element 2i = low nibble of byte i, one E8M0 scale per 32 in a separate array) and ggml's 17-byte
// block {e8m0; qs[16]} with element j = low nibble of qs[j] and element j + 16 = its high nibble. Same
// values, other bytes: what `k3 convert` writes and the tests build ggml blocks with.
#pragma once
#include <cstdint>

namespace k3 {

// `blocks` groups of 32: packed [blocks * 16] + scales [blocks] -> out [blocks * 17].
inline void mxfp4_to_ggml_blocks(const uint8_t* packed, const uint8_t* scales, int64_t blocks, uint8_t* out) {
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* p = packed + g * 16;
    uint8_t* o = out + g * 17;
    o[0] = scales[g];
    uint8_t nib[32];
    for (int i = 0; i < 16; ++i) nib[2 * i] = p[i] & 0xf, nib[2 * i + 1] = p[i] >> 4;
    for (int j = 0; j < 16; ++j) o[1 + j] = static_cast<uint8_t>(nib[j] | (nib[j + 16] << 4));
  }
}

// The inverse: ggml blocks -> packed nibbles + scales.
inline void ggml_blocks_to_mxfp4(const uint8_t* blocks_in, int64_t blocks, uint8_t* packed, uint8_t* scales) {
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* b = blocks_in + g * 17;
    scales[g] = b[0];
    uint8_t nib[32];
    for (int j = 0; j < 16; ++j) nib[j] = b[1 + j] & 0xf, nib[j + 16] = b[1 + j] >> 4;
    for (int i = 0; i < 16; ++i) packed[g * 16 + i] = static_cast<uint8_t>(nib[2 * i] | (nib[2 * i + 1] << 4));
  }
}

}  // namespace k3
