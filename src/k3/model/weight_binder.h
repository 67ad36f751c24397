// WeightBinder: looks a checkpoint's tensors up by name, checks each against the shape and dtype the
// caller expects, and collects every problem before failing once (check()) with a list naming the files.
// Matrices stay views into the mapping (or aligned copies where the file misaligns them); small vectors
// are converted to fp32. Used by the model's binder (weights.cpp) and the block drafter's
// (model/drafter/drafter_weights.cpp).
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "k3/core/weight.h"
#include "k3/io/safetensors.h"
#include "k3/model/placement.h"

namespace k3 {

// "[2, 3]"
std::string shape_str(const std::vector<int64_t>& s);

class WeightBinder {
 public:
  // `copies` receives the aligned copies (it must outlive the bound views).
  WeightBinder(const Checkpoint& ck, std::vector<std::vector<uint8_t>>& copies, const Placement* placement = nullptr,
               int model_device = kHostDevice);

  // The home of matrix `name` (model/placement.h).
  int device_for(const std::string& name) const {
    return placement_ ? placement_->device_of(name, model_device_) : model_device_;
  }
  // A float matrix [rows][cols] (F32 / BF16 / F16, or a GGUF block format); empty (and a problem noted) if not.
  WeightMatrix mat(const std::string& name, int64_t rows, int64_t cols);
  // A matrix a GGUF stores in a block format with in-block scales (TensorInfo::block_format).
  WeightMatrix block_matrix(const std::string& name, const TensorInfo* t, WeightFormat f, int64_t rows, int64_t cols);
  // A block format as a compressed-tensors pair (MXFP4: mxfp4-pack-quantized): <base>.weight_packed U8
  // [rows, row_data_bytes] + <base>.weight_scale U8 [rows, row_scale_bytes] (core/weight_format.h).
  // A format with its scales inside the blocks (MXFP4_GGML from a GGUF) is one tensor: <base>.weight U8
  // [rows, row_data_bytes].
  WeightMatrix packed(const std::string& base, WeightFormat format, int64_t rows, int64_t cols);
  bool has(const std::string& name) const { return ck_.find(name) != nullptr; }
  // Starts reading tensor `name` (if present) into the page cache: the scale checks of a layer's experts
  // then wait for exactly their bytes, issued together, instead of faulting one at a time with the
  // kernel's read-around, which on a large read_ahead_kb reads the whole checkpoint (docs/bigger-than-ram.md).
  void prefetch(const std::string& name);
  // A small float tensor converted to fp32; `shapes` lists the accepted shapes (first is the usual one).
  std::vector<float> vec(const std::string& name, const std::vector<std::vector<int64_t>>& shapes);
  std::vector<float> vec(const std::string& name, int64_t n) { return vec(name, {{n}}); }

  // Throws k3::Error listing the problems noted so far ("checkpoint 'DIR' does not match its config (N
  // problems): ..."), if any.
  void check() const;
  int64_t bytes() const { return bytes_; }  // bytes of the tensors bound so far
  int64_t unused_tensors() const;           // tensors of the checkpoint never looked up

 private:
  const TensorInfo* get(const std::string& name, const std::string& expect);
  WeightMatrix bad(const std::string& name, const TensorInfo* t, const std::string& what);
  void note(std::string problem);
  bool scales_are_finite(const std::string& name, const TensorInfo* s, int64_t row_scale_bytes);
  const void* aligned(const TensorInfo* t);

  const Checkpoint& ck_;
  std::vector<std::vector<uint8_t>>& copies_;
  const Placement* placement_;
  int model_device_;
  std::vector<std::string> problems_;
  size_t n_problems_ = 0;
  uint64_t scanned_ = 0;  // MXFP4 scale bytes checked so far (progress line)
  std::set<std::string> used_;
  int64_t bytes_ = 0;
};

}  // namespace k3
