// MLA latent rows of any cache dtype (core/cache_dtype.h, docs/cache-dtypes.md) on the GPU: writing the new
// tokens' fp32 latents into stored rows, and the MHA prefill form's gather back to fp32. Same bytes / values
// as backend/cpu/mla_cache_rows.h. (The absorbed attention reads rows through cache_dtype.cuh's loaders.)
// Device pointers; enqueued on `s`; each returns the launch status (cudaErrorInvalidValue for bad shapes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3/core/cache_dtype.h"

namespace k3::cuda {

// Where one layer's rows live. Row `pos` of sequence s starts at byte
//   pages[page_start[s] + pos / page_tokens[s]] + (pos % page_tokens[s]) * mla_row_bytes(dtype, kr, dr)
// Tokens of a batch are described by tok_seq (their sequence) and tok_pos (absolute position).
struct MlaRowPaging {
  uint8_t* const* pages;        // page base pointers of this layer; rows must be 16-byte aligned for F32, 8 for
                                // BF16, 4 for FP8 (the loaders of cache_dtype.cuh read 4 values at once)
  const int32_t* page_start;    // [n_seqs]
  const int32_t* page_tokens;   // [n_seqs]
  const int32_t* tok_seq;       // [N]
  const int32_t* tok_pos;       // [N]
  int kr, dr;                   // kv_lora_rank, qk_rope_dim (multiples of 4)
  CacheDType dtype;
};

// lat [N][kr + dr] -> the rows of the N tokens (FP8: per-row scale of c_kv, codes, bf16 k_pe).
cudaError_t mla_write_rows_typed(const MlaRowPaging& pg, int N, const float* lat, cudaStream_t s);
// Rows 0..S-1 of sequence `seq` -> out [S][kr + dr] fp32.
cudaError_t mla_gather_latents_typed(const MlaRowPaging& pg, int seq, int S, float* out, cudaStream_t s);

}  // namespace k3::cuda
