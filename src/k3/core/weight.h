// A weight matrix as stored in the checkpoint: [rows = out features][cols = in features], row-major,
// never copied. MXFP4 matrices keep their packed nibbles and E8M0 scales (model-spec section 4).
#pragma once
#include <cstdint>

#include "k3/core/dtype.h"

namespace k3 {

struct WeightMatrix {
  DType dtype = DType::F32;  // F32 | BF16 | F16, or U8 when mxfp4
  bool mxfp4 = false;
  const void* data = nullptr;      // F32/BF16/F16 [rows][cols], or packed U8 [rows][cols/2]
  const uint8_t* scales = nullptr;  // MXFP4 only: [rows][cols/32]
  int64_t rows = 0, cols = 0;

  bool empty() const { return data == nullptr; }
  // Bytes this matrix occupies in memory (what a matrix-vector product streams).
  int64_t bytes() const {
    if (mxfp4) return rows * cols / 2 + rows * cols / 32;
    return rows * cols * static_cast<int64_t>(dtype_size(dtype));
  }
};

}  // namespace k3
