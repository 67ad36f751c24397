// A weight matrix as stored in the checkpoint: [rows = out features][cols = in features], row-major,
// never copied. Its WeightFormat says how the elements are stored (core/weight_format.h): plain floats,
// or blocks with scales, as MXFP4's packed nibbles and E8M0 scales (model-spec section 4).
#pragma once
#include <cstdint>

#include "k3/core/dtype.h"
#include "k3/core/weight_format.h"

namespace k3 {

struct WeightMatrix {
  WeightFormat format = WeightFormat::F32;
  const void* data = nullptr;       // [rows][row_data_bytes(format, cols)]: floats, or packed blocks
  const uint8_t* scales = nullptr;  // [rows][row_scale_bytes(format, cols)]; null for formats without
  int64_t rows = 0, cols = 0;

  bool empty() const { return data == nullptr; }
  WeightLayout layout() const { return weight_layout(format); }
  const uint8_t* row_data(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_data_bytes(format, cols); }
  const uint8_t* row_scales(int64_t r) const { return scales + r * row_scale_bytes(format, cols); }
  // Bytes this matrix occupies in memory (what a matrix-vector product streams).
  int64_t bytes() const { return rows * (row_data_bytes(format, cols) + row_scale_bytes(format, cols)); }
};

// The format of a float tensor of dtype `t` (F32, F16, BF16); false for any other dtype.
inline bool float_weight_format(DType t, WeightFormat* out) {
  switch (t) {
    case DType::F32: *out = WeightFormat::F32; return true;
    case DType::F16: *out = WeightFormat::F16; return true;
    case DType::BF16: *out = WeightFormat::BF16; return true;
    default: return false;
  }
}

}  // namespace k3
