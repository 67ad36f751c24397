// One core's speed of the exact row decoder (k3::cpu::dequant_row) on 4096 x 512 matrices (1.2 MB of Q4_K: from
// cache), for the question whether an absorbed MLA form could decode kv_b per token (docs/perf/cpu.md, session 32).
//   g++ -O2 -std=c++20 -Isrc scripts/perf/dequant_row_speed.cpp build/release/libk3.a -lpthread -lpcre2-8 -o dq
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
#include "k3/backend/cpu/ops.h"
#include "k3/core/weight_format.h"
int main() {
  using namespace k3;
  for (WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q6_K, WeightFormat::Q8_0}) {
    const int64_t rows = 4096, cols = 512;
    const auto l = weight_layout(f);
    std::vector<uint8_t> b(rows * cols / l.block_elems * l.block_bytes);
    std::mt19937 rng(1); for (auto& v : b) v = rng() & 0x3f;  // small bytes: finite f16 scales
    WeightMatrix W{f, b.data(), nullptr, rows, cols, kHostDevice};
    std::vector<float> out(cols);
    double best = 1e9;
    for (int rep = 0; rep < 5; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t r = 0; r < rows; ++r) cpu::dequant_row(W, r, out.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("%s: %.2f Gweights/s one core (%.2f ms for 2.1M)\n", weight_format_name(f), rows * cols / best / 1e9, 2.1e6 / (rows * cols / best) * 1e3);
  }
}
