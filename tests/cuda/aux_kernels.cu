// The CUDA tests' own kernels (aux_kernels.h).
#include "aux_kernels.h"

#include "k3/backend/cuda/pdl.cuh"

namespace {

__global__ void late_copy_kernel(float* dst, const float* src, int64_t n, long long spin) {
  k3::cuda::pdl::launch_dependents();
  if (threadIdx.x == 0) {  // the block's other threads wait at the barrier
    const long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
  }
  __syncthreads();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

__global__ void early_read_kernel(float* dst, const float* src, int64_t n) {  // no pdl::wait(): the contract broken
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = src[i];
}

__global__ void read_bytes_kernel(const uint4* p, int64_t count, uint32_t* sink) {
  k3::cuda::pdl::launch_dependents();
  uint32_t acc = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int o = 16; o > 0; o >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) atomicXor(sink + blockIdx.x, acc);
}

}  // namespace

cudaError_t k3cudatest::late_copy(float* dst, const float* src, int64_t n, long long spin_cycles, cudaStream_t s) {
  late_copy_kernel<<<8, 256, 0, s>>>(dst, src, n, spin_cycles);
  return cudaGetLastError();
}

cudaError_t k3cudatest::early_read(float* dst, const float* src, int64_t n, cudaStream_t s) {
  return k3::cuda::pdl::launch(early_read_kernel, 8, 256, 0, s, dst, src, n);
}

cudaError_t k3cudatest::read_bytes(const void* p, int64_t bytes, int blocks, uint32_t* sink, cudaStream_t s) {
  read_bytes_kernel<<<blocks, 256, 0, s>>>(static_cast<const uint4*>(p), bytes / 16, sink);
  return cudaGetLastError();
}

bool k3cudatest::pdl_enabled() { return k3::cuda::pdl::enabled(); }
