// Routed experts stacked as GGUF blocks on the GPU, both paths, against a float64 MoE over the CPU's
// dequantised experts (SiLU GLU, rank-order weighted sum):
//  - quant_moe_experts (quant_moe.h, the decode path: exact fp32 decode and products) within 1e-4 of the
//    outputs' range, including a token routed twice to one expert and a down stack in another format (Q6_K
//    beside Q4_K gate / up, as llama-quantize's Q4_K_M has in some layers: ExpertStack::down_format);
//  - moe_experts' tensor-core tiles over the same blocks (moe_tc_tile.cuh, the prefill path: weights
//    decoded exactly, then weights and activations rounded to bf16, fp32 accumulation) for every GGUF
//    format, within 1e-2 of the range (bf16 rounding is 2^-9 relative per factor; a mis-decoded group or
//    row is off by the range itself), with an expert holding more than one 64-pair tile and widths that
//    leave partial N tiles;
//  - the decode tiles on the tensor cores (quant_moe_mma: 8-pair tiles, the dense block GEMV's kernel per expert)
//    within 1e-4 of the range with x as bf16 hi + lo, 1e-2 with x as bf16 alone, beside the fp32 grouped kernels;
//  - the paths' time at the Kimi-Linear-48B shape (256 experts of 2304 x 1024, top 8; Q4_K gate / up,
//    Q6_K down, llama-quantize's Q4_K_M) over batch sizes, for quant_moe_choice's thresholds (docs/perf).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/backend/cuda/quant_moe.h"
#include "k3/backend/cuda/quant_tables.h"
#include "quant_test_blocks.h"

namespace {

using k3::WeightFormat;
using k3cudatest::ck;
using k3cudatest::Dev;
using namespace k3quanttest;

// One MoE problem: blocks, inputs, routing, and (when asked) the float64 reference.
struct MoeCase {
  WeightFormat f = WeightFormat::Q4_K, fd = WeightFormat::Q4_K;
  int E = 0, I = 0, X = 0, K = 0, n = 0;
  std::vector<uint8_t> gb, ub, db;
  std::vector<float> x, wts;
  std::vector<int32_t> idx;
  std::vector<double> ref;
  double range = 0;
};

// Random routing: K distinct experts per token in random order, expert 0 forced into every token's picks
// when `hot` (so it gets n pairs: more than one 64-pair tile once n > 64).
std::vector<int32_t> random_routing(int n, int K, int E, bool hot, std::mt19937& rng) {
  std::vector<int32_t> idx;
  std::vector<int32_t> ids(E);
  for (int t = 0; t < n; ++t) {
    for (int e = 0; e < E; ++e) ids[e] = e;
    std::shuffle(ids.begin(), ids.end(), rng);
    if (hot && std::find(ids.begin(), ids.begin() + K, 0) == ids.begin() + K) ids[rng() % K] = 0;
    idx.insert(idx.end(), ids.begin(), ids.begin() + K);
  }
  return idx;
}

MoeCase make_case(WeightFormat f, WeightFormat fd, int E, int I, int X, int K, int n, uint32_t seed) {
  MoeCase c;
  c.f = f, c.fd = fd, c.E = E, c.I = I, c.X = X, c.K = K, c.n = n;
  c.gb = random_blocks(f, int64_t{E} * I, X, seed + 1, 6, 10);
  c.ub = random_blocks(f, int64_t{E} * I, X, seed + 2, 6, 10);
  c.db = random_blocks(fd, int64_t{E} * X, I, seed + 3, 6, 10);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  c.x.resize(static_cast<size_t>(n) * X);
  c.wts.resize(static_cast<size_t>(n) * K);
  for (auto& v : c.x) v = nd(rng);
  for (auto& v : c.wts) v = 0.1f + 0.3f * std::fabs(nd(rng));
  c.idx = random_routing(n, K, E, true, rng);
  return c;
}

void compute_reference(MoeCase& c) {
  const int E = c.E, I = c.I, X = c.X, K = c.K;
  const auto g = cpu_rows(host_matrix(c.f, c.gb, int64_t{E} * I, X)), u = cpu_rows(host_matrix(c.f, c.ub, int64_t{E} * I, X));
  const auto d = cpu_rows(host_matrix(c.fd, c.db, int64_t{E} * X, I));
  c.ref.assign(static_cast<size_t>(c.n) * X, 0.0);
  c.range = 0;
  std::vector<double> h(I);
  for (int t = 0; t < c.n; ++t) {
    const float* xt = c.x.data() + static_cast<size_t>(t) * X;
    for (int k = 0; k < K; ++k) {
      const int e = c.idx[t * K + k];
      for (int i = 0; i < I; ++i) {
        const float* gr = g.data() + (static_cast<size_t>(e) * I + i) * X;
        const float* ur = u.data() + (static_cast<size_t>(e) * I + i) * X;
        double gs = 0, us = 0;
        for (int col = 0; col < X; ++col) gs += static_cast<double>(gr[col]) * xt[col], us += static_cast<double>(ur[col]) * xt[col];
        h[i] = gs / (1.0 + std::exp(-gs)) * us;
      }
      for (int o = 0; o < X; ++o) {
        const float* dr = d.data() + (static_cast<size_t>(e) * X + o) * I;
        double s = 0;
        for (int i = 0; i < I; ++i) s += static_cast<double>(dr[i]) * h[i];
        c.ref[static_cast<size_t>(t) * X + o] += c.wts[t * K + k] * s;
      }
    }
    for (int o = 0; o < X; ++o) c.range = std::max(c.range, std::fabs(c.ref[static_cast<size_t>(t) * X + o]));
  }
}

// The case's blocks and inputs on the device, and one call of either path.
struct DeviceCase {
  Dev<uint8_t> g, u, d;
  Dev<float> x, w, out;
  Dev<int32_t> idx;
  k3::ExpertStack st;
  explicit DeviceCase(const MoeCase& c)
      : g(c.gb), u(c.ub), d(c.db), x(c.x), w(c.wts), out(static_cast<size_t>(c.n) * c.X), idx(c.idx) {
    st.format = c.f;
    st.down_format = c.fd;
    st.gate = g.p, st.up = u.p, st.down = d.p;
    st.E = c.E, st.I = c.I, st.X = c.X;
    k3::cuda::iq_tables();  // the codebooks' one-time upload, outside any timing
  }
  cudaError_t run_gemv(const MoeCase& c, float* hidden) {
    return k3::cuda::quant_moe_experts(st, c.n, c.K, x.p, idx.p, w.p, k3::cuda::GluAct::SiLU, 0.f, 0.f, hidden, out.p, nullptr);
  }
  cudaError_t run_tc(const MoeCase& c, k3::cuda::MoeWorkspace& ws, int n) { return run(c, ws, n, k3::cuda::MoePath::TensorCore); }
  // moe_experts' GGUF paths: TensorCore = the tiles, TcDecode = quant_moe_grouped, Gemv = the per-pair kernels.
  cudaError_t run(const MoeCase& c, k3::cuda::MoeWorkspace& ws, int n, k3::cuda::MoePath path,
                  k3::cuda::MoePrecision precision = k3::cuda::MoePrecision::Bf16) {
    return k3::cuda::moe_experts(st, n, c.K, x.p, idx.p, w.p, k3::cuda::GluAct::SiLU, 0.f, 0.f, out.p, ws, nullptr, precision,
                                 path);
  }
};

double worst_over_range(const MoeCase& c, const std::vector<float>& got) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::isfinite(got[i]) ? std::max(worst, std::fabs(got[i] - c.ref[i])) : INFINITY;
  return worst / c.range;
}

TEST(CudaQuantMoe, PerPairPathMatchesAFloat64Moe) {
  SKIP_WITHOUT_GPU();
  const std::pair<WeightFormat, WeightFormat> cases[] = {{WeightFormat::Q4_K, WeightFormat::Q4_K}, {WeightFormat::Q8_0, WeightFormat::Q8_0},
                                                          {WeightFormat::IQ2_XS, WeightFormat::IQ2_XS}, {WeightFormat::Q4_K, WeightFormat::Q6_K}};
  for (const auto& [f, fd] : cases) {
    MoeCase c = make_case(f, fd, 5, 512, 256, 3, 4, 11);
    c.idx = {0, 4, 2, 3, 3, 1, 1, 0, 4, 2, 2, 2};  // token 3 routed to expert 2 three times
    compute_reference(c);
    DeviceCase dc(c);
    Dev<float> hidden(static_cast<size_t>(c.n) * c.K * c.I);
    dc.out.poison();
    ck(dc.run_gemv(c, hidden.p), "quant_moe_experts");
    ck(cudaDeviceSynchronize(), "sync");
    const double r = worst_over_range(c, dc.out.get());
    std::printf("[ quant moe ] %-7s down %-7s max |gpu - fp64| / range %.2e (range %.3g)\n", k3::weight_format_name(f),
                k3::weight_format_name(fd), r, c.range);
    EXPECT_GT(c.range, 0.0);
    EXPECT_LE(r, 1e-4) << k3::weight_format_name(f) << " / " << k3::weight_format_name(fd);
  }
}

// quant_moe_grouped (moe_experts' TcDecode for GGUF experts): every format with a part decoder, a mixed down stack,
// a Q8_0 width that ends inside a 256-column unit (160), an expert with many 2-pair tiles (expert 0 is in
// every token's picks: 20 pairs), a token routed three times to one expert; exact decode and fp32 products, so
// the per-pair path's bound. Also through moe_experts' Auto rule at one token (the decode step's call).
TEST(CudaQuantMoe, GroupedPathMatchesAFloat64Moe) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    WeightFormat f, fd;
    int E, I, X, K, n;
  };
  const Shape shapes[] = {{WeightFormat::Q4_K, WeightFormat::Q4_K, 5, 512, 256, 3, 20}, {WeightFormat::Q5_K, WeightFormat::Q5_K, 5, 256, 512, 3, 20},
                          {WeightFormat::Q6_K, WeightFormat::Q6_K, 5, 256, 512, 3, 20}, {WeightFormat::IQ4_XS, WeightFormat::IQ4_XS, 5, 256, 256, 2, 20},
                          {WeightFormat::Q8_0, WeightFormat::Q8_0, 4, 96, 160, 2, 20},  {WeightFormat::Q4_K, WeightFormat::Q6_K, 6, 512, 256, 3, 20},
                          {WeightFormat::Q4_K, WeightFormat::Q6_K, 6, 512, 256, 3, 1}};
  for (const Shape& sh : shapes) {
    MoeCase c = make_case(sh.f, sh.fd, sh.E, sh.I, sh.X, sh.K, sh.n, 70 + static_cast<uint32_t>(sh.f));
    if (sh.n == 20) c.idx[3 * sh.K + 1] = c.idx[3 * sh.K + 2] = c.idx[3 * sh.K];  // token 3: one expert K times
    compute_reference(c);
    DeviceCase dc(c);
    k3::cuda::MoeWorkspace ws(c.n, c.K, c.E, c.I, c.X);
    // the tensor-core kernels (K-quants) with x as hi + lo and as bf16 alone, then the fp32 grouped ones
    for (int v : {0, 1, 2})
      for (k3::cuda::MoePath path : {k3::cuda::MoePath::TcDecode, k3::cuda::MoePath::Auto}) {
        if (path == k3::cuda::MoePath::Auto && sh.n != 1) continue;  // Auto: the tiles from 2.5 pairs per expert
        const int mma = v < 2 ? 1 : 0;
        const auto prec = v == 1 ? k3::cuda::MoePrecision::Bf16 : k3::cuda::MoePrecision::Bf16x2;
        k3::cuda::quant_moe_mma_override(mma);
        const bool on_mma = mma == 1 && k3::cuda::quant_moe_mma_supported(dc.st);
        EXPECT_EQ(on_mma, mma == 1 && (sh.f == WeightFormat::Q4_K || sh.f == WeightFormat::Q5_K || sh.f == WeightFormat::Q6_K));
        if (v == 1 && !on_mma) continue;
        dc.out.poison();
        ck(dc.run(c, ws, c.n, path, prec), "moe_experts (GGUF, grouped)");
        ck(cudaDeviceSynchronize(), "sync");
        k3::cuda::quant_moe_mma_override(-1);
        const double r = worst_over_range(c, dc.out.get());
        std::printf("[ quant moe grouped ] %-7s down %-7s E %d I %d X %d K %d n %2d %s %s: max |gpu - fp64| / range %.2e\n",
                    k3::weight_format_name(sh.f), k3::weight_format_name(sh.fd), sh.E, sh.I, sh.X, sh.K, sh.n,
                    path == k3::cuda::MoePath::Auto ? "auto" : "    ", on_mma ? (v == 1 ? "mma bf16  " : "mma bf16x2") : "fp32      ", r);
        EXPECT_GT(c.range, 0.0);
        // x as bf16 alone: 2^-9 relative per product, the tiles' bound; hi + lo (~2^-17) and fp32: the per-pair bound
        EXPECT_LE(r, v == 1 ? 1e-2 : 1e-4) << k3::weight_format_name(sh.f) << " / " << k3::weight_format_name(sh.fd) << " n " << sh.n
                                           << (on_mma ? " tensor cores" : " fp32") << (v == 1 ? " bf16" : "");
      }
  }
}

TEST(CudaQuantMoe, TensorCoreTilesMatchAFloat64MoeForEveryFormat) {
  SKIP_WITHOUT_GPU();
  struct Shape {
    WeightFormat f, fd;
    int E, I, X, K, n;
  };
  std::vector<Shape> shapes;
  for (WeightFormat f : kFormats) shapes.push_back({f, f, 4, 256, 512, 2, 70});  // expert 0: 70 pairs, two tiles
  shapes.push_back({WeightFormat::Q4_K, WeightFormat::Q6_K, 6, 512, 256, 3, 90});  // Q4_K_M's mixed layers
  shapes.push_back({WeightFormat::Q2_K, WeightFormat::Q3_K, 6, 256, 256, 2, 33});
  shapes.push_back({WeightFormat::Q8_0, WeightFormat::Q8_0, 3, 96, 160, 2, 130});  // partial N tiles (96 = 64 + 32)
  shapes.push_back({WeightFormat::IQ4_NL, WeightFormat::Q5_0, 3, 224, 96, 1, 5});  // a few pairs, partial tiles
  for (const Shape& s : shapes) {
    MoeCase c = make_case(s.f, s.fd, s.E, s.I, s.X, s.K, s.n, 40 + static_cast<uint32_t>(s.f));
    compute_reference(c);
    DeviceCase dc(c);
    k3::cuda::MoeWorkspace ws(c.n, c.K, c.E, c.I, c.X);
    dc.out.poison();
    ck(dc.run_tc(c, ws, c.n), "moe_experts (GGUF, tensor cores)");
    ck(cudaDeviceSynchronize(), "sync");
    const double r = worst_over_range(c, dc.out.get());
    std::printf("[ quant moe tc ] %-7s down %-7s E %d I %d X %d K %d n %3d: max |gpu - fp64| / range %.2e\n",
                k3::weight_format_name(s.f), k3::weight_format_name(s.fd), s.E, s.I, s.X, s.K, s.n, r);
    EXPECT_GT(c.range, 0.0);
    EXPECT_LE(r, 1e-2) << k3::weight_format_name(s.f) << " / " << k3::weight_format_name(s.fd);
  }
}

TEST(CudaQuantMoe, PathsRejectWhatTheyCannotRun) {
  SKIP_WITHOUT_GPU();
  MoeCase c = make_case(WeightFormat::Q4_K, WeightFormat::Q4_K, 2, 256, 256, 1, 2, 3);
  DeviceCase dc(c);
  k3::cuda::MoeWorkspace ws(c.n, c.K, c.E, c.I, c.X);
  // GGUF experts have no SIMT tiles; the grouped path (TcDecode) only the formats with a part decoder
  EXPECT_EQ(dc.run(c, ws, c.n, k3::cuda::MoePath::Simt), cudaErrorInvalidValue);
  {
    MoeCase iq = make_case(WeightFormat::IQ2_XS, WeightFormat::IQ2_XS, 2, 256, 256, 1, 2, 4);
    DeviceCase dq(iq);
    EXPECT_FALSE(k3::cuda::quant_moe_grouped_supported(dq.st));
    EXPECT_EQ(dq.run(iq, ws, iq.n, k3::cuda::MoePath::TcDecode), cudaErrorInvalidValue);
    EXPECT_EQ(dq.run(iq, ws, iq.n, k3::cuda::MoePath::Gemv), cudaSuccess);  // the per-pair kernels take every format
  }
  EXPECT_TRUE(k3::cuda::quant_moe_grouped_supported(dc.st));
  k3::cuda::MoeWorkspace ws_odd(c.n, c.K, c.E, c.I, 128);
  k3::ExpertStack odd = dc.st;
  odd.X = 128;  // not whole 256-element Q4_K blocks
  EXPECT_EQ(k3::cuda::moe_experts(odd, c.n, c.K, dc.x.p, dc.idx.p, dc.w.p, k3::cuda::GluAct::SiLU, 0.f, 0.f, dc.out.p, ws_odd,
                                  nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(dc.run_tc(c, ws, c.n), cudaSuccess);
  ck(cudaDeviceSynchronize(), "sync");
}

// Kimi-Linear-48B's expert shape as llama-quantize's Q4_K_M stores it: the per-pair kernels and the tiles over
// batch sizes (L2 flushed before each call), and the two paths' outputs against each other at every size.
TEST(CudaQuantMoe, TimingAtKimiLinearShape) {
  SKIP_WITHOUT_GPU();
  const int E = 256, I = 1024, X = 2304, K = 8, max_n = 2048;
  MoeCase c = make_case(WeightFormat::Q4_K, WeightFormat::Q6_K, E, I, X, K, max_n, 5);
  std::mt19937 rng(6);
  c.idx = random_routing(max_n, K, E, false, rng);
  DeviceCase dc(c);
  k3::cuda::MoeWorkspace ws(max_n, K, E, I, X);
  Dev<float> hidden(static_cast<size_t>(max_n) * K * I);
  Dev<uint8_t> flush(size_t{256} << 20);
  const double bytes = static_cast<double>(c.gb.size() + c.ub.size() + c.db.size());
  cudaEvent_t e0, e1;
  ck(cudaEventCreate(&e0), "event");
  ck(cudaEventCreate(&e1), "event");
  for (int n : {1, 4, 8, 16, 32, 64, 128, 256, 512, 2048}) {
    c.n = n;
    // paths: 0 per-pair, 1 grouped fp32 (within the workspace's decode capacity), 2 tiles, 3 grouped on tensor cores
    float ms[4] = {0, 0, 0, 0};
    const bool grouped = static_cast<int64_t>(n) * K <= 8192;
    const int reps = n >= 512 ? 3 : 5;
    std::vector<float> outs[4];
    for (int path = 0; path < 4; ++path) {
      if ((path == 1 || path == 3) && !grouped) continue;
      k3::cuda::quant_moe_mma_override(path == 3 ? 1 : 0);
      for (int r = 0; r <= reps; ++r) {  // r = 0: warm-up
        ck(cudaMemsetAsync(flush.p, r, flush.n, nullptr), "flush");
        ck(cudaEventRecord(e0, nullptr), "record");
        ck(path == 0   ? dc.run_gemv(c, hidden.p)
           : path == 3 ? dc.run(c, ws, n, k3::cuda::MoePath::TcDecode, k3::cuda::MoePrecision::Bf16x2)
                       : dc.run(c, ws, n, path == 2 ? k3::cuda::MoePath::TensorCore : k3::cuda::MoePath::TcDecode),
           path == 0 ? "per-pair" : path == 1 ? "grouped" : path == 2 ? "tiles" : "grouped mma");
        ck(cudaEventRecord(e1, nullptr), "record");
        ck(cudaEventSynchronize(e1), "sync");
        float t = 0;
        ck(cudaEventElapsedTime(&t, e0, e1), "elapsed");
        if (r > 0) ms[path] += t / reps;
      }
      outs[path] = dc.out.get();
      outs[path].resize(static_cast<size_t>(n) * X);
    }
    k3::cuda::quant_moe_mma_override(-1);
    double diff[4] = {0, 0, 0, 0}, range = 0;
    for (size_t i = 0; i < outs[0].size(); ++i) range = std::max(range, static_cast<double>(std::fabs(outs[0][i])));
    for (int path = 1; path < 4; ++path)
      for (size_t i = 0; i < outs[path].size(); ++i)
        diff[path] = std::isfinite(outs[path][i]) ? std::max(diff[path], static_cast<double>(std::fabs(outs[path][i] - outs[0][i]))) : INFINITY;
    std::printf("[ quant moe timing ] KL Q4_K/Q6_K n %4d (%5.2f pairs/expert): per-pair %8.1f us, grouped %8.1f us, mma %8.1f us, "
                "tiles %8.1f us (grouped %4.0f GB/s, tiles %4.0f GB/s of the stack); max |x - per-pair| / range: grouped %.1e, "
                "mma %.1e, tiles %.1e\n",
                n, static_cast<double>(n) * K / E, 1e3 * ms[0], 1e3 * ms[1], 1e3 * ms[3], 1e3 * ms[2],
                grouped ? bytes / (1e6 * ms[1]) : 0.0, bytes / (1e6 * ms[2]), diff[1] / range, diff[3] / range, diff[2] / range);
    EXPECT_GT(range, 0.0);
    EXPECT_LE(diff[2], 1e-2 * range) << "n=" << n;
    if (grouped) {
      EXPECT_LE(diff[1], 1e-5 * range) << "n=" << n;
      EXPECT_LE(diff[3], 1e-4 * range) << "n=" << n << " (tensor cores: x as bf16 hi + lo)";
    }
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
