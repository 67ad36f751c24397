// MLA latent rows of any cache dtype (core/cache_dtype.h, docs/cache-dtypes.md) on the GPU: writing the new
// tokens' fp32 latents into stored rows, and the MHA prefill form's gather back to fp32. Same bytes / values
// as backend/cpu/mla_cache_rows.h. (The absorbed attention reads rows through cache_dtype.cuh's loaders.)
// Rows of layer pg.layer, addressed through MlaPaging (mla_paging.h). Device pointers; enqueued on `s`;
// each returns the launch status (cudaErrorInvalidValue for bad shapes).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "k3/backend/cuda/mla_paging.h"

namespace k3::cuda {

// lat [N][kr + dr] -> the rows of the N tokens tok_seq / tok_pos (FP8: per-row scale of c_kv, codes, bf16 k_pe).
cudaError_t mla_write_rows(const MlaPaging& pg, int N, const float* lat, cudaStream_t s);
// Rows 0..S-1 of sequence `seq` -> out [S][kr + dr] fp32.
cudaError_t mla_gather_latents(const MlaPaging& pg, int seq, int S, float* out, cudaStream_t s);

}  // namespace k3::cuda
