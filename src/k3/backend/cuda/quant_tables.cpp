// iq_tables(): the CPU's codebooks (quant/iq_tables.h) copied once per device.
#include "k3/backend/cuda/quant_tables.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/quant/iq_tables.h"

namespace k3::cuda {

namespace {

// One allocation holding every table, each at an 8-byte aligned offset.
IqTables upload_tables() {
  struct Src {
    const void* p;
    size_t bytes;
  };
  using namespace k3::quant;
  const Src src[] = {{kIq4nlValues, sizeof(kIq4nlValues)}, {kIq2Signs, sizeof(kIq2Signs)}, {kIq2xxsGrid, sizeof(kIq2xxsGrid)},
                     {kIq2xsGrid, sizeof(kIq2xsGrid)},     {kIq2sGrid, sizeof(kIq2sGrid)}, {kIq3xxsGrid, sizeof(kIq3xxsGrid)},
                     {kIq3sGrid, sizeof(kIq3sGrid)},       {kIq1sGrid, sizeof(kIq1sGrid)}};
  size_t off[8], total = 0;
  for (int i = 0; i < 8; ++i) {
    off[i] = total;
    total += (src[i].bytes + 7) / 8 * 8;
  }
  std::vector<uint8_t> host(total, 0);
  for (int i = 0; i < 8; ++i) std::memcpy(host.data() + off[i], src[i].p, src[i].bytes);
  void* dev = nullptr;
  K3_CUDA_CHECK(cudaMalloc(&dev, total));  // never freed: the kernels may run until the process ends
  K3_CUDA_CHECK(cudaMemcpy(dev, host.data(), total, cudaMemcpyHostToDevice));
  const auto* b = static_cast<const uint8_t*>(dev);
  IqTables t;
  t.iq4nl = reinterpret_cast<const int8_t*>(b + off[0]);
  t.signs = b + off[1];
  t.iq2xxs = reinterpret_cast<const uint64_t*>(b + off[2]);
  t.iq2xs = reinterpret_cast<const uint64_t*>(b + off[3]);
  t.iq2s = reinterpret_cast<const uint64_t*>(b + off[4]);
  t.iq3xxs = reinterpret_cast<const uint32_t*>(b + off[5]);
  t.iq3s = reinterpret_cast<const uint32_t*>(b + off[6]);
  t.iq1s = reinterpret_cast<const uint64_t*>(b + off[7]);
  return t;
}

}  // namespace

IqTables iq_tables() {
  static std::mutex mu;
  static std::map<int, IqTables> per_device;
  int dev = 0;
  K3_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  auto it = per_device.find(dev);
  if (it == per_device.end()) it = per_device.emplace(dev, upload_tables()).first;
  return it->second;
}

}  // namespace k3::cuda
