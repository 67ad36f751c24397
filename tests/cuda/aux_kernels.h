// The CUDA tests' own kernels (aux_kernels.cu: C++17 like the backend; the tests are host C++20).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

namespace k3cudatest {
// dst = src, written ~spin_cycles after the kernel starts; it first lets a pdl-launched successor begin (pdl.cuh).
cudaError_t late_copy(float* dst, const float* src, int64_t n, long long spin_cycles, cudaStream_t s);
// dst = src, launched with pdl::launch and WITHOUT waiting: what a kernel that breaks pdl.cuh's contract reads.
cudaError_t early_read(float* dst, const float* src, int64_t n, cudaStream_t s);
// Reads `bytes` (a multiple of 16) from p in 16-byte loads, grid-stride over `blocks` blocks of 256 threads, and
// writes one word per block to sink (so the loads are kept): the DRAM floor of a kernel of that size.
cudaError_t read_bytes(const void* p, int64_t bytes, int blocks, uint32_t* sink, cudaStream_t s);
bool pdl_enabled();  // k3::cuda::pdl::enabled()
}  // namespace k3cudatest
