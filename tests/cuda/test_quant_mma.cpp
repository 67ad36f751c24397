// The tensor-core block GEMV (quant_mma.h) against the float64 product of the CPU's dequantised rows: Q4_K, Q5_K,
// Q6_K on random blocks (every byte random, random finite f16 scales of either sign), rows that are not a multiple
// of the 16 / 32 rows a block takes, one to nine 256-column super-blocks (units split unevenly over the 8 warps),
// n = 1..64 (every n8 tile count, partial tiles), both tile widths, x as hi + lo and as hi alone; Q6_K blocks also
// at a 2-byte offset (its 210-byte blocks are only 2-aligned in a matrix); the result independent of the schedule
// (two runs bit-equal); both forms of the kernel (KSplit, Rows with and without k slices); and the sizes it refuses.
// Timing at K3 / Kimi-Linear shapes against the fp32 block GEMV.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "quant_test_blocks.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_mma.h"

namespace {

using k3::WeightFormat;
using k3cudatest::ck;
using k3cudatest::Dev;
using namespace k3quanttest;

constexpr WeightFormat kMmaFormats[] = {WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K};
constexpr auto KSplit = k3::cuda::QuantMmaForm::KSplit;
constexpr auto Rows = k3::cuda::QuantMmaForm::Rows;
constexpr auto Staged = k3::cuda::QuantMmaForm::Staged;
struct Form {
  k3::cuda::QuantMmaForm form;
  int mt;
  bool with_work;
};

// x [n][cols] on the device prepared as quant_mma_prep leaves it (split or not).
struct Acts {
  Dev<uint16_t> hi, lo;
  Dev<float> xsum;
  k3::cuda::QuantMmaActs a;
  Acts(const Dev<float>& x, int n, int64_t cols, bool split)
      : hi(static_cast<size_t>(n * cols)), lo(static_cast<size_t>(n * cols)),
        xsum(static_cast<size_t>(k3::cuda::quant_mma_ldx(n) * (cols / 32))) {
    xsum.poison();  // the prep must write every sum, padding tokens included
    ck(k3::cuda::quant_mma_prep(x.p, n, cols, hi.p, split ? lo.p : nullptr, xsum.p, nullptr), "prep");
    a = k3::cuda::QuantMmaActs{hi.p, split ? lo.p : nullptr, xsum.p, n, cols};
  }
};

// One shape's random blocks, the CPU's rows of them, max_n Gaussian activation rows and their float64 product.
struct Case {
  std::vector<uint8_t> wb;
  k3::WeightMatrix hw;
  std::vector<float> x;
  Product p;
  Case(WeightFormat f, int64_t rows, int64_t cols, int max_n, uint32_t wseed, uint32_t xseed)
      : wb(random_blocks(f, rows, cols, wseed, 4, 10)), hw(host_matrix(f, wb, rows, cols)), x(static_cast<size_t>(max_n * cols)) {
    std::mt19937 rng(xseed);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = nd(rng);
    p = reference(cpu_rows(hw), x, rows, cols, max_n);
  }
  // The first n tokens' part of the product.
  Product first(int n, int64_t rows) const {
    Product pn;
    pn.exact.assign(p.exact.begin(), p.exact.begin() + n * rows);
    pn.abs_sum.assign(p.abs_sum.begin(), p.abs_sum.begin() + n * rows);
    return pn;
  }
};

TEST(CudaQuantMma, WithinItsBoundOfTheFloat64Product) {
  SKIP_WITHOUT_GPU();
  for (WeightFormat f : kMmaFormats) {
    for (const auto& [rows, blocks] : {std::pair<int64_t, int64_t>{37, 3}, {133, 1}, {6, 2}, {70, 9}}) {
      const int64_t cols = 256 * blocks;
      const int max_n = 64;
      const Case c(f, rows, cols, max_n, 91 + static_cast<uint32_t>(f) + static_cast<uint32_t>(rows), 7 + static_cast<uint32_t>(cols));
      const auto& wb = c.wb;
      const k3::WeightMatrix& hw = c.hw;
      Dev<float> dx(c.x);
      Dev<uint8_t> d(wb), d_odd(wb.size() + 2);
      Dev<float> work(k3::cuda::quant_mma_work_floats(hw, max_n, Rows));
      const int64_t unit_cols = f == WeightFormat::Q6_K ? 128 : 64;
      EXPECT_EQ(work.n > 0, cols / unit_cols >= 8) << "k slices (too few rows to fill the GPU) wherever there are 8 units";
      EXPECT_EQ(k3::cuda::quant_mma_work_floats(hw, max_n, KSplit), 0u);
      work.poison();
      ck(cudaMemcpy(d_odd.p + 2, wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
      k3::WeightMatrix dw = hw, dw_odd = hw;
      dw.data = d.p, dw.device = 0;
      dw_odd.data = d_odd.p + 2, dw_odd.device = 0;
      ASSERT_TRUE(k3::cuda::quant_mma_supported(dw));
      EXPECT_EQ(k3::cuda::quant_mma_supported(dw_odd), f == WeightFormat::Q6_K);  // 144 / 176-byte blocks want 16
      for (int n : {1, 2, 3, 7, 8, 9, 16, 17, 31, 32, 33, 47, 64}) {
        const Product pn = c.first(n, rows);
        for (bool split : {true, false}) {
          Acts acts(dx, n, cols, split);
          // KSplit at both tile widths; Rows with its k slices (partials) and without (one slice).
          for (const auto& [form, mt, with_work] :
               {Form{KSplit, 1, false}, Form{KSplit, 2, false}, Form{Rows, 0, true}, Form{Rows, 0, false}, Form{Staged, 0, false}}) {
            for (const k3::WeightMatrix* m : {&dw, &dw_odd}) {
              if (!k3::cuda::quant_mma_supported(*m)) continue;
              if (form == Staged && n > k3::cuda::kQuantMmaStagedMaxTokens) {
                Dev<float> y(static_cast<size_t>(n * rows));
                EXPECT_EQ(k3::cuda::quant_gemv_mma(*m, acts.a, y.p, nullptr, 0, Staged), cudaErrorInvalidValue) << n;
                continue;
              }
              const k3::cuda::QuantMmaWork wk = with_work ? k3::cuda::QuantMmaWork{work.p, work.n} : k3::cuda::QuantMmaWork{};
              Dev<float> y(static_cast<size_t>(n * rows));
              y.poison();
              ck(k3::cuda::quant_gemv_mma(*m, acts.a, y.p, nullptr, mt, form, wk), "quant_gemv_mma");
              ck(cudaDeviceSynchronize(), "sync");
              const auto got = y.get();
              const char* name = form == Rows ? (with_work ? " rows, k slices" : " rows") : form == Staged ? " staged" : "";
              EXPECT_LE(worst_ratio(got, pn, quant_mma_bound(cols, split)), 2.0)
                  << k3::weight_format_name(f) << " " << rows << "x" << cols << " n=" << n << " mt=" << mt << name
                  << (split ? " hi+lo" : " hi") << (m == &dw ? "" : " blocks at +2");
              if (form == Staged) {  // the same bits as KSplit with one m16 tile (the same units per warp, in order)
                Dev<float> y1(static_cast<size_t>(n * rows));
                ck(k3::cuda::quant_gemv_mma(*m, acts.a, y1.p, nullptr, 1, KSplit), "quant_gemv_mma ksplit");
                ck(cudaDeviceSynchronize(), "sync");
                EXPECT_EQ(std::memcmp(got.data(), y1.get().data(), got.size() * 4), 0)
                    << k3::weight_format_name(f) << " " << rows << "x" << cols << " n=" << n << (split ? " hi+lo" : " hi")
                    << (m == &dw ? "" : " blocks at +2");
              }
              if (n == 17 && (mt == 2 || form == Rows)) {  // the same bits on a second run: fixed reduction orders
                y.poison();
                ck(k3::cuda::quant_gemv_mma(*m, acts.a, y.p, nullptr, mt, form, wk), "quant_gemv_mma again");
                ck(cudaDeviceSynchronize(), "sync");
                EXPECT_EQ(std::memcmp(got.data(), y.get().data(), got.size() * 4), 0) << k3::weight_format_name(f) << name;
              }
            }
          }
        }
      }
    }
  }
}

// The Tiled form (quant_mma_tiled.cuh) over the tile-major copy quant_mma_make_tiled writes, Q4_K / Q5_K / Q6_K: within
// the same bound at every tiles-per-block split, and for Q6_K with one tile per block (KSplit's split and tree) the same
// bits as KSplit with one m16 tile; rows not a multiple of 16, one to nine super-blocks, Q6_K blocks at +2 bytes, n =
// 1..16; Auto takes it exactly where the copy exists and n <= kQuantMmaTiledMaxTokens; what it refuses.
TEST(CudaQuantMma, TiledEqualsKSplitAndStaysWithinItsBound) {
  SKIP_WITHOUT_GPU();
  constexpr auto Tiled = k3::cuda::QuantMmaForm::Tiled;
  const char* env = std::getenv("K3_QUANT_MMA_TILED");
  const bool heads = env == nullptr ? k3::cuda::kQuantMmaTiledByDefault : std::strcmp(env, "0") != 0;
  const bool heads_only = env == nullptr || std::strcmp(env, "all") != 0;
  for (WeightFormat f : kMmaFormats) {
    for (const auto& [rows, blocks] : {std::pair<int64_t, int64_t>{37, 3}, {133, 1}, {6, 2}, {70, 9}}) {
      const int64_t cols = 256 * blocks;
      const Case c(f, rows, cols, 17, 191 + static_cast<uint32_t>(rows) + static_cast<uint32_t>(f), 17 + static_cast<uint32_t>(cols));
      const auto& wb = c.wb;
      const k3::WeightMatrix& hw = c.hw;
      Dev<float> dx(c.x);
      const int off = f == WeightFormat::Q6_K ? 2 : 0;  // Q6_K rows as a matrix places them: 2-byte aligned
      Dev<uint8_t> d_off(wb.size() + 16);
      ck(cudaMemcpy(d_off.p + off, wb.data(), wb.size(), cudaMemcpyHostToDevice), "H2D");
      k3::WeightMatrix dw = hw;
      dw.data = d_off.p + off, dw.device = 0;
      if (heads_only) {
        EXPECT_FALSE(k3::cuda::quant_mma_tiled_wanted(dw)) << "only the vocabulary heads get the copy";
      }
      Dev<uint8_t> tiled(static_cast<size_t>(k3::cuda::quant_mma_tiled_bytes(dw)));
      tiled.poison();
      ck(k3::cuda::quant_mma_make_tiled(dw, tiled.p, nullptr), "make tiled");
      k3::WeightMatrix dt = dw;
      dt.tiled = tiled.p;
      for (int n : {1, 2, 3, 7, 8, 9, 16, 17}) {
        const Product pn = c.first(n, rows);
        for (bool split : {true, false}) {
          Acts acts(dx, n, cols, split);
          Dev<float> y(static_cast<size_t>(n * rows)), y1(static_cast<size_t>(n * rows));
          if (n > k3::cuda::kQuantMmaTiledMaxTokens) {
            EXPECT_EQ(k3::cuda::quant_gemv_mma(dt, acts.a, y.p, nullptr, 0, Tiled), cudaErrorInvalidValue);
            continue;
          }
          EXPECT_EQ(k3::cuda::quant_gemv_mma(dw, acts.a, y.p, nullptr, 0, Tiled), cudaErrorInvalidValue) << "no copy";
          ck(k3::cuda::quant_gemv_mma(dw, acts.a, y1.p, nullptr, 1, KSplit), "ksplit");
          ck(cudaDeviceSynchronize(), "sync");
          const auto ks = y1.get();
          for (int tpb : {1, 2, 4, 8}) {
            y.poison();
            ck(k3::cuda::quant_gemv_mma(dt, acts.a, y.p, nullptr, tpb, Tiled), "tiled");
            ck(cudaDeviceSynchronize(), "sync");
            const auto got = y.get();
            const std::string what = std::string(k3::weight_format_name(f)) + " " + std::to_string(rows) + "x" + std::to_string(cols) +
                                     " n=" + std::to_string(n) + " tpb=" + std::to_string(tpb) + (split ? " hi+lo" : " hi");
            EXPECT_LE(worst_ratio(got, pn, quant_mma_bound(cols, split)), 2.0) << what;
            if (tpb == 1 && f == WeightFormat::Q6_K) {
              EXPECT_EQ(std::memcmp(got.data(), ks.data(), got.size() * 4), 0) << what;
            }
          }
          // Auto: the copy's rule (tiles per block left open) -- the same bits as asking for Tiled with mt 0.
          ck(k3::cuda::quant_gemv_mma(dt, acts.a, y.p, nullptr, 0, Tiled), "tiled rule");
          ck(k3::cuda::quant_gemv_mma(dt, acts.a, y1.p, nullptr), "auto");
          ck(cudaDeviceSynchronize(), "sync");
          EXPECT_EQ(std::memcmp(y.get().data(), y1.get().data(), y.n * 4), 0) << n;
        }
      }
      const Acts one(dx, 1, cols, true);
      Dev<float> y(static_cast<size_t>(rows));
      EXPECT_EQ(k3::cuda::quant_gemv_mma(dt, one.a, y.p, nullptr, 3, Tiled), cudaErrorInvalidValue) << "tiles per block";
    }
  }
  k3::WeightMatrix head{WeightFormat::Q6_K, reinterpret_cast<const void*>(uintptr_t{256}), nullptr, 65536, 2304, 0};
  EXPECT_EQ(k3::cuda::quant_mma_tiled_wanted(head), heads);
  head.format = WeightFormat::Q4_K;
  if (heads_only) {
    EXPECT_FALSE(k3::cuda::quant_mma_tiled_wanted(head));
  }
}

// The prep's sums: each 32 columns of hi + lo (hi alone), zeros for the padding tokens up to the next 8.
TEST(CudaQuantMma, PrepSumsTheHalvesPerThirtyTwoColumns) {
  SKIP_WITHOUT_GPU();
  const int n = 5;
  const int64_t cols = 512;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  std::vector<float> x(static_cast<size_t>(n * cols));
  for (auto& v : x) v = nd(rng);
  Dev<float> dx(x);
  for (bool split : {true, false}) {
    Acts acts(dx, n, cols, split);
    ck(cudaDeviceSynchronize(), "sync");
    const auto hi = acts.hi.get(), lo = acts.lo.get();
    const auto sums = acts.xsum.get();
    auto bf = [](uint16_t b) {
      const uint32_t u = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    const int ldx = k3::cuda::quant_mma_ldx(n);
    for (int t = 0; t < ldx; ++t)
      for (int64_t b = 0; b < cols / 32; ++b) {
        double want = 0, mag = 0;
        for (int64_t c = 32 * b; t < n && c < 32 * b + 32; ++c) {
          const size_t i = static_cast<size_t>(t * cols + c);
          const double xp = bf(hi[i]) + (split ? bf(lo[i]) : 0.0f);
          EXPECT_LE(std::fabs(xp - x[i]), std::ldexp(std::fabs(x[i]), split ? -17 : -8)) << "x' far from x";
          want += xp, mag += std::fabs(xp);
        }
        EXPECT_LE(std::fabs(sums[b * ldx + t] - want), 16 * std::ldexp(mag, -24) + 1e-30)
            << "token " << t << " block " << b << (split ? " hi+lo" : " hi");
      }
  }
}

TEST(CudaQuantMma, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_GPU();
  Dev<uint8_t> blk(210 * 4);
  Dev<float> x(256 * 65), y(256 * 65), sums(64 * 8);
  Dev<uint16_t> h(256 * 65);
  k3::WeightMatrix W{WeightFormat::Q6_K, blk.p, nullptr, 4, 256, 0};
  const k3::cuda::QuantMmaActs ok{h.p, nullptr, sums.p, 2, 256};
  EXPECT_EQ(k3::cuda::quant_gemv_mma(W, ok, y.p, nullptr), cudaSuccess);
  k3::cuda::QuantMmaActs many = ok;
  many.n = 65;
  EXPECT_EQ(k3::cuda::quant_gemv_mma(W, many, y.p, nullptr), cudaErrorInvalidValue);
  k3::cuda::QuantMmaActs narrow = ok;
  narrow.cols = 128;
  EXPECT_EQ(k3::cuda::quant_gemv_mma(W, narrow, y.p, nullptr), cudaErrorInvalidValue);  // not W's width
  k3::WeightMatrix q8 = W;
  q8.format = WeightFormat::Q8_0;
  EXPECT_EQ(k3::cuda::quant_gemv_mma(q8, ok, y.p, nullptr), cudaErrorInvalidValue);
  k3::WeightMatrix q4 = W;
  q4.format = WeightFormat::Q4_K;
  q4.data = blk.p + 2;  // 144-byte blocks off their 16-byte alignment
  EXPECT_EQ(k3::cuda::quant_gemv_mma(q4, ok, y.p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::quant_gemv_mma(W, ok, y.p, nullptr, 3), cudaErrorInvalidValue);  // tile width
  EXPECT_EQ(k3::cuda::quant_mma_prep(x.p + 1, 2, 256, h.p, nullptr, sums.p, nullptr), cudaErrorInvalidValue);  // x unaligned
  EXPECT_EQ(k3::cuda::quant_mma_prep(x.p, 2, 200, h.p, nullptr, sums.p, nullptr), cudaErrorInvalidValue);
  ck(cudaDeviceSynchronize(), "sync");
}

// Time per call (L2 flushed before each) of a dense projection through LinearRunner with the tensor-core block
// GEMV (prep + kernel) against the fp32 block GEMV / bf16 tiles it replaces (K3_QUANT_MMA=off), and the kernel alone
// at each tile width, x split and not; printed for docs/perf.
TEST(CudaQuantMma, TimingAtK3Width) {
  SKIP_WITHOUT_GPU();
  Dev<uint8_t> flush(size_t{256} << 20);
  struct Shape {
    WeightFormat f;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{WeightFormat::Q4_K, 4096, 7168},  {WeightFormat::Q5_K, 4096, 7168}, {WeightFormat::Q6_K, 4096, 7168},
                          {WeightFormat::Q6_K, 163840, 2304}, {WeightFormat::Q4_K, 4096, 2304}, {WeightFormat::Q4_K, 2304, 4096}};
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  {
    const auto old_p = k3cudatest::runner_with("K3_QUANT_MMA", "off", st), new_p = k3cudatest::runner_with("K3_QUANT_MMA", "1", st);
    k3::cuda::LinearRunner &old_runner = *old_p, &new_runner = *new_p;
    cudaEvent_t e0, e1;
    ck(cudaEventCreate(&e0), "event");
    ck(cudaEventCreate(&e1), "event");
    for (const Shape& sh : shapes) {
      const auto wb = random_blocks(sh.f, sh.rows, sh.cols, 21, 4, 10);
      Dev<uint8_t> d(wb);
      k3::WeightMatrix dw = host_matrix(sh.f, wb, sh.rows, sh.cols);
      dw.data = d.p, dw.device = 0;
      std::mt19937 rng(2);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x(static_cast<size_t>(64 * sh.cols));
      for (auto& v : x) v = nd(rng);
      Dev<float> dx(x), y(static_cast<size_t>(64 * sh.rows));
      Dev<float> work(std::max<size_t>(1, k3::cuda::quant_mma_work_floats(dw, 64, Rows)));
      auto time_us = [&](auto&& fn) {
        const int reps = sh.rows > 100000 ? 5 : 20;
        float total = 0;
        for (int i = 0; i < reps; ++i) {
          ck(cudaMemsetAsync(flush.p, i, flush.n, st), "flush");
          ck(cudaEventRecord(e0, st), "record");
          fn();
          ck(cudaEventRecord(e1, st), "record");
          ck(cudaEventSynchronize(e1), "sync");
          float ms = 0;
          ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
          total += ms;
        }
        return 1000.0 * total / reps;
      };
      const double gb = static_cast<double>(wb.size()) * 1e-9;
      for (int n : {1, 2, 4, 8, 16, 32, 64}) {
        const double t_old = time_us([&] { old_runner.run(dw, dx.p, n, y.p); });
        const double t_new = time_us([&] { new_runner.run(dw, dx.p, n, y.p); });
        std::printf("[ quant mma ] %-5s %6lld x %5lld n=%2d  old %8.1f us %5.0f GB/s  new %8.1f us %5.0f GB/s  (%.2fx)", k3::weight_format_name(sh.f),
                    static_cast<long long>(sh.rows), static_cast<long long>(sh.cols), n, t_old, gb / (t_old * 1e-6),
                    t_new, gb / (t_new * 1e-6), t_old / t_new);
        for (bool split : {true, false}) {
          Acts acts(dx, n, sh.cols, split);
          for (int mt : {1, 2}) {
            if (mt == 2 && n > 32) continue;
            const double t = time_us([&] { ck(k3::cuda::quant_gemv_mma(dw, acts.a, y.p, st, mt, KSplit), "mma"); });
            std::printf("  k%s%d %7.1f", split ? "s" : "h", mt, t);
          }
          const double t = time_us([&] { ck(k3::cuda::quant_gemv_mma(dw, acts.a, y.p, st, 0, Rows, {work.p, work.n}), "mma rows"); });
          std::printf("  r%s %7.1f", split ? "s" : "h", t);
          if (n <= k3::cuda::kQuantMmaStagedMaxTokens) {
            const double ts = time_us([&] { ck(k3::cuda::quant_gemv_mma(dw, acts.a, y.p, st, 0, Staged), "mma staged"); });
            std::printf("  t%s %7.1f", split ? "s" : "h", ts);
          }
        }
        std::printf("\n");
      }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
  }
  ck(cudaStreamDestroy(st), "stream destroy");
}

}  // namespace
