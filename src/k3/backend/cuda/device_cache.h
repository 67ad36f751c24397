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
#include "k3/runtime/cache_memory.h"
#include "k3/runtime/sequence_cache.h"

namespace k3::cuda {

class DeviceCacheMemory final : public CacheMemory {
 public:
  DeviceCacheMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  uint8_t* allocate(size_t bytes) override;
  void release(uint8_t* p) override;
  void copy(uint8_t* dst, const uint8_t* src, size_t bytes) override;
  void zero(uint8_t* dst, size_t bytes) override;

 private:
  int device_;
  cudaStream_t stream_;
};

class DeviceSequence final : public SequenceCache {
 public:
  static constexpr int64_t kPageTokens = 256;
  DeviceSequence(const CacheSpec& spec, cudaStream_t stream);

  const CacheSpec& spec() const override { return spec_; }
  int64_t n_past() const override { return n_past_; }
  KdaStateView kda_state(int64_t i) override;
  MlaPageTable mla_pages() override;
  void reserve(int64_t n) override;
  void advance(int64_t n) override { n_past_ += n; }
  std::unique_ptr<SequenceCache> clone() const override;

 private:
  DeviceSequence() = default;
  CacheSpec spec_;
  cudaStream_t stream_ = nullptr;
  int64_t n_past_ = 0;
  DeviceBuffer kda_;
  std::vector<DeviceBuffer> pages_;
  std::vector<uint8_t*> page_ptrs_;
};

}  // namespace k3::cuda
