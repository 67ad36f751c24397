// Stand-alone check and timing of the Tiled form of the K-quant tensor-core GEMV (src/k3/backend/cuda/quant_mma_tiled.cuh,
// through quant_mma.h) against the KSplit kernel, the rule without a tiled copy and (one token) the fp32 block GEMV, on
// the same random blocks: bitwise equality of Q6_K's one-tile-per-block form with KSplit (MT = 1), the largest
// difference of every form against KSplit relative to max |y|, and us / GB/s (stored bytes) with L2 flushed before each call.
//   nvcc -O3 -std=c++20 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Isrc -Itests/cuda scripts/perf/q6k_tiled_bench.cu \
//     src/k3/backend/cuda/quant_gemv_mma.cu src/k3/backend/cuda/quant_gemv.cu src/k3/backend/cuda/quant_tables.cpp \
//     src/k3/quant/iq_tables.cpp -o q6k_tiled_bench
//   q6k_tiled_bench q4_k|q5_k|q6_k ROWS COLS N [SPLIT=1] [REPS=20]
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "quant_test_blocks.h"  // tests/cuda
#include "k3/backend/cuda/quant_kernels.h"
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
    std::fprintf(stderr, "usage: %s q4_k|q5_k|q6_k ROWS COLS N [SPLIT] [REPS]\n", argv[0]);
    return 2;
  }
  const std::string fs = argv[1];
  const k3::WeightFormat f = fs == "q4_k" ? k3::WeightFormat::Q4_K : fs == "q5_k" ? k3::WeightFormat::Q5_K : k3::WeightFormat::Q6_K;
  const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]);
  const int n = std::atoi(argv[4]), reps = argc > 6 ? std::atoi(argv[6]) : 20;
  const bool split = argc > 5 ? std::atoi(argv[5]) != 0 : true;
  if (n < 1 || n > 16 || cols % 256 != 0) return 2;
  // the CUDA tests' random blocks: every byte random, the f16 scales finite with exponents 2^-10 .. 2^-5
  const std::vector<uint8_t> wb = k3quanttest::random_blocks(f, rows, cols, 1, 5, 10);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd01(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd01(rng);
  uint8_t *dw, *dt;
  float *dx, *dy, *dy2, *dsum;
  uint16_t *dh, *dl;
  char* flush;
  ck(cudaMalloc(&dw, wb.size()), "malloc");
  ck(cudaMalloc(&dx, x.size() * 4), "malloc");
  ck(cudaMalloc(&dy, static_cast<size_t>(n * rows) * 4), "malloc");
  ck(cudaMalloc(&dy2, static_cast<size_t>(n * rows) * 4), "malloc");
  ck(cudaMalloc(&dh, x.size() * 2), "malloc");
  ck(cudaMalloc(&dl, x.size() * 2), "malloc");
  ck(cudaMalloc(&dsum, static_cast<size_t>(k3::cuda::quant_mma_ldx(n) * (cols / 32)) * 4), "malloc");
  ck(cudaMalloc(&flush, size_t{256} << 20), "malloc");
  ck(cudaMemcpy(dw, wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
  ck(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "H2D");
  const k3::WeightMatrix W{f, dw, nullptr, rows, cols, 0};
  ck(cudaMalloc(&dt, static_cast<size_t>(k3::cuda::quant_mma_tiled_bytes(W))), "malloc");
  ck(k3::cuda::quant_mma_make_tiled(W, dt, nullptr), "make tiled");
  k3::WeightMatrix WT = W;
  WT.tiled = dt;
  ck(k3::cuda::quant_mma_prep(dx, n, cols, dh, split ? dl : nullptr, dsum, nullptr), "prep");
  const k3::cuda::QuantMmaActs a{dh, split ? dl : nullptr, dsum, n, cols};
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  auto time = [&](const std::function<cudaError_t()>& fn) {
    ck(fn(), "warm-up");
    float total = 0;
    for (int i = 0; i < reps; ++i) {
      ck(cudaMemsetAsync(flush, i, size_t{256} << 20, nullptr), "flush");
      ck(cudaEventRecord(e0, nullptr), "record");
      ck(fn(), "run");
      ck(cudaEventRecord(e1, nullptr), "record");
      ck(cudaEventSynchronize(e1), "sync");
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      total += ms;
    }
    return 1000.0 * total / reps;
  };
  const size_t ny = static_cast<size_t>(n * rows);
  std::vector<float> ref(ny), got(ny);
  ck(k3::cuda::quant_gemv_mma(W, a, dy, nullptr, 1, k3::cuda::QuantMmaForm::KSplit), "ksplit");
  ck(cudaMemcpy(ref.data(), dy, ny * 4, cudaMemcpyDeviceToHost), "D2H");
  double ymax = 0;
  for (float v : ref) ymax = std::fmax(ymax, std::fabs(v));
  const char* sp = split ? "hi+lo" : "hi";
  auto report = [&](const char* name, double us) {
    ck(cudaMemcpy(got.data(), dy2, ny * 4, cudaMemcpyDeviceToHost), "D2H");
    size_t diff = 0;
    double dmax = 0;
    for (size_t i = 0; i < ny; ++i) {
      diff += std::memcmp(&got[i], &ref[i], 4) != 0;
      dmax = std::fmax(dmax, std::fabs(static_cast<double>(got[i]) - ref[i]));
    }
    std::printf("%s %lld x %lld n=%d %s %-12s %8.1f us %6.0f GB/s  differing %zu / %zu  max|d|/max|y| %.2e\n", fs.c_str(),
                static_cast<long long>(rows), static_cast<long long>(cols), n, sp, name, us,
                static_cast<double>(wb.size()) / (us * 1e3), diff, ny, dmax / ymax);
  };
  report("ksplit-mt1", time([&] { return k3::cuda::quant_gemv_mma(W, a, dy2, nullptr, 1, k3::cuda::QuantMmaForm::KSplit); }));
  report("rule", time([&] { return k3::cuda::quant_gemv_mma(W, a, dy2, nullptr); }));  // no tiled copy; Rows without k slices
  if (n == 1) report("fp32-gemv", time([&] { return k3::cuda::quant_gemv(W, dx, 1, dy2, nullptr); }));
  for (int tpb : {1, 2, 4, 8}) {
    char name[16];
    std::snprintf(name, sizeof name, "tiled-tpb%d", tpb);
    report(name, time([&] { return k3::cuda::quant_gemv_mma(WT, a, dy2, nullptr, tpb, k3::cuda::QuantMmaForm::Tiled); }));
  }
  return 0;
}
