// One token through one MXFP4 matrix (R x C, random nibbles, E8M0 scales 2^-7..2^0), repeated: the tier's one-token
// kernel with the matrix in L2 / L3, K3_MXFP4_ONE_TOKEN=tile vs the default for the A/B (docs/perf/cpu.md session 25).
// Against the release library (the tier is the CPU's default unless K3_CPU_ISA says otherwise):
//   g++ -O2 -std=c++20 -Isrc scripts/perf/mxfp4_one_token_bench.cpp build/release/libk3.a -lpthread -o /tmp/mx1
//   K3_NUM_THREADS=1 /tmp/mx1 [reps [rows [cols]]]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "k3/backend/cpu/ops.h"
#include "k3/core/weight.h"

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int64_t R = argc > 2 ? std::atoll(argv[2]) : 8192, C = argc > 3 ? std::atoll(argv[3]) : 2048;
  if (reps < 1 || R < 1 || C < 32 || C % 32 != 0) {
    std::fprintf(stderr, "usage: mx1 [reps >= 1 [rows >= 1 [cols, a multiple of 32]]]\n");
    return 2;
  }
  std::vector<uint8_t> data(static_cast<size_t>(R * C / 2)), sc(static_cast<size_t>(R * C / 32));
  std::mt19937 rng(1);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (auto& b : sc) b = static_cast<uint8_t>(120 + rng() % 8);
  k3::WeightMatrix W;
  W.format = k3::WeightFormat::MXFP4;
  W.data = data.data();
  W.scales = sc.data();
  W.rows = R;
  W.cols = C;
  std::vector<float> x(static_cast<size_t>(C)), y(static_cast<size_t>(R));
  for (auto& v : x) v = static_cast<float>(rng() % 1000) / 500.0f - 1.0f;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) k3::cpu::matmul(W, x.data(), 1, y.data());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
  std::printf("%lldx%lld: %.3f ms, %.1f GB/s, y[0] %g\n", static_cast<long long>(R), static_cast<long long>(C), ms,
              static_cast<double>(data.size() + sc.size()) / ms / 1e6, y[0]);
}
