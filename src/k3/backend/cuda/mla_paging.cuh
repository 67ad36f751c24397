// Device side of MlaPaging (mla_paging.h): one sequence's rows of the call's layer, resolved once per
// block (the layer offset and the page-table base), so a row address is one division and a multiply-add.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "k3/backend/cuda/mla_paging.h"

namespace k3::cuda {

struct MlaSeqRows {
  uint8_t* const* pages;  // this sequence's page table
  int page_tokens;
  int64_t layer_off;      // layer * layer_stride[seq]
  int64_t row_bytes;

  __device__ __forceinline__ uint8_t* row(int pos) const {
    return pages[pos / page_tokens] + layer_off + static_cast<int64_t>(pos % page_tokens) * row_bytes;
  }
};

__device__ __forceinline__ MlaSeqRows mla_seq_rows(const MlaPaging& pg, int seq) {
  return MlaSeqRows{pg.pages + pg.page_start[seq], pg.page_tokens[seq], pg.layer * pg.layer_stride[seq],
                    mla_row_bytes(pg.dtype, pg.kr, pg.dr)};
}

}  // namespace k3::cuda
