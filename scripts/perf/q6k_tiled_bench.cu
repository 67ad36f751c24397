// Stand-alone check and timing of the tile-major Q6_K GEMV (src/k3/backend/cuda/quant_mma_tiled.cuh) against the
// KSplit kernel and the rule of quant_gemv_mma on the same random blocks: bitwise equality of the TPB = 1 form with
// KSplit (MT = 1), the largest difference of every form against it relative to max |y|, and us / GB/s (stored bytes)
// per form with L2 flushed before each call.
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 --expt-relaxed-constexpr -Isrc \
//     scripts/perf/q6k_tiled_bench.cu src/k3/backend/cuda/quant_gemv_mma.cu -o q6k_tiled_bench
//   q6k_tiled_bench ROWS COLS N [SPLIT=1] [REPS=20]
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "k3/backend/cuda/quant_mma.h"
#include "k3/backend/cuda/quant_mma_tiled.cuh"

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <int NT, bool SPLIT>
cudaError_t tiled(int tpb, const uint8_t* tw, int64_t rows, int64_t cols, const k3::cuda::QuantMmaActs& a, float* y) {
  using namespace k3::cuda::qmma;
  const int64_t ldx = k3::cuda::quant_mma_ldx(a.n);
  switch (tpb) {
    case 1: return launch_tiled<NT, SPLIT, 1>(tw, rows, cols, a, ldx, y, nullptr);
    case 2: return launch_tiled<NT, SPLIT, 2>(tw, rows, cols, a, ldx, y, nullptr);
    case 4: return launch_tiled<NT, SPLIT, 4>(tw, rows, cols, a, ldx, y, nullptr);
    default: return launch_tiled<NT, SPLIT, 8>(tw, rows, cols, a, ldx, y, nullptr);
  }
}
template <bool SPLIT>
cudaError_t tiled_n(int tpb, const uint8_t* tw, int64_t rows, int64_t cols, const k3::cuda::QuantMmaActs& a, float* y) {
  if (a.n <= 8) return tiled<1, SPLIT>(tpb, tw, rows, cols, a, y);
  if (a.n <= 16) return tiled<2, SPLIT>(tpb, tw, rows, cols, a, y);
  return tiled<4, SPLIT>(tpb, tw, rows, cols, a, y);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s ROWS COLS N [SPLIT] [REPS]\n", argv[0]);
    return 2;
  }
  const int64_t rows = std::atoll(argv[1]), cols = std::atoll(argv[2]);
  const int n = std::atoi(argv[3]), reps = argc > 5 ? std::atoi(argv[5]) : 20;
  const bool split = argc > 4 ? std::atoi(argv[4]) != 0 : true;
  if (n < 1 || n > 32 || cols % 256 != 0) return 2;
  const k3::WeightFormat f = k3::WeightFormat::Q6_K;
  const k3::WeightLayout l = k3::weight_layout(f);
  const int64_t blocks = rows * cols / l.block_elems;
  std::vector<uint8_t> wb(static_cast<size_t>(blocks * l.block_bytes));
  std::mt19937 rng(1);
  for (auto& b : wb) b = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < blocks; ++i) {
    const uint16_t h = static_cast<uint16_t>(((rng() & 1) << 15) | ((5 + rng() % 6) << 10) | (rng() & 0x3FF));
    std::memcpy(wb.data() + i * l.block_bytes + 208, &h, 2);
  }
  std::normal_distribution<float> nd01(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd01(rng);
  const int64_t tb = k3::cuda::qmma::tiled_bytes(rows, cols), units = cols / 128, tiles = (rows + 15) / 16;
  uint8_t *dw, *dt;
  float *dx, *dy, *dy2, *dsum;
  uint16_t *dh, *dl;
  char* flush;
  ck(cudaMalloc(&dw, wb.size()), "malloc");
  ck(cudaMalloc(&dt, static_cast<size_t>(tb)), "malloc");
  ck(cudaMalloc(&dx, x.size() * 4), "malloc");
  ck(cudaMalloc(&dy, static_cast<size_t>(n * rows) * 4), "malloc");
  ck(cudaMalloc(&dy2, static_cast<size_t>(n * rows) * 4), "malloc");
  ck(cudaMalloc(&dh, x.size() * 2), "malloc");
  ck(cudaMalloc(&dl, x.size() * 2), "malloc");
  ck(cudaMalloc(&dsum, static_cast<size_t>(k3::cuda::quant_mma_ldx(n) * (cols / 32)) * 4), "malloc");
  ck(cudaMalloc(&flush, size_t{256} << 20), "malloc");
  ck(cudaMemcpy(dw, wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
  ck(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "H2D");
  const int64_t items = tiles * units;
  k3::cuda::qmma::q6k_tile_kernel<<<static_cast<unsigned>((items + 7) / 8), 256>>>(dw, rows, static_cast<int64_t>(wb.size() / rows), units, tiles, dt);
  ck(cudaGetLastError(), "tile");
  ck(k3::cuda::quant_mma_prep(dx, n, cols, dh, split ? dl : nullptr, dsum, nullptr), "prep");
  const k3::WeightMatrix W{f, dw, nullptr, rows, cols, 0};
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
    std::printf("q6k %lld x %lld n=%d %s %-12s %8.1f us %6.0f GB/s  differing %zu / %zu  max|d|/max|y| %.2e\n",
                static_cast<long long>(rows), static_cast<long long>(cols), n, sp, name, us, static_cast<double>(wb.size()) / (us * 1e3),
                diff, ny, dmax / ymax);
  };
  report("ksplit-ref", time([&] { return k3::cuda::quant_gemv_mma(W, a, dy2, nullptr, 1, k3::cuda::QuantMmaForm::KSplit); }));
  // the rule (Rows from 8 tokens, without k-slice scratch here)
  report("rule", time([&] { return k3::cuda::quant_gemv_mma(W, a, dy2, nullptr); }));
  for (int tpb : {1, 2, 4, 8}) {
    char name[16];
    std::snprintf(name, sizeof name, "tiled-tpb%d", tpb);
    const double us = time([&] { return split ? tiled_n<true>(tpb, dt, rows, cols, a, dy2) : tiled_n<false>(tpb, dt, rows, cols, a, dy2); });
    report(name, us);
  }
  return 0;
}
