// Caches in device memory for the CUDA backend:
//   - DeviceCacheMemory: the CacheMemory the serving cache manager (cache/hybrid_cache.h) allocates
//     its pages and KDA slots from; copies and zeroing are ordered on the model's stream.
//   - DeviceSequence: a standalone growable per-sequence cache (CLI verbs, tests, offline benchmarks):
//     KDA states of all layers in one buffer; MLA rows in pages of kPageTokens tokens x all MLA layers
//     (the same page layout as the hybrid cache), one allocation per page as the sequence grows.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/model/config.h"
#include "k3/runtime/cache_memory.h"
#include "k3/runtime/sequence_cache.h"

namespace k3::cuda {

class DeviceCacheMemory final : public CacheMemory {
 public:
  DeviceCacheMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  float* allocate(size_t floats) override;
  void release(float* p) override;
  void copy(float* dst, const float* src, size_t floats) override;
  void zero(float* dst, size_t floats) override;

 private:
  int device_;
  cudaStream_t stream_;
};

class DeviceSequence final : public SequenceCache {
 public:
  static constexpr int64_t kPageTokens = 256;
  DeviceSequence(const ModelConfig& c, cudaStream_t stream);

  int64_t n_past() const override { return n_past_; }
  KdaStateView kda_state(int64_t i) override;
  float* mla_row(int64_t m, int64_t pos) override;
  void reserve(int64_t n) override;
  void advance(int64_t n) override { n_past_ += n; }
  int64_t mla_page_tokens() const override { return kPageTokens; }
  std::unique_ptr<SequenceCache> clone() const override;

 private:
  DeviceSequence() = default;
  cudaStream_t stream_ = nullptr;
  int64_t n_past_ = 0, state_floats_ = 0, conv_floats_ = 0, n_kda_ = 0, n_mla_ = 0, row_dim_ = 0;
  DeviceBuffer kda_;
  std::vector<DeviceBuffer> pages_;
};

}  // namespace k3::cuda
