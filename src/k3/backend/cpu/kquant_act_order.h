// The order in which the AVX-512 tiers store a 256-value block of int8 activations for the K-quant kernels
// (weight_kernels_quant_vnni.cpp's quads, weight_kernels_vnni_k.cpp's per-block form): four 64-byte chunks of four
// 16-value groups, so that one 64-byte load of weights meets one chunk.
#pragma once

namespace k3::cpu {

// Where group k (0..3) of chunk c (0..3) comes from in the block. Natural: values 64 c + 16 k. kNibblePairs (Q4_K, Q5_K):
// chunk c holds the values of the low (c even) or high (c odd) nibbles of quant bytes [64 (c / 2), + 64), 32 per 32-byte
// half (values 32 j + [0, 32) of sub-block j): chunk 0 = values 0-31 and 64-95, 1 = 32-63 and 96-127, 2 = 128-159 and
// 192-223, 3 = 160-191 and 224-255; so a kernel splits one 64-byte load of quants into two chunks (low and high nibbles)
// without re-joining halves. Each group of 4 is still 4 consecutive values of one sub-block.
template <bool kNibblePairs>
constexpr int kquant_group_src(int c, int k) {
  return kNibblePairs ? 128 * (c / 2) + 32 * (c % 2) + 64 * (k / 2) + 16 * (k % 2) : 64 * c + 16 * k;
}

// Q4_K's 16-row decode layout (decode_layout.h) meets the activations a quad (4 stored values) at a time. Quad s (0..63)
// of a block in the kNibblePairs order holds values kquant_quad_first(s) + [0, 4), all of one sub-block (32 values).
constexpr int kquant_quad_first(int s) { return kquant_group_src<true>(s / 16, s / 4 % 4) + 4 * (s % 4); }
// kquant_sub_block_quad(j, k): the k-th (0..7, in stored order) quad of sub-block j (0..7).
constexpr int kquant_sub_block_quad(int j, int k) {
  for (int s = 0; s < 64; ++s)
    if (kquant_quad_first(s) / 32 == j && k-- == 0) return s;
  return -1;
}
// The same as a table, for kernels (constant indices in unrolled loops).
struct KquantSubBlockQuads {
  int q[8][8];
};
constexpr KquantSubBlockQuads make_kquant_sub_block_quads() {
  KquantSubBlockQuads t{};
  for (int j = 0; j < 8; ++j)
    for (int k = 0; k < 8; ++k) t.q[j][k] = kquant_sub_block_quad(j, k);
  return t;
}
inline constexpr KquantSubBlockQuads kKquantSubBlockQuads = make_kquant_sub_block_quads();

}  // namespace k3::cpu
