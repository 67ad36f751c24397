// Timing of the CPU kernels, disabled by default; run with scripts/bench-kda.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <algorithm>
#include <atomic>
#include <random>
#include <vector>

#include "k3/backend/cpu/kda.h"
#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/backend/cpu/ops.h"
#include "k3/bench/memory_bandwidth.h"
#include "k3/core/thread_pool.h"
#include "k3/core/weight.h"
#include "k3/quant/gguf_quant.h"
#include "k3/sampling/token_sampling.h"
#include "quant_test_ref.h"

namespace {

std::vector<float> rnd(std::size_t n, float lo, float hi, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> x(n);
  for (auto& a : x) a = u(rng);
  return x;
}

// K3_BENCH_CPU_TIME=1 (with K3_NUM_THREADS=1): the calling thread's CPU time instead of wall time, and
// K3_BENCH_REPS times the repetitions: on a box shared with other builds the best of many short runs of
// CPU time is far steadier than wall time (a run that lost its core to another process counts only
// what it ran).
double now_ms() {
  static const bool cpu = std::getenv("K3_BENCH_CPU_TIME") != nullptr;
  if (!cpu) return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

// Random weights of the right format for timing (not for numerics): bf16 bit patterns of moderate normal values;
// any byte is a valid E2M1 pair; MXFP4 scales near 2^0. The matrix points into `bytes` / `scales`.
k3::WeightMatrix random_weights(k3::WeightFormat f, int64_t rows, int64_t cols, std::mt19937& rng,
                                std::vector<uint8_t>& bytes, std::vector<uint8_t>& scales) {
  bytes.resize(static_cast<size_t>(rows * k3::row_data_bytes(f, cols)));
  scales.resize(static_cast<size_t>(rows * k3::row_scale_bytes(f, cols)));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(f == k3::WeightFormat::BF16 && i % 2 ? 0x3c + rng() % 4 : rng());
  for (auto& b : scales) b = static_cast<uint8_t>(120 + rng() % 8);
  // Block formats with their scales inside the blocks: valid blocks as the kernel tests make them (finite,
  // normal f16 scales), so that the timed weights are ones a file could hold; ggml's MXFP4 blocks get E8M0
  // scales as the HF layout's above.
  if (k3::quant::is_gguf_block_format(f)) bytes = k3test::random_blocks(f, rows * cols / k3::weight_layout(f).block_elems, rng, 10, 16);
  if (f == k3::WeightFormat::MXFP4_GGML)
    for (size_t b = 0; b < bytes.size(); b += 17) bytes[b] = static_cast<uint8_t>(120 + rng() % 8);
  k3::WeightMatrix W;
  W.format = f;
  W.rows = rows;
  W.cols = cols;
  W.data = bytes.data();
  W.scales = scales.data();
  return W;
}

template <class F>
double best_ms(int reps, F&& f) {
  static const int scale = std::getenv("K3_BENCH_REPS") ? std::max(1, std::atoi(std::getenv("K3_BENCH_REPS"))) : 1;
  double best = 1e30;
  for (int r = 0; r < reps * scale; ++r) {
    const double t0 = now_ms();
    f();
    best = std::min(best, now_ms() - t0);
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

// The CPU matmul at the k3-1b prefill shapes (docs/perf/cpu/prefill-gemm.md): BF16 dense projections and
// MXFP4 routed experts (gate/up 768x1024, down 1024x768; ~16 tokens per expert at pp128, ~64 at pp512),
// n tokens in one call vs the same n tokens one at a time (the GEMV path). Weights are random bytes of
// the right format (timing only). Run with
// `k3_tests --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_Matmul'` (K3_NUM_THREADS).
TEST(KernelBench, DISABLED_Matmul) {
  struct Shape {
    const char* what;
    k3::WeightFormat f;
    int64_t rows, cols, n;
  };
  const Shape shapes[] = {{"bf16 q/o-like 2048x2048", k3::WeightFormat::BF16, 2048, 2048, 128},
                          {"bf16 q/o-like 2048x2048", k3::WeightFormat::BF16, 2048, 2048, 512},  // pp512's n
                          {"bf16 mlp up 5632x2048", k3::WeightFormat::BF16, 5632, 2048, 128},
                          {"bf16 mlp down 2048x5632", k3::WeightFormat::BF16, 2048, 5632, 128},
                          {"mxfp4 expert up 768x1024", k3::WeightFormat::MXFP4, 768, 1024, 16},
                          {"mxfp4 expert up 768x1024", k3::WeightFormat::MXFP4, 768, 1024, 64},
                          {"mxfp4 expert down 1024x768", k3::WeightFormat::MXFP4, 1024, 768, 64},
                          // kl-1b's experts take the full hidden width (docs/perf/cpu/llama-peer.md)
                          {"mxfp4 kl expert up 384x2048", k3::WeightFormat::MXFP4, 384, 2048, 64},
                          {"mxfp4 kl expert down 2048x384", k3::WeightFormat::MXFP4, 2048, 384, 64}};
  std::mt19937 rng(3);
  for (const Shape& s : shapes) {
    std::vector<uint8_t> bytes, scales;
    const k3::WeightMatrix W = random_weights(s.f, s.rows, s.cols, rng, bytes, scales);
    const auto x = rnd(static_cast<size_t>(s.n * s.cols), -1, 1, 4);
    std::vector<float> y(static_cast<size_t>(s.n * s.rows));
    const double tb = best_ms(5, [&] { k3::cpu::matmul(W, x.data(), s.n, y.data()); });
    const double t1 = best_ms(2, [&] {
      for (int64_t t = 0; t < s.n; ++t) k3::cpu::matmul(W, x.data() + t * s.cols, 1, y.data() + t * s.rows);
    });
    const double gflop = 2e-9 * static_cast<double>(s.rows * s.cols * s.n);
    std::printf("matmul %-28s n=%3lld: batched %8.3f ms (%6.1f GFLOP/s)  one token at a time %8.3f ms (%6.1f GFLOP/s)\n",
                s.what, static_cast<long long>(s.n), tb, gflop / tb * 1e3, t1, gflop / t1 * 1e3);
  }
}

// The 16-row MXFP4 repack (backend/cpu/mxfp4_rowblocks.h, session 52) against the tier's one-token product on the same
// matrix, one thread each, in L2 and far beyond the caches: `K3_CPU_ISA=avx512bf16 K3_NUM_THREADS=1 k3_tests
// --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_Mxfp4RowBlocks'` (GB/s of stored bytes).
TEST(KernelBench, DISABLED_Mxfp4RowBlocks) {
  if (!k3::cpu::mxfp4_rowblocks_cpu_ok()) GTEST_SKIP() << "this CPU lacks AVX2 + FMA";
  std::mt19937 rng(5);
  for (const int64_t rows : {int64_t{256}, int64_t{32768}}) {
    const int64_t cols = 2304;
    std::vector<uint8_t> bytes, scales;
    const k3::WeightMatrix W = random_weights(k3::WeightFormat::MXFP4, rows, cols, rng, bytes, scales);
    std::vector<uint8_t> copy(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_bytes(W)));
    k3::cpu::mxfp4_rowblocks_write(W, copy.data());
    k3::WeightMatrix Wc = W;
    Wc.tiled = copy.data();
    const auto x = rnd(static_cast<size_t>(cols), -1, 1, 6);
    std::vector<float> y(static_cast<size_t>(rows));
    const int reps = rows <= 256 ? 400 : 10;
    const double t_tier = best_ms(reps, [&] { k3::cpu::matmul(W, x.data(), 1, y.data()); });
    std::vector<uint8_t> act(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_act_bytes(cols)));
    const double t_rb = best_ms(reps, [&] {  // the activations' quantisation included, as in the tier's product
      k3::cpu::mxfp4_rowblocks_prepare(x.data(), 1, cols, act.data());
      k3::cpu::mxfp4_rowblocks_rows(Wc, 0, rows, act.data(), 1, y.data(), rows);
    });
    const double gb = static_cast<double>(W.bytes()) * 1e-9;
    std::printf("mxfp4 one token %lldx%lld (%s): tier %7.3f ms %6.1f GB/s  rowblocks %7.3f ms %6.1f GB/s  (%.2fx)\n",
                static_cast<long long>(rows), static_cast<long long>(cols), rows <= 256 ? "in L2" : "DRAM", t_tier,
                gb / t_tier * 1e3, t_rb, gb / t_rb * 1e3, t_tier / t_rb);
  }
}

// Decode's two kernels against the read bandwidth, in one run: one token through a BF16 matrix (268 MB) and an
// MXFP4 one of the same shape (71 MB with its scales), both far beyond the caches, on the compute pool, next to `k3 bench memory`'s read of 1 GiB. GB/s of stored bytes and % of the read rate: what
// separates a batch-1 decode step from its DRAM bound (docs/perf/cpu.md, "Session 13"). Run with
// `k3_tests --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_DecodeStream'` (K3_NUM_THREADS; the tests run the exact tier unless K3_CPU_ISA names another, e.g. avx2int8).
TEST(KernelBench, DISABLED_DecodeStream) {
  const k3::bench::BandwidthResult bw = k3::bench::measure_read_bandwidth(size_t{1} << 30, 5);
  std::printf("read bandwidth (k3 bench memory): best %.1f GB/s, %d threads\n", bw.best_gb_s, bw.threads);
  std::mt19937 rng(9);
  struct Case {
    k3::WeightFormat f;
    int64_t rows, cols;
  };
  // The GGUF decode formats too (a Q4_K_M file's Q4_K / Q6_K and ggml-layout MXFP4 experts). K3_STREAM_ROWS=8192
  // keeps the matrices (9-34 MB) in a 32 MB L3: the kernels' compute ceiling, against which the DRAM rows say how
  // far each is from being bound by its arithmetic. Rows: a multiple of 256 in [256, 262144], else the default.
  const char* rows_env = std::getenv("K3_STREAM_ROWS");
  const long long asked = rows_env ? std::atoll(rows_env) : 0;
  const int64_t R = asked >= 256 && asked <= 262144 && asked % 256 == 0 ? asked : 65536;
  for (const Case& c : {Case{k3::WeightFormat::BF16, R, 2048}, Case{k3::WeightFormat::MXFP4, R, 2048},
                        Case{k3::WeightFormat::MXFP4_GGML, R, 2048}, Case{k3::WeightFormat::Q4_K, R, 2048},
                        Case{k3::WeightFormat::Q6_K, R, 2048}}) {
    std::vector<uint8_t> bytes, scales;
    const k3::WeightMatrix W = random_weights(c.f, c.rows, c.cols, rng, bytes, scales);
    const auto x = rnd(static_cast<size_t>(c.cols), -1, 1, 4);
    std::vector<float> y(static_cast<size_t>(c.rows));
    const double ms = best_ms(R < 65536 ? 50 : 5, [&] { k3::cpu::matmul(W, x.data(), 1, y.data()); });
    const double gb = static_cast<double>(bytes.size() + scales.size()) / (ms * 1e6);
    std::printf("one token %-6s %lldx%lld (%.0f MB): %.2f ms, %.1f GB/s = %.0f%% of the read rate\n", k3::weight_format_name(c.f),
                static_cast<long long>(c.rows), static_cast<long long>(c.cols), (bytes.size() + scales.size()) / 1e6, ms, gb,
                100.0 * gb / bw.best_gb_s);
  }
}

// One decode token through a routed-expert layer the size of kl-1b's (E MXFP4 experts of 384 x 2048, 8 routed,
// a different 8 each call as decode does, so the weights come from DRAM): the two stages in one fork-join
// (matmul_two_stage, what CpuBackend::moe_experts runs at decode) and in two (matmul_batch twice), against the
// bytes the 8 experts hold and the read bandwidth (docs/perf/cpu.md, session 25). Run with
// `K3_CPU_ISA=avx512bf16 K3_NUM_THREADS=N k3_tests --gtest_also_run_disabled_tests
// --gtest_filter='KernelBench.DISABLED_MoeDecodeLayer'` (without K3_CPU_ISA the tests run the exact tier).
TEST(KernelBench, DISABLED_MoeDecodeLayer) {
  const k3::bench::BandwidthResult bw = k3::bench::measure_read_bandwidth(size_t{1} << 30, 3);
  std::printf("read bandwidth (k3 bench memory): best %.1f GB/s, %d threads\n", bw.best_gb_s, bw.threads);
  // K3_MOE_BENCH_EXPERTS (default 64: 80 MB, in a server's L3; 512: 640 MB, from DRAM).
  const char* ee = std::getenv("K3_MOE_BENCH_EXPERTS");
  const int E = std::clamp(ee ? std::atoi(ee) : 64, 8, 4096);
  constexpr int K = 8;
  constexpr int64_t X = 2048, I = 384;
  std::mt19937 rng(11);
  struct Ex {
    std::vector<uint8_t> b[3], s[3], copy[3];
    k3::WeightMatrix W[3], Wc[3];  // Wc: W with its decode copy (mxfp4_rowblocks.h), as add_expert_decode_layouts makes
  };
  std::vector<Ex> ex(E);
  const bool copies = k3::cpu::mxfp4_rowblocks_cpu_ok();
  for (Ex& e : ex)
    for (int m = 0; m < 3; ++m) {
      e.W[m] = m < 2 ? random_weights(k3::WeightFormat::MXFP4, I, X, rng, e.b[m], e.s[m])
                     : random_weights(k3::WeightFormat::MXFP4, X, I, rng, e.b[m], e.s[m]);
      e.Wc[m] = e.W[m];
      if (!copies) continue;
      e.copy[m].resize(static_cast<size_t>(k3::cpu::mxfp4_rowblocks_bytes(e.W[m])));
      k3::cpu::mxfp4_rowblocks_write(e.W[m], e.copy[m].data());
      e.Wc[m].tiled = e.copy[m].data();
    }
  const int64_t expert_bytes = ex[0].W[0].bytes() + ex[0].W[1].bytes() + ex[0].W[2].bytes();
  const auto x = rnd(X, -1, 1, 3);
  std::vector<float> g(K * I), u(K * I), y(K * X);
  // 2: one fork-join reading the decode copies (where this CPU has their product); 1: one fork-join; 0: two
  for (int two_stage = copies ? 2 : 1; two_stage >= 0; --two_stage) {
    int call = 0;
    const double ms = best_ms(200, [&] {
      std::vector<k3::cpu::MatmulJob> gu, dn;
      for (int k = 0; k < K; ++k) {
        const Ex& e = ex[static_cast<size_t>((call * K + k) % E)];
        const k3::WeightMatrix* W = two_stage == 2 ? e.Wc : e.W;
        gu.push_back({&W[0], x.data(), 1, g.data() + k * I});
        gu.push_back({&W[1], x.data(), 1, u.data() + k * I});
        dn.push_back({&W[2], g.data() + k * I, 1, y.data() + k * X});
      }
      ++call;
      auto glu = [&](int k) {
        for (int64_t i = 0; i < I; ++i) g[static_cast<size_t>(k * I + i)] *= u[static_cast<size_t>(k * I + i)];
      };
      if (two_stage) {
        std::vector<int> gg(2 * K), dg(K);
        for (int i = 0; i < 2 * K; ++i) gg[static_cast<size_t>(i)] = i / 2;
        for (int i = 0; i < K; ++i) dg[static_cast<size_t>(i)] = i;
        k3::cpu::matmul_two_stage(gu, gg, dn, dg, K, glu);
      } else {
        k3::cpu::matmul_batch(gu);
        for (int k = 0; k < K; ++k) glu(k);
        k3::cpu::matmul_batch(dn);
      }
    });
    const double gb = static_cast<double>(K * expert_bytes) / (ms * 1e6);
    std::printf("moe decode layer (%d of %d MXFP4 experts %lldx%lld, %.1f MB) %s: %.1f us, %.1f GB/s = %.0f%% of the read rate\n",
                K, E, static_cast<long long>(I), static_cast<long long>(X), K * expert_bytes / 1e6,
                two_stage == 2 ? "decode copies, one fork-join" : two_stage ? "one fork-join (matmul_two_stage)" : "two fork-joins (matmul_batch)", ms * 1e3, gb,
                100.0 * gb / bw.best_gb_s);
  }
}

// What one decode-sized projection costs at the pool's size, weights cycled through enough copies to come from DRAM
// (as a decode step reads them): median us per call against the time its bytes take at the read rate, for the
// shapes of kl-1b's step (router 64 x 2048, KDA low-rank gates 2048 x 128 / 128 x 2048, MLA 384 x 2048, the
// 2048 x 2048 projections, the dense GLU) and an empty fork-join. Says which ops are bound by latency (the pool's
// hand-over, a chunk's start) rather than bytes at 16 threads (docs/perf/cpu.md, session 26). Run with
// `K3_CPU_ISA=amx K3_NUM_THREADS=16 k3_tests --gtest_also_run_disabled_tests
// --gtest_filter='KernelBench.DISABLED_DecodeOpLatency'`.
TEST(KernelBench, DISABLED_DecodeOpLatency) {
  const k3::bench::BandwidthResult bw = k3::bench::measure_read_bandwidth(size_t{1} << 30, 3);
  std::printf("read bandwidth (k3 bench memory): best %.1f GB/s, %d threads\n", bw.best_gb_s, bw.threads);
  auto median_us = [](int reps, auto&& f) {
    std::vector<double> t(static_cast<size_t>(reps));
    for (auto& v : t) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      v = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
    return t[static_cast<size_t>(reps / 2)];
  };
  auto& pool = k3::ThreadPool::global();
  std::atomic<int64_t> sink{0};
  const double fj = median_us(2000, [&] {
    pool.parallel_for(pool.size(), 1, [&](int64_t b, int64_t, int) { sink.fetch_add(b, std::memory_order_relaxed); });
  });
  std::printf("empty fork-join over %d threads: %.2f us (median of 2000)\n", pool.size(), fj);
  std::mt19937 rng(12);
  struct Shape {
    const char* what;
    int64_t rows, cols;
  };
  for (const Shape& c : {Shape{"router", 64, 2048}, Shape{"KDA gate down", 128, 2048}, Shape{"KDA gate up", 2048, 128},
                         Shape{"MLA q/kv down", 384, 2048}, Shape{"2048 x 2048", 2048, 2048},
                         Shape{"dense GLU down", 2048, 5632}}) {
    std::vector<uint8_t> bytes, scales;
    const k3::WeightMatrix W0 = random_weights(k3::WeightFormat::BF16, c.rows, c.cols, rng, bytes, scales);
    // Copies of the same bytes (a fresh buffer each) so that the cycle exceeds any L3: ~768 MB.
    const size_t nb = bytes.size(), copies = std::clamp<size_t>((size_t{768} << 20) / nb, 1, 4096);
    std::vector<uint8_t> all(nb * copies);
    for (size_t i = 0; i < copies; ++i) std::copy(bytes.begin(), bytes.end(), all.begin() + static_cast<std::ptrdiff_t>(i * nb));
    std::vector<k3::WeightMatrix> Ws(copies, W0);
    for (size_t i = 0; i < copies; ++i) Ws[i].data = all.data() + i * nb;
    const auto x = rnd(static_cast<size_t>(c.cols), -1, 1, 5);
    std::vector<float> y(static_cast<size_t>(c.rows));
    size_t next = 0;
    const double us = median_us(std::max<int>(200, static_cast<int>(copies)), [&] {
      k3::cpu::matmul(Ws[next], x.data(), 1, y.data());
      next = (next + 1) % copies;
    });
    const double ideal = static_cast<double>(nb) / (bw.best_gb_s * 1e3);
    std::printf("%-15s %5lldx%-5lld BF16 (%6.0f KB): %7.1f us (%5.1f GB/s), at the read rate %6.1f us: %4.1fx\n", c.what,
                static_cast<long long>(c.rows), static_cast<long long>(c.cols), nb / 1024.0, us, nb / (us * 1e3), ideal,
                us / ideal);
  }
}

// Host sampling of one row at the K3 vocabulary (sampling::sample_row), on a peaked row (32 ids raised by 14
// over Gaussian sd 2) and a flat one (Gaussian sd 3: top-p 0.9 keeps ~10k ids). Run with
// `k3_tests --gtest_also_run_disabled_tests --gtest_filter='KernelBench.DISABLED_Sampling'`.
TEST(KernelBench, DISABLED_Sampling) {
  const std::size_t V = 163840;
  for (int flat = 0; flat < 2; ++flat) {
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.f, flat ? 3.f : 2.f);
    std::vector<float> base(V);
    for (auto& x : base) x = nd(rng);
    if (!flat)
      for (int j = 0; j < 32; ++j) base[rng() % V] += 14.f;
    struct Mode { const char* name; float T; int k; float p; };
    for (const Mode m : {Mode{"greedy", 0.f, 0, 1.f}, Mode{"T=1", 1.f, 0, 1.f}, Mode{"T=1 top-p 0.9", 1.f, 0, 0.9f},
                         Mode{"T=1 top-k 50 top-p 0.9", 1.f, 50, 0.9f}}) {
      k3::sampling::RowSampling r;
      r.temperature = m.T;
      r.top_k = m.k;
      r.top_p = m.p;
      r.u = 0.5;
      std::vector<float> x;
      const double ms = best_ms(10, [&] {
        x = base;
        k3::sampling::sample_row(x, r);
      });
      std::printf("sample_row V=%zu %-6s %-24s %8.3f ms\n", V, flat ? "flat" : "peaked", m.name, ms);
    }
  }
}
