// MLA attention cores on the CPU (model-spec section 3.3), NoPE: no rotation anywhere.
// The model does the projections; these functions do the softmax attention part.
#pragma once
#include <cstdint>
#include <vector>

#include "k3/core/cache_dtype.h"

namespace k3::cpu {

// MHA (prefill) form. T new queries at absolute positions [P, P+T) attend causally to S = P+T keys.
//   q      : [T][nh][dn+dr]    per head [q_nope | q_pe]
//   k_nope : [S][nh][dn]
//   k_pe   : [S][dr]           shared by all heads
//   v      : [S][nh][dv]
//   out    : [T][nh][dv]
// scale = 1/sqrt(dn+dr).
// Blocked by query (mla_mha.cpp); a (query, head) result does not depend on T, P's split or the thread count.
void mla_attention_mha(int T, int P, int nh, int dn, int dr, int dv, const float* q, const float* k_nope,
                       const float* k_pe, const float* v, float scale, float* out);
// The same with k_nope and v read in place from kv_b's output, kv : [S][nh][dn + dv] (per head [k_nope | v]),
// and k_pe's rows k_pe_stride floats apart (the latent rows): no copies. Same bits as mla_attention_mha.
void mla_attention_mha_kv(int T, int P, int nh, int dn, int dr, int dv, const float* q, const float* kv,
                          const float* k_pe, int64_t k_pe_stride, float scale, float* out);

// Absorbed (decode) form over the latent cache.
//   q_lat  : [T][nh][kr+dr]    per head [W_UK_h^T q_nope_h (kr values) | q_pe_h]
//   cache  : [S][kr+dr]        per token [c_kv (normed) | k_pe], S = P+T, token P+t is query t's own
//   out    : [T][nh][kr]       sum_s softmax(q_lat . cache_s * scale) * c_kv_s
void mla_attention_latent(int T, int P, int nh, int kr, int dr, const float* q_lat, const float* cache,
                          float scale, float* out);
// The same over a paged cache: rows[s] points at token s's [c_kv | k_pe] row. Each (query, head) is
// computed independently, so results do not depend on T, on batching or on how the cache is paged.
void mla_attention_latent_rows(int T, int P, int nh, int kr, int dr, const float* q_lat, const float* const* rows,
                               float scale, float* out);
// The same over rows stored as `dtype` (layouts: core/cache_dtype.h, written by cpu::mla_write_rows): each
// row element is converted in the inner loops, accumulation in fp32; an FP8 row's scale is applied once per
// dot product and once per weight. F32 is mla_attention_latent_rows itself (bit-identical).
void mla_attention_latent_rows_typed(int T, int P, int nh, int kr, int dr, const float* q_lat,
                                     const void* const* rows, CacheDType dtype, float scale, float* out);
// Query token t, heads [h0, h0 + hn) of mla_attention_latent_rows_typed, on the calling thread (a caller's
// parallel pass over (token, head) pieces): every (token, head) gets the arithmetic it gets there, so the same bits.
// `scratch` is resized as needed (reuse one per thread).
void mla_attention_latent_rows_heads(int t, int h0, int hn, int P, int nh, int kr, int dr, const float* q_lat,
                                     const void* const* rows, CacheDType dtype, float scale, float* out,
                                     std::vector<float>& scratch);

}  // namespace k3::cpu
