// One core's rate of the one-token (decode) weight products from cache: an R x C matrix multiplied by one token again
// and again through k3::cpu::matmul (the tier chosen at start-up; K3_NUM_THREADS=1), for the question whether a
// product is bound by DRAM or by the core's arithmetic (docs/perf/cpu.md, session 34). Also the exact dequant's rate.
//   g++ -O2 -std=c++20 -Isrc scripts/perf/one_token_rate.cpp build/release/libk3.a -lpthread -lpcre2-8 -o otr
//   K3_NUM_THREADS=1 ./otr 512 2048 [TOKENS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/quant/gguf_quant.h"
namespace {
template <class F>
double best_s(int64_t work, F&& f) {
  const int reps = static_cast<int>(std::max<int64_t>(1, 100000000 / std::max<int64_t>(1, work)));
  double best = 1e9;
  for (int t = 0; t < 7; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
  }
  return best;
}
}  // namespace
int main(int argc, char** argv) {
  const int64_t N = std::clamp(argc > 3 ? atoll(argv[3]) : 1LL, 1LL, 64LL);  // tokens (argv[3]): the tile path from 2
  const int64_t R = std::max(8LL, argc > 1 ? atoll(argv[1]) : 512), C = std::max(32LL, argc > 2 ? atoll(argv[2]) : 2048);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(N * C)), y(static_cast<size_t>(N * R));
  for (auto& v : x) v = nd(rng);
  using k3::WeightFormat;
  for (WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q6_K, WeightFormat::Q5_K, WeightFormat::Q8_0, WeightFormat::Q5_0,
                         WeightFormat::MXFP4, WeightFormat::MXFP4_GGML, WeightFormat::BF16}) {
    if (C % k3::weight_layout(f).block_elems != 0) continue;  // rows must be whole blocks
    std::vector<uint8_t> b(static_cast<size_t>(R * k3::row_data_bytes(f, C))), s(static_cast<size_t>(R * k3::row_scale_bytes(f, C)));
    if (k3::quant::is_gguf_block_format(f)) {
      std::vector<float> w(static_cast<size_t>(R * C));
      for (auto& v : w) v = nd(rng);
      k3::quant::quantize_row(f, w.data(), R * C, nullptr, b.data());
    } else if (f == WeightFormat::BF16) {  // values near 1
      for (size_t i = 0; i < b.size(); i += 2) b[i] = static_cast<uint8_t>(rng()), b[i + 1] = static_cast<uint8_t>(0x3c + rng() % 4);
    } else {  // MXFP4: random codes, E8M0 scales near 1 (ggml's blocks carry theirs every 17 bytes)
      for (auto& v : b) v = static_cast<uint8_t>(rng());
      for (auto& v : s) v = static_cast<uint8_t>(120 + rng() % 8);
      if (f == WeightFormat::MXFP4_GGML)
        for (size_t i = 0; i < b.size(); i += 17) b[i] = static_cast<uint8_t>(120 + rng() % 8);
    }
    const k3::WeightMatrix W{f, b.data(), s.empty() ? nullptr : s.data(), R, C};
    const double t = best_s(N * R * C, [&] { k3::cpu::matmul(W, x.data(), N, y.data()); });
    std::printf("%-10s %lld x %lld, %lld token(s): %8.2f us (%7.2f a token)  %5.1f GB/s", k3::weight_format_name(f), static_cast<long long>(R),
                static_cast<long long>(C), static_cast<long long>(N), t * 1e6, t * 1e6 / N, static_cast<double>(W.bytes()) / t / 1e9);
    if (k3::quant::is_gguf_block_format(f)) {  // the exact dequant, 4096 values a call (mla_absorb's pieces)
      std::vector<float> out(4096);
      const int64_t n = R * C;
      const double td = best_s(n, [&] {
        for (int64_t i = 0; i + 4096 <= n; i += 4096) {
          const k3::WeightMatrix v{f, b.data() + k3::row_data_bytes(f, i), nullptr, 1, 4096};
          k3::cpu::row_kernels(f).dequant(v, 0, out.data());
        }
      });
      std::printf("   dequant %5.2f values / ns", static_cast<double>(n / 4096 * 4096) / td / 1e9);
    }
    std::printf("\n");
  }
}
