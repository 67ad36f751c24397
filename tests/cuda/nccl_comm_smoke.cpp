// NcclComm on one GPU with one rank (the bootstrap a LocalComm): every collective runs on device buffers
// and gives the one-rank answer. Not a CTest (the CPU CI has no GPU); by hand on a GPU machine:
//   g++ -std=c++20 -Isrc -I$CUDA/include tests/cuda/nccl_comm_smoke.cpp src/k3/dist/nccl_comm.cpp
//       src/k3/dist/local_comm.cpp -L$CUDA/lib64 -lnccl -lcudart && ./a.out
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "k3/dist/nccl_comm.h"

namespace {
int fails = 0;
void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAIL", what);
  if (!ok) ++fails;
}
}  // namespace

int main() {
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  auto boot = k3::dist::make_local_comm();
  auto nccl = k3::dist::make_nccl_comm(*boot, 0, stream);
  expect(nccl->size() == 1 && nccl->rank() == 0 && nccl->name() == "nccl", "one rank");
  const size_t n = 4096;
  std::vector<float> h(n), back(n);
  for (size_t i = 0; i < n; ++i) h[i] = 0.25f * static_cast<float>(i) - 100.f;
  float *a = nullptr, *b = nullptr;
  cudaMalloc(&a, n * sizeof(float));
  cudaMalloc(&b, n * sizeof(float));
  cudaMemcpy(a, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  nccl->all_reduce_sum(a, n);
  cudaStreamSynchronize(stream);
  cudaMemcpy(back.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost);
  expect(back == h, "all_reduce_sum over one rank is the identity");
  cudaMemset(b, 0, n * sizeof(float));
  nccl->all_gather(a, n * sizeof(float), b);
  cudaStreamSynchronize(stream);
  cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  expect(back == h, "all_gather");
  nccl->broadcast(a, n * sizeof(float), 0);
  cudaMemset(b, 0, n * sizeof(float));
  const size_t bytes[1] = {n * sizeof(float)};
  nccl->all_to_all_v(a, bytes, b, bytes);
  cudaStreamSynchronize(stream);
  cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  expect(back == h, "broadcast + all_to_all_v");
  nccl->barrier();
  expect(cudaGetLastError() == cudaSuccess, "no CUDA error");
  nccl.reset();
  cudaFree(a);
  cudaFree(b);
  std::printf("%s\n", fails ? "NCCL smoke: FAILED" : "NCCL smoke: all ok");
  return fails ? 1 : 0;
}
