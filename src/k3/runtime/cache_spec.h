// CacheSpec: what a model needs from the cache per layer kind, declared by the runner (vLLM's per-layer KV
// cache specs): MLA layers keep one latent row [c_kv | k_pe] per token in the KV-cache dtype; KDA layers
// keep a fixed-size state per sequence (the recurrent state S in the SSM-cache dtype, the short-conv tails
// in fp32). Cache managers size and lay out memory from this alone, in bytes; kernels read the dtypes
// directly (core/cache_dtype.h, docs/cache-dtypes.md).
#pragma once
#include <cstdint>

#include "k3/core/cache_dtype.h"

namespace k3 {

struct ModelConfig;

struct CacheSpec {
  // MLA latent rows.
  int64_t mla_layers = 0, mla_rank = 0, mla_rope = 0;
  CacheDType mla_dtype = CacheDType::F32;
  // KDA state per sequence and layer: S [heads][head_dim][head_dim], conv tails 3 x [channels][conv - 1].
  int64_t kda_layers = 0, kda_heads = 0, kda_head_dim = 0, kda_conv_floats = 0;  // conv: per projection
  CacheDType kda_state_dtype = CacheDType::F32;

  int64_t mla_row_bytes() const { return k3::mla_row_bytes(mla_dtype, mla_rank, mla_rope); }
  // Bytes of one token's rows in all MLA layers.
  int64_t bytes_per_token() const { return mla_layers * mla_row_bytes(); }
  // One page: page_tokens tokens x all MLA layers, layer-major ([layer][token][row]).
  int64_t page_bytes(int64_t page_tokens) const { return bytes_per_token() * page_tokens; }
  // KDA state of one layer: S, then the three conv tails; 256-byte aligned so every layer's S is.
  int64_t kda_state_bytes() const { return kda_heads * kda_head_dim * kda_head_dim * cache_dtype_bytes(kda_state_dtype); }
  int64_t kda_layer_bytes() const { return (kda_state_bytes() + 3 * kda_conv_floats * 4 + 255) / 256 * 256; }
  // One sequence's KDA state in all KDA layers.
  int64_t slot_bytes() const { return kda_layers * kda_layer_bytes(); }
};

// The spec of a model with the chosen dtypes (F32 both: the cache k3 has always had). Throws k3::Error for
// a dtype the model's state cannot take (fp8 for the KDA state).
CacheSpec make_cache_spec(const ModelConfig& c, CacheDType kv = CacheDType::F32, CacheDType ssm = CacheDType::F32);

}  // namespace k3
