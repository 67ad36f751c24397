// Attention inside fixed blocks of rows, not causal: the block drafter's (docs/block-drafter.md) mixer.
// graph::Backend::block_attention's definition on the host.
#pragma once
#include <cstdint>

namespace k3::cpu {

// q, k, v, o: [n][heads * head_dim] contiguous; n % block == 0. Row i of block b (rows b*block ..), head m:
// o_i = sum_j softmax_j(q_i . k_j * scale) v_j over the rows j of block b. fp32 with float64 dot products
// and softmax sums (blocks are a few rows: the cost is the projections around it, not this).
void block_attention(const float* q, const float* k, const float* v, int64_t n, int64_t block, int64_t heads,
                     int64_t head_dim, float scale, float* o);

}  // namespace k3::cpu
