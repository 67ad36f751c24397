// A weight matrix as stored in the checkpoint: [rows = out features][cols = in features], row-major,
// never copied. Its WeightFormat says how the elements are stored (core/weight_format.h): plain floats,
// or blocks with scales, as MXFP4's packed nibbles and E8M0 scales (model-spec section 4).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "k3/core/dtype.h"
#include "k3/core/weight_format.h"

namespace k3 {

// Where a weight lives: host memory (kHostDevice) or the CUDA device of that ordinal.
inline constexpr int kHostDevice = -1;

struct WeightMatrix {
  WeightFormat format = WeightFormat::F32;
  const void* data = nullptr;       // [rows][row_data_bytes(format, cols)]: floats, or packed blocks
  const uint8_t* scales = nullptr;  // [rows][row_scale_bytes(format, cols)]; null for formats without
  int64_t rows = 0, cols = 0;
  int device = kHostDevice;         // its home (model/placement.h): where `data` is, and where ops on it run
  // A backend's second copy of `data` in the layout of its decode kernels, made at upload, or null (CUDA: the
  // tile-major Q6_K of the vocabulary heads, quant_mma_tiled.cuh). A view into the same backend's memory.
  const void* tiled = nullptr;

  bool empty() const { return data == nullptr; }
  WeightLayout layout() const { return weight_layout(format); }
  const uint8_t* row_data(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_data_bytes(format, cols); }
  const uint8_t* row_scales(int64_t r) const { return scales + r * row_scale_bytes(format, cols); }
  // Bytes this matrix occupies in memory (what a matrix-vector product streams).
  int64_t bytes() const { return rows * (row_data_bytes(format, cols) + row_scale_bytes(format, cols)); }
};

// A small fp32 weight vector (norm weights, biases, conv taps, gates) in some backend's memory: a view,
// which owns its host storage when built from a std::vector (the loader's converted copies, tests) and
// borrows it otherwise (a backend's device copy, WeightVector::view). Copies share the storage.
class WeightVector {
 public:
  WeightVector() = default;
  WeightVector(std::vector<float> v)  // NOLINT(google-explicit-constructor): a vector is a weight vector
      : owner_(std::make_shared<const std::vector<float>>(std::move(v))), p_(owner_->data()), n_(owner_->size()) {}
  static WeightVector view(const float* p, size_t n) {
    WeightVector w;
    w.p_ = p;
    w.n_ = n;
    return w;
  }
  const float* data() const { return n_ ? p_ : nullptr; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  float operator[](size_t i) const { return p_[i]; }
  const float* begin() const { return p_; }
  const float* end() const { return p_ + n_; }

 private:
  std::shared_ptr<const std::vector<float>> owner_;
  const float* p_ = nullptr;
  size_t n_ = 0;
};

// All E routed experts of one MoE layer stacked in one allocation per projection (what grouped expert
// kernels read; a backend builds it at load time, the CPU reads the per-expert matrices instead):
//   gate, up [E][I][X]; down [E][X][I], each in `format` (rows as WeightMatrix stores them, scales of a
//   block format in a separate [E][rows][blocks] array). X = expert input width, I = intermediate size.
struct ExpertStack {
  WeightFormat format = WeightFormat::BF16;
  // The down stack's format where it differs: only GGUF block stacks (quant_moe.h) may mix, as llama-quantize
  // writes them; every other path reads `format` for all three stacks.
  WeightFormat down_format = WeightFormat::BF16;
  const void* gate = nullptr;
  const uint8_t* gate_scales = nullptr;
  const void* up = nullptr;
  const uint8_t* up_scales = nullptr;
  const void* down = nullptr;
  const uint8_t* down_scales = nullptr;
  int E = 0, I = 0, X = 0;
  // MXFP4 stacks: the largest E8M0 scale byte of the three, where the loader counted it (255: not counted, or a NaN
  // scale). At most 128 (every block scale <= 2^1, as trained weights have) the ring prefill decodes with one
  // multiply and no NaN or overflow test (moe_prefill_ring.cu).
  uint8_t max_scale = 255;
  bool empty() const { return gate == nullptr; }
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
