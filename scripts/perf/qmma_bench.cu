// Stand-alone timing of the tensor-core block GEMV (src/k3/backend/cuda/quant_gemv_mma.cu) for device calls that
// profile it under ncu without building the whole tree (the 64 MiB carry cap leaves no room for the test binary
// beside other payloads). Random blocks (f16 scales overwritten with finite values), x ~ N(0, 1), L2 flushed before
// each call; prints us and GB/s of stored blocks per shape and tile width.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Isrc \
//     scripts/perf/qmma_bench.cu src/k3/backend/cuda/quant_gemv_mma.cu -o qmma_bench
//   qmma_bench FORMAT ROWS COLS N [MT=0] [SPLIT=1] [REPS=20]      FORMAT: q4_k | q5_k | q6_k (MT 0: the rule)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cuda/quant_mma.h"
#include "k3/core/weight_format.h"

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s q4_k|q5_k|q6_k ROWS COLS N [MT] [SPLIT] [REPS]\n", argv[0]);
    return 2;
  }
  const std::string fs = argv[1];
  const k3::WeightFormat f = fs == "q4_k" ? k3::WeightFormat::Q4_K : fs == "q5_k" ? k3::WeightFormat::Q5_K : k3::WeightFormat::Q6_K;
  const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]);
  const int n = std::atoi(argv[4]), mt = argc > 5 ? std::atoi(argv[5]) : 0,
            reps = argc > 7 ? std::atoi(argv[7]) : 20;
  const bool split = argc > 6 ? std::atoi(argv[6]) != 0 : true;
  const k3::WeightLayout l = k3::weight_layout(f);
  const int64_t blocks = rows * cols / l.block_elems;
  std::vector<uint8_t> wb(static_cast<size_t>(blocks * l.block_bytes));
  std::mt19937 rng(1);
  for (auto& b : wb) b = static_cast<uint8_t>(rng());
  const int d_off = f == k3::WeightFormat::Q6_K ? 208 : 0, nd = f == k3::WeightFormat::Q6_K ? 1 : 2;
  for (int64_t i = 0; i < blocks; ++i)
    for (int k = 0; k < nd; ++k) {
      const uint16_t h = static_cast<uint16_t>(((rng() & 1) << 15) | ((5 + rng() % 6) << 10) | (rng() & 0x3FF));
      std::memcpy(wb.data() + i * l.block_bytes + d_off + 2 * k, &h, 2);
    }
  std::normal_distribution<float> nd01(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd01(rng);
  uint8_t* dw;
  float *dx, *dy, *dsum;
  uint16_t *dh, *dl;
  char* flush;
  ck(cudaMalloc(&dw, wb.size()), "malloc");
  ck(cudaMalloc(&dx, x.size() * 4), "malloc");
  ck(cudaMalloc(&dy, static_cast<size_t>(n * rows) * 4), "malloc");
  ck(cudaMalloc(&dh, x.size() * 2), "malloc");
  ck(cudaMalloc(&dl, x.size() * 2), "malloc");
  ck(cudaMalloc(&dsum, static_cast<size_t>(k3::cuda::quant_mma_ldx(n) * (cols / 32)) * 4), "malloc");
  ck(cudaMalloc(&flush, size_t{256} << 20), "malloc");
  ck(cudaMemcpy(dw, wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
  ck(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "H2D");
  ck(k3::cuda::quant_mma_prep(dx, n, cols, dh, split ? dl : nullptr, dsum, nullptr), "prep");
  const k3::WeightMatrix W{f, dw, nullptr, rows, cols, 0};
  const k3::cuda::QuantMmaActs a{dh, split ? dl : nullptr, dsum, n, cols};
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  ck(k3::cuda::quant_gemv_mma(W, a, dy, nullptr, mt), "warm-up");
  float total = 0;
  for (int i = 0; i < reps; ++i) {
    ck(cudaMemsetAsync(flush, i, size_t{256} << 20, nullptr), "flush");
    ck(cudaEventRecord(e0, nullptr), "record");
    ck(k3::cuda::quant_gemv_mma(W, a, dy, nullptr, mt), "gemv");
    ck(cudaEventRecord(e1, nullptr), "record");
    ck(cudaEventSynchronize(e1), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
    total += ms;
  }
  const double us = 1000.0 * total / reps;
  std::printf("qmma %s %lld x %lld n=%d mt=%d %s: %.1f us %.0f GB/s\n", fs.c_str(), static_cast<long long>(rows),
              static_cast<long long>(cols), n, mt, split ? "hi+lo" : "hi", us, static_cast<double>(wb.size()) / (us * 1e3));
  return 0;
}
