// One core's speed of the absorbed-MLA projections through kv_b (k3::cpu::mla_absorb_q_head: q_lat = q . kv_b's key
// rows, mla_up_v_head: o = kv_b's value rows . o_lat), kv_b streamed from DRAM (64 layers of 16 heads x 256 x 512
// rotated), for the question whether the MLA op of a CPU decode step is bound by these two loops (docs/perf/cpu.md,
// sessions 33-34). Storage (argv[2]): bf16 (an HF checkpoint's kv_b), f32 (the fp32 rebuild of a GGUF's quantised
// halves), q (those halves as stored, llama-quantize's Q4_K_M types: attn_k_b Q5_0, attn_v_b Q4_K).
//   g++ -O2 -std=c++20 -Isrc scripts/perf/mla_absorb_speed.cpp build/release/libk3.a -lpthread -lpcre2-8 -o mab
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <random>
#include <string>
#include <vector>
#include "k3/backend/cpu/mla_absorb.h"
#include "k3/quant/gguf_quant.h"
int main(int argc, char** argv) {
  // argv[1]: layers in rotation (default 64, from DRAM; 1: from L2 / L3, the loops' own speed)
  const int64_t heads = 16, nope = 128, value = 128, rank = 512, rope = 64, layers = std::clamp(argc > 1 ? std::atoi(argv[1]) : 64, 1, 1024);
  const std::string mode = argc > 2 ? argv[2] : "bf16";
  const int64_t per_layer = heads * (nope + value) * rank;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<uint16_t> b16;
  std::vector<float> f32;
  std::vector<uint8_t> kq, vq;
  const k3::WeightFormat fk = k3::WeightFormat::Q5_0, fv = k3::WeightFormat::Q4_K;
  const int64_t kbytes = k3::row_data_bytes(fk, nope) * heads * rank, vbytes = k3::row_data_bytes(fv, rank) * heads * value;
  if (mode == "bf16") {
    b16.resize(static_cast<size_t>(per_layer * layers));
    for (auto& v : b16) v = static_cast<uint16_t>(0x3c00 + (rng() & 0x3ff));  // finite bf16 values
  } else if (mode == "f32") {
    f32.resize(static_cast<size_t>(per_layer * layers));
    for (auto& v : f32) v = nd(rng);
  } else if (mode == "q") {
    std::vector<float> k(static_cast<size_t>(heads * rank * nope)), v(static_cast<size_t>(heads * value * rank));
    kq.resize(static_cast<size_t>(kbytes * layers)), vq.resize(static_cast<size_t>(vbytes * layers));
    for (int64_t l = 0; l < layers; ++l) {
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      k3::quant::quantize_row(fk, k.data(), static_cast<int64_t>(k.size()), nullptr, kq.data() + l * kbytes);
      k3::quant::quantize_row(fv, v.data(), static_cast<int64_t>(v.size()), nullptr, vq.data() + l * vbytes);
    }
  } else {
    std::fprintf(stderr, "usage: mab [LAYERS] [bf16|f32|q]\n");
    return 2;
  }
  std::vector<float> q(nope + rope, 0.5f), qlat(rank + rope), olat(rank, 0.25f), o(value);
  for (const char* what : {"absorb_q", "up_v", "both"}) {
    double best = 1e9;
    for (int rep = 0; rep < (layers < 8 ? 200 : 5); ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t l = 0; l < layers; ++l) {
        k3::cpu::KvB k;
        k.nope = nope, k.value = value, k.rank = rank;
        const k3::WeightMatrix kb{fk, kq.data() + l * kbytes, nullptr, heads * rank, nope},
            vb{fv, vq.data() + l * vbytes, nullptr, heads * value, rank};
        if (mode == "bf16") k.bf16 = b16.data() + l * per_layer;
        if (mode == "f32") k.f32 = f32.data() + l * per_layer;
        if (mode == "q") k.k_b = &kb, k.v_b = &vb;
        for (int64_t h = 0; h < heads; ++h) {
          if (what[0] != 'u') k3::cpu::mla_absorb_q_head(k, h, rope, q.data(), qlat.data());
          if (what[0] != 'a') k3::cpu::mla_up_v_head(k, h, olat.data(), o.data());
        }
      }
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    const double es = mode == "bf16" ? 2 : 4;
    const double bytes = mode == "q" ? static_cast<double>(layers * ((what[0] != 'u' ? kbytes : 0) + (what[0] != 'a' ? vbytes : 0)))
                                     : static_cast<double>(layers * heads * (what[0] == 'b' ? nope + value : nope) * rank) * es;
    std::printf("%-5s %-9s %7.2f us per layer (16 heads)  %5.1f GB/s of kv_b as stored  (check %g %g)\n", mode.c_str(), what,
                best / layers * 1e6, bytes / best / 1e9, static_cast<double>(qlat[7]), static_cast<double>(o[3]));
  }
}
