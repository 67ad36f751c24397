// Timing of the CPU kernels, disabled by default; run with scripts/bench-kda.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/mla_attention.h"

namespace {

std::vector<float> rnd(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& a : x) a = u(rng);
  return x;
}

template <class F>
double best_ms(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

TEST(KernelBench, DISABLED_Timing) {
  const int D = 128;
  for (int H : {8}) {
    for (int T : {1, 64, 512}) {
      const std::size_t n = std::size_t(T) * H * D;
      auto q = rnd(n, -0.01f, 0.01f, 1), k = rnd(n, -0.09f, 0.09f, 2), v = rnd(n, -1, 1, 3),
           g = rnd(n, -5.f, -0.01f, 4), b = rnd(std::size_t(T) * H, 0.1f, 0.9f, 5),
           s0 = rnd(std::size_t(H) * D * D, -0.3f, 0.3f, 6);
      std::vector<float> st(s0), out(n);
      const double tr = best_ms(3, [&] {
        st = s0;
        k3::cpu::kda_recurrent(T, H, D, q.data(), k.data(), v.data(), g.data(), b.data(), st.data(), out.data());
      });
      const double tc = best_ms(3, [&] {
        st = s0;
        k3::cpu::kda_chunked(T, H, D, 64, q.data(), k.data(), v.data(), g.data(), b.data(), st.data(), out.data());
      });
      std::printf("KDA H=%d D=%d T=%4d: recurrent %8.3f ms (%.1f us/token/head)  chunked(64) %8.3f ms (%.1f us/token/head)\n",
                  H, D, T, tr, 1e3 * tr / (T * H), tc, 1e3 * tc / (T * H));
    }
  }
  {
    const int nh = 24, kr = 512, dr = 64;
    for (int S : {1024, 4096}) {
      auto ql = rnd(std::size_t(nh) * (kr + dr), -0.1f, 0.1f, 7), cache = rnd(std::size_t(S) * (kr + dr), -1, 1, 8);
      std::vector<float> out(std::size_t(nh) * kr);
      const double t = best_ms(5, [&] {
        k3::cpu::mla_attention_latent(1, S - 1, nh, kr, dr, ql.data(), cache.data(), 0.072f, out.data());
      });
      std::printf("MLA latent decode nh=%d kr=%d dr=%d S=%d: %.3f ms\n", nh, kr, dr, S, t);
    }
    const int T = 256, dn = 128, dv = 128;
    auto q = rnd(std::size_t(T) * nh * (dn + dr), -0.1f, 0.1f, 9), kn = rnd(std::size_t(T) * nh * dn, -1, 1, 10),
         kp = rnd(std::size_t(T) * dr, -1, 1, 11), v = rnd(std::size_t(T) * nh * dv, -1, 1, 12);
    std::vector<float> out(std::size_t(T) * nh * dv);
    const double t = best_ms(3, [&] {
      k3::cpu::mla_attention_mha(T, 0, nh, dn, dr, dv, q.data(), kn.data(), kp.data(), v.data(), 0.072f, out.data());
    });
    std::printf("MLA mha prefill nh=%d T=%d: %.3f ms\n", nh, T, t);
  }
}
