// Where the MLA latent rows of a batch live on the GPU: the one paging description every MLA CUDA kernel
// (mla_write_rows, mla_gather_latents, mla_attend_latent: SIMT and tensor-core paths) reads. A page holds
// page_tokens tokens x all MLA layers, layer-major (the layout of both cache managers), so one page table
// serves every layer of a step. Rows are stored as `dtype` (core/cache_dtype.h, docs/cache-dtypes.md).
// Plain C++ (host code builds it); the device-side row address is mla_seq_rows in mla_paging.cuh.
#pragma once
#include <cstdint>

#include "k3/core/cache_dtype.h"

namespace k3::cuda {

// Row (layer m, position pos) of sequence s starts at byte
//   pages[page_start[s] + pos / page_tokens[s]] + m * layer_stride[s] + (pos % page_tokens[s]) * row_bytes
// with row_bytes = mla_row_bytes(dtype, kr, dr). Every row start must be 16-byte aligned for F32 / BF16
// and 4-byte aligned for FP8_E4M3 (the kernels read 16 / 4 bytes at once): 16-byte aligned pages and
// layer_stride = page_tokens * row_bytes (rounded up to 16) give that, since kr and dr are multiples of 4.
struct MlaPaging {
  uint8_t* const* pages;        // page base addresses of all sequences (one table shared by every layer)
  const int32_t* page_start;    // [n_seqs]
  const int32_t* page_tokens;   // [n_seqs]
  const int64_t* layer_stride;  // [n_seqs] bytes between one layer's rows and the next layer's inside a page
  const int32_t* tok_seq;       // [N]
  const int32_t* tok_pos;       // [N]
  int layer;                    // the MLA layer this call reads / writes
  int kr, dr;                   // kv_lora_rank, qk_rope_dim (multiples of 4)
  CacheDType dtype;             // row_bytes = mla_row_bytes(dtype, kr, dr)
  const int32_t* tok_index = nullptr;  // mla_attend_latent: the batch tokens to attend for (null: 0..N-1)
};

// The shape checks every entry point makes before launching (kr, dr multiples of 4, kr > 0, a known
// dtype, layer >= 0).
inline bool mla_paging_shape_ok(const MlaPaging& pg) {
  return pg.kr > 0 && pg.dr >= 0 && pg.kr % 4 == 0 && pg.dr % 4 == 0 && pg.layer >= 0 &&
         (pg.dtype == CacheDType::F32 || pg.dtype == CacheDType::BF16 || pg.dtype == CacheDType::FP8_E4M3);
}

}  // namespace k3::cuda
