// The model's weights in device memory: uploaded once from the bound checkpoint (BF16 matrices as
// they are, fp32 ones as fp32, MXFP4 routed experts kept packed, each layer's experts stacked into one
// ExpertStack), or generated on the device for --load-format dummy. Small vectors (norms, conv taps,
// biases) are fp32; the embedding is a bf16 table. Everything lives in a few large allocations (DeviceArena).
#pragma once
#include <cstdint>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/model/config.h"
#include "k3/model/weights.h"

namespace k3::cuda {

// Bump allocator over 1 GiB chunks (or one larger chunk for a larger tensor); 256-byte alignment.
class DeviceArena {
 public:
  void* alloc(size_t bytes);
  size_t bytes() const { return used_; }

 private:
  std::vector<DeviceBuffer> chunks_;
  size_t off_ = 0, used_ = 0;
};

// The device copy of a model's weights: the graph's ModelWeights (model/weights.h), every view pointing
// into `arena`; routed experts stacked per layer (MoeWeights::stacked; `experts` stays empty). The host
// checkpoint can be dropped once this exists.
struct DeviceWeights {
  DeviceArena arena;
  ModelWeights w;
};

// Copies every bound tensor whose home is not the host to CUDA device `device` (synchronous); matrices
// placed on the host (model/placement.h) stay views of `w`'s host memory, which must then outlive `out`.
// Throws k3::Error on what the backend lacks.
void upload_weights(const ModelWeights& w, int device, DeviceWeights& out);
// Single tensors uploaded into `arena` on `device` the way upload_weights uploads the model's (whatever their
// home says): a dense projection (BF16 as is, F32 / F16 as F32, GGUF blocks as stored), an embedding table
// (bf16, or GGUF blocks), a small fp32 vector. For other networks on the device (the block drafter:
// cuda_drafter.h). Throws k3::Error for a format the backend lacks.
DeviceLinear upload_linear(DeviceArena& arena, int device, const WeightMatrix& w);
WeightMatrix upload_embedding_table(DeviceArena& arena, int device, const WeightMatrix& w);
WeightVector upload_vector(DeviceArena& arena, int device, const WeightVector& v);
// Random weights of the config's shapes, generated on the device (deterministic in `seed`).
void dummy_weights(const ModelConfig& cfg, uint64_t seed, int device, DeviceWeights& out);

}  // namespace k3::cuda
