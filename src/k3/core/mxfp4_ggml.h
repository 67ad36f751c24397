// Conversions between the two MXFP4 layouts (core/weight_format.h): the HF / compressed-tensors one (packed
// nibbles, element 2i = low nibble of byte i, one E8M0 scale per 32 in a separate array) and ggml's 17-byte
// block {e8m0; qs[16]} with element j = low nibble of qs[j] and element j + 16 = its high nibble. Same
// values, other bytes: what `k3 convert` writes and the tests build ggml blocks with.
#pragma once
#include <emmintrin.h>

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

// The inverse: ggml blocks -> packed nibbles + scales. On a hot path (a GGUF's host experts streamed to the GPU at
// prefill: ~80 MB per layer of k3-1b-fr), so in SSE2 (x86-64's baseline; the CUDA library's .cpp files build
// without -mavx2): the byte-array form above runs at 1.2 GB/s per core at -O3, so a layer's staging took ~6 ms on
// 16 threads. Within each 16-bit lane, x | (x >> 4) puts the nibble pair (element 2k, element 2k+1) in the low
// byte; packus then keeps the low bytes: the low nibbles' pairs (elements 0..15), then the high nibbles' (16..31).
inline void ggml_blocks_to_mxfp4(const uint8_t* blocks_in, int64_t blocks, uint8_t* packed, uint8_t* scales) {
  const __m128i nib = _mm_set1_epi8(0x0f), low_byte = _mm_set1_epi16(0x00ff);
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* b = blocks_in + g * 17;
    scales[g] = b[0];
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 1));
    const __m128i lo = _mm_and_si128(q, nib), hi = _mm_and_si128(_mm_srli_epi16(q, 4), nib);
    const __m128i plo = _mm_and_si128(_mm_or_si128(lo, _mm_srli_epi16(lo, 4)), low_byte);
    const __m128i phi = _mm_and_si128(_mm_or_si128(hi, _mm_srli_epi16(hi, 4)), low_byte);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(packed + g * 16), _mm_packus_epi16(plo, phi));
  }
}

}  // namespace k3
