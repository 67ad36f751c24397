// One core's speed of the absorbed-MLA projections through kv_b (k3::cpu::mla_absorb_q_head: q_lat = q . kv_b's key
// rows, mla_up_v_head: o = kv_b's value rows . o_lat), bf16 kv_b streamed from DRAM (64 layers of 16 heads x 256 x 512
// rotated: 256 MB), for the question whether the MLA op of a CPU decode step (session 32's profile: 12 GB/s) is bound by
// these two loops (docs/perf/cpu.md, session 33).
//   g++ -O2 -std=c++20 -Isrc scripts/perf/mla_absorb_speed.cpp build/release/libk3.a -lpthread -lpcre2-8 -o mab
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <vector>
#include "k3/backend/cpu/mla_absorb.h"
int main(int argc, char** argv) {
  // argv[1]: layers in rotation (default 64 = 256 MB, from DRAM; 1 = 4 MB: from L2 / L3, the loops' own speed)
  const int64_t heads = 16, nope = 128, value = 128, rank = 512, rope = 64, layers = std::clamp(argc > 1 ? std::atoi(argv[1]) : 64, 1, 1024);
  const int64_t per_layer = heads * (nope + value) * rank;
  std::vector<uint16_t> kvb(static_cast<size_t>(per_layer * layers));
  std::mt19937 rng(1);
  for (auto& v : kvb) v = static_cast<uint16_t>(0x3c00 + (rng() & 0x3ff));  // finite bf16 values
  std::vector<float> q(nope + rope, 0.5f), qlat(rank + rope), olat(rank, 0.25f), o(value);
  for (const char* what : {"absorb_q", "up_v", "both"}) {
    double best = 1e9;
    for (int rep = 0; rep < (layers < 8 ? 200 : 5); ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t l = 0; l < layers; ++l) {
        k3::cpu::KvB k;
        k.bf16 = kvb.data() + l * per_layer;
        k.nope = nope, k.value = value, k.rank = rank;
        for (int64_t h = 0; h < heads; ++h) {
          if (what[0] != 'u') k3::cpu::mla_absorb_q_head(k, h, rope, q.data(), qlat.data());
          if (what[0] != 'a') k3::cpu::mla_up_v_head(k, h, olat.data(), o.data());
        }
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double bytes = static_cast<double>(layers * heads * (what[0] == 'b' ? nope + value : nope) * rank * 2);
    std::printf("%-9s %7.2f us per layer (16 heads)  %5.1f GB/s of kv_b  (check %g %g)\n", what, best / layers * 1e6,
                bytes / best / 1e9, static_cast<double>(qlat[7]), static_cast<double>(o[3]));
  }
}
