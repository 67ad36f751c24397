// Minimal .npy (NumPy format 1.0) reader/writer for float32 arrays: logits out, goldens in.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace k3 {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // C order
};

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape);
// Reads '<f4' or '<f8' (converted to float32), C order. Throws k3::Error on anything else.
NpyArray read_npy_f32(const std::string& path);

}  // namespace k3
