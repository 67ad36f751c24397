// The CUDA kernels of GGUF's block formats (quant_kernels.h) against the CPU's (backend/cpu):
//  - dequantisation of random blocks bit for bit equal to cpu::dequant_row, every format, rows by range and
//    by index (the embedding gather);
//  - the decode GEMV (n = 1..8, and 9..32 in chunks of 8), the tensor-core block GEMV that LinearRunner takes for
//    Q4_K / Q5_K / Q6_K at 2..64 tokens (quant_mma.h: its own bound, quant_mma_bound) and the prefill path (bf16
//    tiles + a tensor-core GEMM, through LinearRunner)
//    against a float64 product of the CPU's dequantised weights, within the fp32 summation bound
//    (cols / 32 + 13) * 2^-24 * sum |w x| times 2 (GEMV: quant_gemv.cu's v1 and v2 kernels) or
//    (2^-9 + 2^-16 + cols * 2^-24) * sum |w x| times 2 (the tiles: bf16 weights, x as bf16 hi + lo, cuBLAS's
//    fp32 sums in its order), on shapes whose rows and columns are
//    not multiples of the kernels' tiles (v2: 4 rows a block, 256-column units; one unit; Q8_0 rows of a
//    partial unit), x at an odd float offset (v1's scalar loads) and blocks at a 2-byte offset (v2's
//    shifted loads for Q8_0 / Q6_K, v1 for the 16- and 8-aligned formats).
// Random blocks: every byte random (quants, sub-scales, signs, grid indices), then the f16 super-block
// scales overwritten with random finite normal values of either sign (random bytes could make NaN / inf).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "quant_test_blocks.h"
#include "k3/backend/cpu/cpu_features.h"
#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_mma.h"
#include "k3/backend/cuda/quant_tables.h"

namespace {

using k3::WeightFormat;
using k3cudatest::ck;
using k3cudatest::Dev;

using namespace k3quanttest;

// A column count that is whole blocks but not a multiple of 256 where the format allows (Q8_0), and rows
// that are not a multiple of the GEMV's 8 warps.
int64_t odd_cols(WeightFormat f, int64_t blocks) { return k3::weight_layout(f).block_elems * blocks; }

TEST(CudaQuantKernels, DequantIsBitExactWithCpu) {
  SKIP_WITHOUT_GPU();
  for (WeightFormat f : kFormats) {
    const int64_t rows = 7, cols = odd_cols(f, k3::weight_layout(f).block_elems == 32 ? 13 : 3);
    const auto blocks = random_blocks(f, rows, cols, 1234 + static_cast<uint32_t>(f), 1, 30);
    const k3::WeightMatrix hw = host_matrix(f, blocks, rows, cols);
    const std::vector<float> ref = cpu_rows(hw);
    int64_t nonzero = 0;
    for (float v : ref) nonzero += v != 0.0f;
    EXPECT_GT(nonzero, static_cast<int64_t>(ref.size()) / 2) << k3::weight_format_name(f);

    Dev<uint8_t> d(blocks);
    k3::WeightMatrix dw = hw;
    dw.data = d.p;
    dw.device = 0;
    Dev<float> out(ref.size());
    out.poison();
    ck(k3::cuda::quant_dequant_rows(dw, 0, nullptr, rows, out.p, cols, nullptr), "dequant");
    ck(cudaDeviceSynchronize(), "sync");
    const auto got = out.get();
    int64_t differ = 0;
    for (size_t i = 0; i < ref.size(); ++i) differ += std::memcmp(&got[i], &ref[i], 4) != 0;
    EXPECT_EQ(differ, 0) << k3::weight_format_name(f) << ": " << differ << " of " << ref.size() << " values differ";

    // By index, into rows wider than cols (the embedding gather: tokens, out.stride).
    const std::vector<int32_t> ids = {5, 0, 6, 5, 2};
    Dev<int32_t> dids(ids);
    const int64_t ld = cols + 8;
    Dev<float> picked(ids.size() * ld);
    picked.poison();
    ck(k3::cuda::quant_dequant_rows(dw, 0, dids.p, static_cast<int64_t>(ids.size()), picked.p, ld, nullptr), "gather");
    ck(cudaDeviceSynchronize(), "sync");
    const auto pg = picked.get();
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(0, std::memcmp(pg.data() + i * ld, ref.data() + ids[i] * cols, static_cast<size_t>(cols) * 4))
          << k3::weight_format_name(f) << " gathered row " << ids[i];
  }
}

TEST(CudaQuantKernels, GemvAndPrefillWithinTheFp32Bound) {
  SKIP_WITHOUT_GPU();
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  {
    // Tiles of at most 4000 weights: the prefill path runs over many row tiles (1..5 rows here), each
    // writing its rows of y in place.
    ::setenv("K3_CUDA_DEQUANT_TILE", "4000", 1);
    k3::cuda::LinearRunner runner(st);
    ::unsetenv("K3_CUDA_DEQUANT_TILE");
    for (WeightFormat f : kFormats) {
      // {5, 16}: 4096 columns of the 256-element formats, where the one-token v3 reads x from shared memory (XS).
      for (const auto& [rows, blocks] : {std::pair<int64_t, int64_t>{37, 3}, {133, 11}, {6, 1}, {5, 16}}) {
        const int64_t cols = odd_cols(f, k3::weight_layout(f).block_elems == 32 ? 8 * blocks + 1 : blocks);
        const auto wb = random_blocks(f, rows, cols, 77 + static_cast<uint32_t>(f) + static_cast<uint32_t>(rows), 4, 10);
        const k3::WeightMatrix hw = host_matrix(f, wb, rows, cols);
        const std::vector<float> w = cpu_rows(hw);
        Dev<uint8_t> d(wb);
        k3::WeightMatrix dw = hw;
        dw.data = d.p;
        dw.device = 0;
        const int64_t max_n = 40;
        std::mt19937 rng(5 + static_cast<uint32_t>(cols));
        std::normal_distribution<float> nd(0.f, 1.f);
        std::vector<float> x(static_cast<size_t>(max_n * cols));
        for (auto& v : x) v = nd(rng);
        Dev<float> dx(x);
        Dev<float> dx_odd(x.size() + 1);  // x one float past a 16-byte boundary: the GEMV's scalar loads
        ck(cudaMemcpy(dx_odd.p + 1, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "H2D");
        const Product p = reference(w, x, rows, cols, max_n);
        Dev<uint8_t> d_odd(wb.size() + 2);  // the blocks 2 bytes past a 16-byte boundary (the API's minimum)
        ck(cudaMemcpy(d_odd.p + 2, wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
        k3::WeightMatrix dw_odd = dw;
        dw_odd.data = d_odd.p + 2;
        for (int64_t n : {1, 2, 3, 4, 5, 6, 7, 8, 9, 19, 33, 40}) {
          Dev<float> y(static_cast<size_t>(n * rows));
          y.poison();
          runner.run(dw, dx.p, n, y.p);
          ck(cudaStreamSynchronize(st), "sync");
          const auto got = y.get();
          Product pn;
          pn.exact.assign(p.exact.begin(), p.exact.begin() + n * rows);
          pn.abs_sum.assign(p.abs_sum.begin(), p.abs_sum.begin() + n * rows);
          const bool mma = k3::cuda::quant_mma_supported(dw) && n >= k3::cuda::LinearRunner::kQuantMmaMinTokens &&
                           n <= k3::cuda::kQuantMmaMaxTokens;
          const bool gemv = !mma && n <= k3::cuda::LinearRunner::kQuantGemvMaxTokens;
          // tiles: weights rounded to bf16 (2^-9 relative = 2^15 units of 2^-24), x split into bf16 hi + lo
          // (2^-17 relative), then cuBLAS's fp32 sums (cols units); the tensor-core block GEMV: quant_mma_bound
          const double k = mma    ? quant_mma_bound(cols, true)
                           : gemv ? static_cast<double>(cols / 32 + 13)
                                  : static_cast<double>(32768 + 256 + cols);
          const double ratio = worst_ratio(got, pn, k);
          EXPECT_LE(ratio, 2.0) << k3::weight_format_name(f) << " " << rows << "x" << cols << " n=" << n
                                << (mma    ? " (tensor-core block GEMV)"
                                    : gemv ? " (GEMV, chunks of 8 tokens)"
                                           : " (bf16 tiles + tensor-core GEMM)");
          if (n == 1 || n == 3) {
            y.poison();
            ck(k3::cuda::linear_gemv(dw, dx_odd.p + 1, static_cast<int>(n), y.p, st), "gemv unaligned x");
            ck(cudaStreamSynchronize(st), "sync");
            EXPECT_LE(worst_ratio(y.get(), pn, k), 2.0) << k3::weight_format_name(f) << " n=" << n << " unaligned x";
          }
          if (n >= 2 && n <= 8) {
            y.poison();
            ck(k3::cuda::quant_gemv(dw_odd, dx.p, static_cast<int>(n), y.p, st), "gemv blocks at +2");
            ck(cudaStreamSynchronize(st), "sync");
            EXPECT_LE(worst_ratio(y.get(), pn, k), 2.0) << k3::weight_format_name(f) << " n=" << n << " blocks at +2 bytes";
          }
          // every kernel of quant_gemv.cu forced (the rule picks one per format and n)
          for (auto kern : {k3::cuda::QuantGemvKernel::V1, k3::cuda::QuantGemvKernel::V2, k3::cuda::QuantGemvKernel::V3,
                            k3::cuda::QuantGemvKernel::V1Rows}) {
            if (n > 8) break;
            for (const k3::WeightMatrix* m : {&dw, &dw_odd}) {
              y.poison();
              ck(k3::cuda::quant_gemv(*m, dx.p, static_cast<int>(n), y.p, st, kern), "gemv (forced kernel)");
              ck(cudaStreamSynchronize(st), "sync");
              EXPECT_LE(worst_ratio(y.get(), pn, k), 2.0) << k3::weight_format_name(f) << " " << rows << "x" << cols << " n=" << n
                                                          << " kernel v" << static_cast<int>(kern) << (m == &dw ? "" : " blocks at +2");
            }
          }
          // v1 with 4 rows per warp keeps v1's bits (each row's fmas and shuffles in v1's order); rows % 4 != 0
          // here (37, 133, 6): the last warp's rows past the end are read, never written. Only n = 8 runs the 4-row
          // kernel (the only instantiation); other n fall back to v1, so those comparisons are trivially equal.
          if (n <= 8) {
            std::vector<float> one[2];
            for (int v = 0; v < 2; ++v) {
              y.poison();
              ck(k3::cuda::quant_gemv(dw, dx.p, static_cast<int>(n), y.p, st,
                                      v == 0 ? k3::cuda::QuantGemvKernel::V1 : k3::cuda::QuantGemvKernel::V1Rows),
                 "gemv v1 / v1 rows");
              ck(cudaStreamSynchronize(st), "sync");
              one[v] = y.get();
            }
            EXPECT_EQ(std::memcmp(one[0].data(), one[1].data(), one[0].size() * 4), 0)
                << k3::weight_format_name(f) << " " << rows << "x" << cols << " n=" << n << ": v1 rows != v1";
          }
        }
      }
    }
  }
  ck(cudaStreamDestroy(st), "stream destroy");
}

// K3-sized rows (4096 x 7168): a spot check of 64 rows against float64 (one token) and the GEMV's time and
// effective bandwidth (stored bytes / time, L2 flushed before each call) at n = 1, 2, 4, 8, printed for
// docs/perf. K3_QUANT_GEMV=v1 in the environment times the v1 kernel for every format (A/B).
// Also the Kimi-Linear head (163840 x 2304 Q6_K, llama-quantize's Q4_K_M: 310 MB, ~40% of a batch-1 decode step in
// session 19's ncu) and each of the v1 / v2 / v3 kernels forced, for the rule (quant_gemv.cu).
TEST(CudaQuantKernels, GemvTimingAtK3Width) {
  SKIP_WITHOUT_GPU();
  Dev<uint8_t> flush(size_t{256} << 20);
  struct Shape {
    WeightFormat f;
    int64_t rows, cols;
  };
  std::vector<Shape> shapes;
  for (WeightFormat f : {WeightFormat::Q8_0, WeightFormat::Q6_K, WeightFormat::Q5_K, WeightFormat::Q4_K, WeightFormat::Q2_K,
                         WeightFormat::IQ4_XS, WeightFormat::IQ2_XXS, WeightFormat::IQ1_M})
    shapes.push_back({f, 4096, 7168});
  shapes.push_back({WeightFormat::Q6_K, 163840, 2304});
  shapes.push_back({WeightFormat::Q4_K, 4096, 2304});
  for (const Shape& sh : shapes) {
    const WeightFormat f = sh.f;
    const int64_t rows = sh.rows, cols = sh.cols;
    const auto wb = random_blocks(f, rows, cols, 21, 4, 10);
    const k3::WeightMatrix hw = host_matrix(f, wb, rows, cols);
    std::mt19937 rng(2);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x(static_cast<size_t>(8 * cols));
    for (auto& v : x) v = nd(rng);
    Dev<uint8_t> d(wb);
    Dev<float> dx(x), y(static_cast<size_t>(8 * rows));
    k3::WeightMatrix dw = hw;
    dw.data = d.p;
    dw.device = 0;
    y.poison();
    ck(k3::cuda::quant_gemv(dw, dx.p, 1, y.p, nullptr), "gemv");
    ck(cudaDeviceSynchronize(), "sync");
    const auto got = y.get();
    std::vector<float> row(static_cast<size_t>(cols));
    double worst = 0;
    for (int64_t r = 0; r < rows; r += 64) {
      k3::cpu::dequant_row(hw, r, row.data());
      double s = 0, a = 0;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(row[c]) * x[c], a += std::fabs(static_cast<double>(row[c]) * x[c]);
      const double err = std::isfinite(got[r]) ? std::fabs(got[r] - s) / (std::ldexp(1.0, -24) * (cols / 32 + 13) * a) : INFINITY;
      worst = std::max(worst, err);
    }
    EXPECT_LE(worst, 2.0) << k3::weight_format_name(f);
    cudaEvent_t e0, e1;
    ck(cudaEventCreate(&e0), "event");
    ck(cudaEventCreate(&e1), "event");
    for (auto kern : {k3::cuda::QuantGemvKernel::Auto, k3::cuda::QuantGemvKernel::V1, k3::cuda::QuantGemvKernel::V1Rows,
                      k3::cuda::QuantGemvKernel::V2, k3::cuda::QuantGemvKernel::V3}) {
      const bool any_format = kern == k3::cuda::QuantGemvKernel::Auto || kern == k3::cuda::QuantGemvKernel::V1 ||
                              kern == k3::cuda::QuantGemvKernel::V1Rows;
      if (!any_format && !k3::cuda::quant_gemv_has_parts(f)) continue;
      std::printf("[ quant gemv ] %-7s %lld x %lld %-4s", k3::weight_format_name(f), static_cast<long long>(rows),
                  static_cast<long long>(cols), kern == k3::cuda::QuantGemvKernel::Auto ? "auto" : kern == k3::cuda::QuantGemvKernel::V1 ? "v1"
                                                 : kern == k3::cuda::QuantGemvKernel::V1Rows ? "v1r4"
                                                 : kern == k3::cuda::QuantGemvKernel::V2 ? "v2" : "v3");
      for (int n : {1, 2, 4, 8}) {
        float total_ms = 0;
        const int reps = rows > 100000 ? 5 : 20;
        for (int i = 0; i < reps; ++i) {
          ck(cudaMemsetAsync(flush.p, i, flush.n, nullptr), "flush");
          ck(cudaEventRecord(e0, nullptr), "record");
          ck(k3::cuda::quant_gemv(dw, dx.p, n, y.p, nullptr, kern), "gemv");
          ck(cudaEventRecord(e1, nullptr), "record");
          ck(cudaEventSynchronize(e1), "sync");
          float ms = 0;
          ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
          total_ms += ms;
        }
        const double us = 1000.0 * total_ms / reps;
        std::printf("  n=%d: %7.1f us %5.0f GB/s", n, us, static_cast<double>(wb.size()) / (us * 1e3));
      }
      std::printf(" (of stored blocks)\n");
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
}

// Bad inputs come back as cudaErrorInvalidValue, never a launch over the wrong bytes.
// quant_gemv_q8 (int8 activations) gives the CPU int8 tiers' bits: avx2int8's K path, which the avx512bf16 and amx tiers
// match bit for bit (the test runs it forced to avx2int8). Q4_K, Q5_K and Q6_K (its blocks at a 2-byte offset: 210-byte
// blocks are only 2-aligned), widths of 1, 9, 16, 28 and 128 blocks (past one batch of kRounds rounds: 4096), 37 rows
// (not a whole block of 8), x with a zero block; through quant_gemv forced to Q8, through the one-token rule
// (force_quant_gemv_q8_for_testing) and through the grouped launch (two matrices); a non-finite x value makes every
// output NaN, as on the CPU.
TEST(CudaQuantKernels, Q8GemvGivesTheCpuInt8TiersBits) {
  SKIP_WITHOUT_GPU();
  const auto& cpu = k3::cpu::cpu_state();
  if (!k3::cpu::isa_missing_features(cpu.features, k3::cpu::CpuIsa::Avx2Int8, false).empty())
    GTEST_SKIP() << "this host cannot run the avx2int8 tier (the reference)";
  k3::cpu::force_cpu_isa_for_testing(k3::cpu::CpuIsa::Avx2Int8);
  for (const WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K})
    for (const int64_t cols : {256, 2304, 4096, 7168, 32768}) {
      // 2085 rows (>= 2048: Q4_K / Q5_K on 16-warp blocks, the last one partly past the rows) at two widths
      const int64_t rows = cols == 2304 || cols == 4096 ? 2085 : 37, off = f == WeightFormat::Q6_K ? 2 : 0;
      const auto wb = k3quanttest::random_blocks(f, rows, cols, static_cast<uint32_t>(cols + 3), 4, 10);
      const k3::WeightMatrix Wh = k3quanttest::host_matrix(f, wb, rows, cols);
      std::mt19937 g(static_cast<uint32_t>(cols));
      std::normal_distribution<float> nd(0.f, 2.f);
      std::vector<float> x(static_cast<size_t>(cols));
      for (auto& v : x) v = nd(g);
      if (cols >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.f);  // a block of zeros: d = 0
      std::vector<float> want(static_cast<size_t>(rows));
      k3::cpu::matmul(Wh, x.data(), 1, want.data());
      std::vector<uint8_t> padded(off, 0);
      padded.insert(padded.end(), wb.begin(), wb.end());
      Dev<uint8_t> dw(padded), dw2(padded);
      Dev<float> dx(x), dy(static_cast<size_t>(rows)), dy2(static_cast<size_t>(rows));
      k3::WeightMatrix W = Wh, W2 = Wh;
      W.data = dw.p + off, W.device = 0, W2.data = dw2.p + off, W2.device = 0;
      const std::string what = std::string(k3::weight_format_name(f)) + " cols " + std::to_string(cols);
      ck(k3::cuda::quant_gemv(W, dx.p, 1, dy.p, nullptr, k3::cuda::QuantGemvKernel::Q8), "q8");
      ck(cudaDeviceSynchronize(), "sync");
      const std::vector<float> got = dy.get();
      int differ = 0;
      for (int64_t r = 0; r < rows; ++r) differ += std::memcmp(&got[r], &want[r], 4) != 0;
      EXPECT_EQ(differ, 0) << what << ": row 0 " << got[0] << " vs " << want[0];
      k3::cuda::force_quant_gemv_q8_for_testing(true);
      ck(cudaMemset(dy.p, 0xff, rows * 4), "poison");
      ck(k3::cuda::quant_gemv(W, dx.p, 1, dy.p, nullptr), "q8 by the rule");
      ck(cudaDeviceSynchronize(), "sync");
      EXPECT_EQ(std::memcmp(dy.get().data(), want.data(), want.size() * 4), 0) << what << ", by the rule";
      k3::cuda::force_quant_gemv_q8_for_testing(std::nullopt);
      const k3::WeightMatrix* Ws[2] = {&W, &W2};
      float* ys[2] = {dy.p, dy2.p};
      ck(k3::cuda::quant_gemv_q8(Ws, ys, 2, dx.p, nullptr), "q8 group");
      ck(cudaDeviceSynchronize(), "sync");
      EXPECT_EQ(std::memcmp(dy.get().data(), want.data(), want.size() * 4), 0) << what << ", group, matrix 0";
      EXPECT_EQ(std::memcmp(dy2.get().data(), want.data(), want.size() * 4), 0) << what << ", group, matrix 1";
      if (cols == 2304) {
        x[1000] = std::numeric_limits<float>::infinity();
        Dev<float> dxi(x);
        k3::cpu::matmul(Wh, x.data(), 1, want.data());
        ck(k3::cuda::quant_gemv(W, dxi.p, 1, dy.p, nullptr, k3::cuda::QuantGemvKernel::Q8), "q8 inf");
        ck(cudaDeviceSynchronize(), "sync");
        const std::vector<float> gi = dy.get();
        for (int64_t r = 0; r < rows; ++r) {
          EXPECT_TRUE(std::isnan(gi[r])) << what << " row " << r << ": " << gi[r];
          EXPECT_TRUE(std::isnan(want[r])) << what << " row " << r << ": the CPU gave " << want[r];
        }
      }
    }
  k3::cpu::force_cpu_isa_for_testing(std::nullopt);
  const k3::WeightMatrix* none[1] = {nullptr};
  EXPECT_FALSE(k3::cuda::quant_gemv_q8_supported(WeightFormat::Q8_0, 2304));
  EXPECT_FALSE(k3::cuda::quant_gemv_q8_supported(WeightFormat::Q4_K, 2304 + 32));
  EXPECT_FALSE(k3::cuda::quant_gemv_q8_supported(WeightFormat::Q4_K, k3::cuda::kQ8MaxCols + 256));
  EXPECT_EQ(k3::cuda::quant_gemv_q8(none, nullptr, 0, nullptr, nullptr), cudaErrorInvalidValue);
}

TEST(CudaQuantKernels, RejectsWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  Dev<uint8_t> blk(34 * 4);
  Dev<float> x(64 * 9), y(64 * 9);
  k3::WeightMatrix W{WeightFormat::Q8_0, blk.p, nullptr, 2, 64, 0};
  EXPECT_EQ(k3::cuda::quant_gemv(W, x.p, 9, y.p, nullptr), cudaErrorInvalidValue);  // n > 8
  k3::WeightMatrix bf = W;
  bf.format = WeightFormat::BF16;
  EXPECT_EQ(k3::cuda::quant_gemv(bf, x.p, 1, y.p, nullptr), cudaErrorInvalidValue);
  k3::WeightMatrix partial = W;
  partial.cols = 48;  // not whole 32-blocks
  EXPECT_EQ(k3::cuda::quant_gemv(partial, x.p, 1, y.p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::quant_dequant_rows(W, 1, nullptr, 2, y.p, 64, nullptr), cudaErrorInvalidValue);  // rows 1..2 of 2
  EXPECT_EQ(k3::cuda::quant_dequant_rows(W, 0, nullptr, 2, y.p, 63, nullptr), cudaErrorInvalidValue);  // ld < cols
  EXPECT_EQ(k3::cuda::quant_gemv(W, x.p, 1, y.p, nullptr), cudaSuccess);
  ck(cudaDeviceSynchronize(), "sync");
}

}  // namespace
