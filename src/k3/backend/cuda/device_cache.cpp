#include "k3/backend/cuda/device_cache.h"

namespace k3::cuda {

float* DeviceCacheMemory::allocate(size_t floats) {
  K3_CUDA_CHECK(cudaSetDevice(device_));
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<size_t>(floats, 1) * 4);
  if (e != cudaSuccess)
    throw Error("cannot allocate " + std::to_string(floats * 4 >> 20) + " MiB of GPU memory for the cache (" +
                cudaGetErrorString(e) + "); lower --cache-memory");
  return static_cast<float*>(p);
}

void DeviceCacheMemory::release(float* p) { cudaFree(p); }

void DeviceCacheMemory::copy(float* dst, const float* src, size_t floats) {
  K3_CUDA_CHECK(cudaMemcpyAsync(dst, src, floats * 4, cudaMemcpyDeviceToDevice, stream_));
}

void DeviceCacheMemory::zero(float* dst, size_t floats) {
  K3_CUDA_CHECK(cudaMemsetAsync(dst, 0, floats * 4, stream_));
}

DeviceSequence::DeviceSequence(const ModelConfig& c, cudaStream_t stream) : stream_(stream) {
  const int64_t C = c.kda_heads * c.kda_head_dim;
  state_floats_ = c.kda_heads * c.kda_head_dim * c.kda_head_dim;
  conv_floats_ = C * (c.conv_kernel - 1);
  n_kda_ = c.num_kda_layers();
  n_mla_ = c.num_mla_layers();
  row_dim_ = c.mla_cache_dim();
  const size_t bytes = static_cast<size_t>(n_kda_ * (state_floats_ + 3 * conv_floats_)) * 4;
  kda_ = DeviceBuffer(bytes);
  if (bytes) K3_CUDA_CHECK(cudaMemsetAsync(kda_.get(), 0, bytes, stream_));
}

KdaStateView DeviceSequence::kda_state(int64_t i) {
  float* b = kda_.get<float>() + i * (state_floats_ + 3 * conv_floats_);
  return {b, b + state_floats_, b + state_floats_ + conv_floats_, b + state_floats_ + 2 * conv_floats_};
}

float* DeviceSequence::mla_row(int64_t m, int64_t pos) {
  return pages_[static_cast<size_t>(pos / kPageTokens)].get<float>() + (m * kPageTokens + pos % kPageTokens) * row_dim_;
}

void DeviceSequence::reserve(int64_t n) {
  if (n_mla_ == 0) return;
  while (static_cast<int64_t>(pages_.size()) * kPageTokens < n_past_ + n)
    pages_.emplace_back(static_cast<size_t>(kPageTokens * n_mla_ * row_dim_) * 4);
}

std::unique_ptr<SequenceCache> DeviceSequence::clone() const {
  auto c = std::unique_ptr<DeviceSequence>(new DeviceSequence());
  c->stream_ = stream_;
  c->n_past_ = n_past_;
  c->state_floats_ = state_floats_;
  c->conv_floats_ = conv_floats_;
  c->n_kda_ = n_kda_;
  c->n_mla_ = n_mla_;
  c->row_dim_ = row_dim_;
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
