// Timing of the CPU kernels of GGUF's block formats (docs/quantization.md), disabled by default. Run with
// `k3_tests --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_QuantMatmul'`
// (K3_NUM_THREADS sets the threads; K3_BENCH_TIERS=avx2,avx2int8,avx512,avx512bf16 the tiers, default every tier
// this CPU has; K3_BENCH_FORMATS=Q4_K,Q6_K the formats, default all; K3_BENCH_ROWS the rows, default 4096:
// 16384 puts a Q4_K matrix (37 MB) beyond a 32 MB L3, so that n=1 reads DRAM; K3_BENCH_COPIES rotates the one-token
// product over copies: small matrices read from DRAM, as in a decode step; K3_BENCH_DECODE_LAYOUT=1 gives Q4_K matrices
// their 16-row copy, backend/cpu/decode_layout.h, which the avx512bf16 tier's one-token product then reads).
// A 4096 x 4096 matrix of random valid blocks: one token (matrix-vector, reading the weights from DRAM:
// GB/s of weight bytes) and 64 tokens (the register-blocked gemm: GFLOP/s), best of 5.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/decode_layout.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/weight.h"
#include "quant_test_ref.h"

namespace {

template <class F>
double best_ms(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

TEST(KernelBench, DISABLED_QuantMatmul) {
  const char* rows_env = std::getenv("K3_BENCH_ROWS");
  // K3_BENCH_COLS: the row width (a multiple of 32; 4096 unless set; formats whose block does not divide it are left
  // out): e.g. 128 for the short rows of Kimi-Linear's low-rank KDA ups (4096 x 128, Q5_0 in a Q4_K_M GGUF).
  const char* cols_env = std::getenv("K3_BENCH_COLS");
  const int64_t rows = rows_env ? std::max<int64_t>(256, std::atoll(rows_env)) : 4096,
                cols = cols_env ? std::max<int64_t>(32, std::atoll(cols_env) / 32 * 32) : 4096;
  std::mt19937 rng(3);
  std::vector<float> x(static_cast<size_t>(64 * cols));
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& v : x) v = u(rng);
  std::vector<float> y(static_cast<size_t>(64 * rows));
  const char* tiers_env = std::getenv("K3_BENCH_TIERS");
  const std::string tiers = tiers_env ? tiers_env : "avx2,avx2int8,avx512,avx512bf16";
  const char* formats_env = std::getenv("K3_BENCH_FORMATS");
  std::vector<k3::WeightFormat> formats(std::begin(k3test::kGgufFormats), std::end(k3test::kGgufFormats));
  formats.push_back(k3::WeightFormat::BF16);
  auto listed = [](const std::string& list, const std::string& name) {
    return ("," + list + ",").find("," + name + ",") != std::string::npos;
  };
  for (k3::cpu::CpuIsa isa : {k3::cpu::CpuIsa::Avx2, k3::cpu::CpuIsa::Avx2Int8, k3::cpu::CpuIsa::Avx512, k3::cpu::CpuIsa::Avx512Bf16}) {
    if (!listed(tiers, k3::cpu::isa_name(isa))) continue;
    if (!k3::cpu::isa_missing_features(k3::cpu::cpu_state().features, isa, false).empty()) continue;
    k3::cpu::force_cpu_isa_for_testing(isa);
    for (k3::WeightFormat f : formats) {
      if (formats_env && !listed(formats_env, k3::weight_format_name(f))) continue;
      if (f != k3::WeightFormat::BF16 && cols % k3::weight_layout(f).block_elems != 0) continue;
      std::vector<uint8_t> bytes;
      if (f == k3::WeightFormat::BF16) {
        bytes.resize(static_cast<size_t>(rows * cols * 2));
        for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i % 2 ? 0x3c + rng() % 4 : rng());
      } else {
        bytes = k3test::random_blocks(f, rows * cols / k3::weight_layout(f).block_elems, rng, 10, 16);
      }
      const k3::WeightMatrix W{f, bytes.data(), nullptr, rows, cols};
      // K3_BENCH_COPIES=c: the one-token product rotates over c copies of the matrix (c x its bytes past the L3:
      // a decode step's small matrices, each read from DRAM once), timed as the mean over 4c calls.
      const char* copies_env = std::getenv("K3_BENCH_COPIES");
      const int copies = copies_env ? static_cast<int>(std::clamp(std::strtol(copies_env, nullptr, 10), 1L, 4096L)) : 1;
      std::vector<std::vector<uint8_t>> extra(static_cast<size_t>(copies - 1), bytes);
      std::vector<k3::WeightMatrix> Ws{W};
      for (const auto& e : extra) Ws.push_back(k3::WeightMatrix{f, e.data(), nullptr, rows, cols});
      const char* layout_env = std::getenv("K3_BENCH_DECODE_LAYOUT");
      std::vector<std::vector<uint8_t>> layouts;
      if (layout_env && layout_env[0] == '1' && f == k3::WeightFormat::Q4_K)
        for (auto& m : Ws) {
          layouts.emplace_back(static_cast<size_t>(k3::cpu::decode_layout_bytes(m)));
          k3::cpu::make_decode_layout(m, layouts.back().data());
          m.tiled = layouts.back().data();
        }
      const double t1 = copies == 1 ? best_ms(5, [&] { k3::cpu::matmul(Ws[0], x.data(), 1, y.data()); })
                                    : best_ms(1, [&] {
                                        for (int r = 0; r < 4 * copies; ++r) k3::cpu::matmul(Ws[r % copies], x.data(), 1, y.data());
                                      }) / (4 * copies);
      const double t64 = best_ms(5, [&] { k3::cpu::matmul(W, x.data(), 64, y.data()); });
      const double flop = 2.0 * rows * cols;
      std::printf("%-10s %-7s n=1: %7.3f ms %6.1f GB/s %6.1f GFLOP/s | n=64: %8.3f ms %6.1f GFLOP/s\n", k3::cpu::isa_name(isa),
                  k3::weight_format_name(f), t1, W.bytes() / t1 * 1e-6, flop / t1 * 1e-6, t64, 64 * flop / t64 * 1e-6);
    }
    k3::cpu::force_cpu_isa_for_testing(std::nullopt);
  }
}
