#include "k3/runtime/cache_spec.h"

#include "k3/core/error.h"
#include "k3/model/config.h"

namespace k3 {

CacheSpec make_cache_spec(const ModelConfig& c, CacheDType kv, CacheDType ssm) {
  if (ssm == CacheDType::FP8_E4M3) throw Error("--mamba-ssm-cache-dtype: fp8 is not supported for the KDA state");
  CacheSpec s;
  s.mla_layers = c.num_mla_layers();
  s.mla_rank = c.kv_lora_rank;
  s.mla_rope = c.qk_rope_dim;
  s.mla_dtype = kv;
  s.kda_layers = c.num_kda_layers();
  s.kda_heads = c.kda_heads;
  s.kda_head_dim = c.kda_head_dim;
  s.kda_conv_floats = c.kda_heads * c.kda_head_dim * (c.conv_kernel - 1);
  s.kda_state_dtype = ssm;
  return s;
}

}  // namespace k3
