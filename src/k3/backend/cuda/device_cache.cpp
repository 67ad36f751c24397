#include "k3/backend/cuda/device_cache.h"

namespace k3::cuda {

uint8_t* DeviceCacheMemory::allocate(size_t bytes) {
  K3_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (e != cudaSuccess)
    throw Error("cannot allocate " + std::to_string(bytes >> 20) + " MiB of GPU memory for the cache (" +
                cudaGetErrorString(e) + "); lower --cache-memory");
  return static_cast<uint8_t*>(p);
}

void DeviceCacheMemory::release(uint8_t* p) { cudaFree(p); }

void DeviceCacheMemory::copy(uint8_t* dst, const uint8_t* src, size_t bytes) {
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void DeviceCacheMemory::zero(uint8_t* dst, size_t bytes) { K3_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_)); }

DeviceSequence::DeviceSequence(const CacheSpec& spec, cudaStream_t stream) : spec_(spec), stream_(stream) {
  const size_t bytes = static_cast<size_t>(spec_.slot_bytes());
  kda_ = DeviceBuffer(bytes);
  if (bytes) K3_CUDA_CHECK(cudaMemsetAsync(kda_.get(), 0, bytes, stream_));
}

KdaStateView DeviceSequence::kda_state(int64_t i) {
  uint8_t* b = kda_.get<uint8_t>() + i * spec_.kda_layer_bytes();
  float* conv = reinterpret_cast<float*>(b + spec_.kda_state_bytes());
  const int64_t cf = spec_.kda_conv_floats;
  return {b, conv, conv + cf, conv + 2 * cf};
}

MlaPageTable DeviceSequence::mla_pages() {
  page_ptrs_.resize(pages_.size());
  for (size_t j = 0; j < pages_.size(); ++j) page_ptrs_[j] = pages_[j].get<uint8_t>();
  return MlaPageTable{page_ptrs_, kPageTokens, kPageTokens * spec_.mla_row_bytes(), spec_.mla_row_bytes()};
}

void DeviceSequence::reserve(int64_t n) {
  if (spec_.mla_layers == 0) return;
  while (static_cast<int64_t>(pages_.size()) * kPageTokens < n_past_ + n)
    pages_.emplace_back(static_cast<size_t>(spec_.page_bytes(kPageTokens)));
}

std::unique_ptr<SequenceCache> DeviceSequence::clone() const {
  auto c = std::unique_ptr<DeviceSequence>(new DeviceSequence());
  c->spec_ = spec_;
  c->stream_ = stream_;
  c->n_past_ = n_past_;
  c->kda_ = DeviceBuffer(kda_.bytes());
  if (kda_.bytes()) K3_CUDA_CHECK(cudaMemcpyAsync(c->kda_.get(), kda_.get(), kda_.bytes(), cudaMemcpyDeviceToDevice, stream_));
  for (const DeviceBuffer& p : pages_) {
    c->pages_.emplace_back(p.bytes());
    K3_CUDA_CHECK(cudaMemcpyAsync(c->pages_.back().get(), p.get(), p.bytes(), cudaMemcpyDeviceToDevice, stream_));
  }
  K3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return c;
}

}  // namespace k3::cuda
