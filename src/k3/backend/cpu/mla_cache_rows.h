// MLA latent rows in the cache dtypes (core/cache_dtype.h, docs/cache-dtypes.md) on the CPU: writing fp32
// latents [c_kv (kr) | k_pe (dr)] into stored rows and reading stored rows back as fp32 (the MHA prefill
// form's gather). The absorbed attention reads stored rows directly: mla_attention_latent_rows_typed
// (mla_attention.h). A stored row is mla_row_bytes(dtype, kr, dr) bytes; row pointers need 4-byte alignment.
#pragma once
#include "k3/core/cache_dtype.h"

namespace k3::cpu {

// One row: lat [kr + dr] fp32 -> dst. FP8: scale = max|c_kv| / 448 (1 when every c_kv is 0), codes of
// c_kv / scale, k_pe rounded to bf16.
void mla_encode_row(CacheDType dtype, int kr, int dr, const float* lat, void* dst);
// One stored row -> out [kr + dr] fp32 (FP8: code value * scale, one fp32 multiply).
void mla_decode_row(CacheDType dtype, int kr, int dr, const void* src, float* out);

// N new rows: lat [N][kr + dr] -> rows[t] (each a stored row of mla_row_bytes(dtype, kr, dr) bytes).
void mla_write_rows(CacheDType dtype, int N, int kr, int dr, const float* lat, void* const* rows);
// The MHA prefill form's gather: rows[0..S) -> out [S][kr + dr] fp32.
void mla_gather_rows(CacheDType dtype, int S, int kr, int dr, const void* const* rows, float* out);

// The 256 values of the e4m3 codes (for kernels that decode in their inner loops).
const float* fp8_e4m3_table();

}  // namespace k3::cpu
