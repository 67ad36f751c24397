// The tensor-core skinny projection (linear_skinny.cu, 2..32 tokens, bf16 weights; x pre-split or split in the
// kernel) and the logits download
// (logits_download.cpp) against references on random inputs; plus a timing print of the skinny path vs
// the fp32 GEMV / cuBLASLt it replaces (CudaSkinnyTiming, prints only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/linear_skinny.h"
#include "k3/backend/cuda/logits_download.h"
#include "k3/core/dtype.h"

namespace {

using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::have_gpu;

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double max_rel(const std::vector<float>& got, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    md = std::max(md, std::fabs(static_cast<double>(got[i]) - ref[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(ref[i])));
  }
  return md / std::max(mr, 1e-30);
}

// Every n in 2..32 on shapes with row counts off the 16 / 32 tiles, both tile widths (rows >= 8448 takes
// two m16 tiles per block), K not a multiple of the 8 warps x 4 chunks a block walks at once. The CPU
// reference is cpu::matmul on the same bf16 weights; the output is NaN-poisoned one row past n so a
// store out of range or a missing one shows. The bound 2e-5 also catches a dropped lo half (~3e-3).
TEST(CudaSkinny, MatchesCpuMatmul) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape { int64_t rows, cols; };
  double worst = 0;
  for (const Shape s : {Shape{1, 32}, Shape{17, 96}, Shape{1000, 2304}, Shape{2304, 4128}, Shape{8460, 320}}) {
    const auto wf = randn(static_cast<size_t>(s.rows * s.cols), 3 + s.rows, 0.05f);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = k3::f32_to_bf16(wf[i]);
    Dev<uint16_t> dw(wb);
    k3::WeightMatrix W;
    W.rows = s.rows;
    W.cols = s.cols;
    W.format = k3::WeightFormat::BF16;
    W.data = wb.data();
    k3::WeightMatrix D = W;
    D.data = dw.p;
    for (int n = 2; n <= 32; ++n) {
      if (s.rows * s.cols > 4'000'000 && n % 5 != 2) continue;  // the big shapes at n = 2, 7, 12, ..., 32
      ASSERT_TRUE(k3::cuda::linear_skinny_supported(D, n));
      const auto x = randn(static_cast<size_t>(n * s.cols), 11 + n);
      std::vector<float> ref(static_cast<size_t>(n * s.rows));
      k3::cpu::matmul(W, x.data(), n, ref.data());
      Dev<float> dx(x), dy(ref.size() + static_cast<size_t>(s.rows));
      Dev<uint16_t> hi(x.size()), lo(x.size());
      ck(k3::cuda::to_bf16_split(dx.p, static_cast<int64_t>(x.size()), hi.p, lo.p, nullptr), "split");
      dy.poison();
      ck(k3::cuda::linear_skinny(D, hi.p, lo.p, n, dy.p, nullptr), "linear_skinny");
      ck(cudaDeviceSynchronize(), "sync");
      std::vector<float> got = dy.get();
      for (size_t i = ref.size(); i < got.size(); ++i) {
        uint32_t bits;
        std::memcpy(&bits, &got[i], 4);
        ASSERT_EQ(bits, 0xffffffffu) << "store past n at " << i << " (" << s.rows << "x" << s.cols << " n=" << n << ")";
      }
      got.resize(ref.size());
      const double e = max_rel(got, ref);
      worst = std::max(worst, e);
      EXPECT_LT(e, 2e-5) << s.rows << "x" << s.cols << " n=" << n;
    }
  }
  std::printf("[ skinny ] max rel error vs cpu::matmul over all shapes and n = 2..32: %.2e\n", worst);
}

// linear_skinny_f32 (x split inside the kernel) gives the same bits as to_bf16_split + linear_skinny for
// every n in 2..32 and both tile widths, stores nothing past n, and LinearRunner::run (the fused kernel for
// aligned x up to kSkinnyFusedMaxTokens, else the split kernel; x not 16-byte aligned always the split
// kernel) gives the same bits again. Values include
// ties and magnitudes where the lo half is subnormal-scaled, so a different rounding of hi or lo shows.
TEST(CudaSkinny, FusedSplitEqualsSplitKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape { int64_t rows, cols; };
  for (const Shape s : {Shape{17, 96}, Shape{1000, 2304}, Shape{8460, 320}}) {
    const auto wf = randn(static_cast<size_t>(s.rows * s.cols), 7 + s.rows, 0.05f);
    std::vector<uint16_t> wb(wf.size());
    for (size_t i = 0; i < wf.size(); ++i) wb[i] = k3::f32_to_bf16(wf[i]);
    Dev<uint16_t> dw(wb);
    k3::WeightMatrix W;
    W.rows = s.rows;
    W.cols = s.cols;
    W.format = k3::WeightFormat::BF16;
    W.data = wb.data();
    k3::WeightMatrix D = W;
    D.data = dw.p;
    for (int n = 2; n <= 32; ++n) {
      if (s.rows * s.cols > 1'000'000 && n % 3 != 2) continue;
      auto x = randn(static_cast<size_t>(n * s.cols) + 4, 21 + n);
      for (size_t i = 0; i < x.size(); i += 7) x[i] = 1.0f + std::ldexp(1.0f, -8);    // a bf16 tie (to even)
      for (size_t i = 3; i < x.size(); i += 11) x[i] = std::ldexp(x[i], -120);       // tiny: lo near 0
      std::vector<float> ref(static_cast<size_t>(n * s.rows));
      k3::cpu::matmul(W, x.data(), n, ref.data());
      Dev<float> dx(x);
      const size_t outn = ref.size() + static_cast<size_t>(s.rows);
      Dev<float> y_split(outn), y_fused(outn), y_run(outn), y_unal(outn);
      Dev<uint16_t> hi(x.size()), lo(x.size());
      const int64_t cnt = static_cast<int64_t>(n * s.cols);
      ck(k3::cuda::to_bf16_split(dx.p, cnt, hi.p, lo.p, nullptr), "split");
      for (auto* d : {&y_split, &y_fused, &y_run, &y_unal}) d->poison();
      ck(k3::cuda::linear_skinny(D, hi.p, lo.p, n, y_split.p, nullptr), "linear_skinny");
      ck(k3::cuda::linear_skinny_f32(D, dx.p, n, y_fused.p, nullptr), "linear_skinny_f32");
      k3::cuda::LinearRunner lin(nullptr);
      lin.run(D, dx.p, n, y_run.p);
      // x shifted by one float (4-byte aligned only): the runner must take the split-kernel path
      ck(cudaMemcpy(dx.p + 1, x.data(), static_cast<size_t>(cnt) * 4, cudaMemcpyHostToDevice), "shift");
      EXPECT_EQ(k3::cuda::linear_skinny_f32(D, dx.p + 1, n, y_unal.p, nullptr), cudaErrorInvalidValue);
      lin.run(D, dx.p + 1, n, y_unal.p);
      ck(cudaDeviceSynchronize(), "sync");
      const auto a = y_split.get(), b = y_fused.get(), c = y_run.get(), u = y_unal.get();
      ASSERT_EQ(std::memcmp(a.data(), b.data(), outn * 4), 0) << s.rows << "x" << s.cols << " n=" << n;
      ASSERT_EQ(std::memcmp(a.data(), c.data(), outn * 4), 0) << "runner " << s.rows << "x" << s.cols << " n=" << n;
      ASSERT_EQ(std::memcmp(a.data(), u.data(), outn * 4), 0) << "unaligned " << s.rows << "x" << s.cols << " n=" << n;
      std::vector<float> got(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(ref.size()));
      EXPECT_LT(max_rel(got, ref), 2e-5) << s.rows << "x" << s.cols << " n=" << n;
    }
  }
}

TEST(CudaSkinny, RejectsWhatItCannotRun) {
  k3::WeightMatrix W;
  W.rows = 64;
  W.cols = 64;
  W.format = k3::WeightFormat::BF16;
  alignas(16) static uint16_t buf[8];
  W.data = buf;
  EXPECT_TRUE(k3::cuda::linear_skinny_supported(W, 2));
  EXPECT_TRUE(k3::cuda::linear_skinny_supported(W, 32));
  EXPECT_FALSE(k3::cuda::linear_skinny_supported(W, 1));
  EXPECT_FALSE(k3::cuda::linear_skinny_supported(W, 33));
  k3::WeightMatrix odd = W;
  odd.cols = 48;  // not a multiple of 32
  EXPECT_FALSE(k3::cuda::linear_skinny_supported(odd, 4));
  k3::WeightMatrix f32 = W;
  f32.format = k3::WeightFormat::F32;
  EXPECT_FALSE(k3::cuda::linear_skinny_supported(f32, 4));
  k3::WeightMatrix unaligned = W;
  unaligned.data = buf + 1;
  EXPECT_FALSE(k3::cuda::linear_skinny_supported(unaligned, 4));
  EXPECT_EQ(k3::cuda::linear_skinny(odd, nullptr, nullptr, 4, nullptr, nullptr), cudaErrorInvalidValue);
}

// Results do not depend on the schedule: two runs give the same bits (the warps' partials are summed in
// a fixed order; CUDA graph replay relies on it).
TEST(CudaSkinny, Deterministic) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 9000, cols = 2304;
  const int n = 19;
  const auto wf = randn(static_cast<size_t>(rows * cols), 5, 0.05f);
  std::vector<uint16_t> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) wb[i] = k3::f32_to_bf16(wf[i]);
  Dev<uint16_t> dw(wb);
  k3::WeightMatrix D;
  D.rows = rows;
  D.cols = cols;
  D.format = k3::WeightFormat::BF16;
  D.data = dw.p;
  const auto x = randn(static_cast<size_t>(n * cols), 6);
  Dev<float> dx(x), y1(static_cast<size_t>(n * rows)), y2(static_cast<size_t>(n * rows));
  k3::cuda::LinearRunner lin(nullptr);
  lin.run(D, dx.p, n, y1.p);
  lin.run(D, dx.p, n, y2.p);
  ck(cudaDeviceSynchronize(), "sync");
  const auto a = y1.get(), b = y2.get();
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// The logits download delivers exactly the device bytes, in both modes, for sizes of zero, one row, rows
// that cut into many pieces (37 rows of V = 163840: 24 MB, 7 pieces) and more rows than kMaxPieces.
TEST(CudaLogitsDownload, CopiesExactly) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  for (const char* mode : {"", "serial"}) {
    setenv("K3_CUDA_LOGITS_COPY", mode, 1);
    k3::cuda::LogitsDownload down;
    struct Case { size_t rows, V; };
    for (const Case c : {Case{0, 163840}, Case{1, 163840}, Case{37, 163840}, Case{300, 4000}, Case{5, 1001}}) {
      const size_t count = c.rows * c.V;
      const auto h = randn(std::max<size_t>(count, 1), 9 + count);
      Dev<float> d(h);
      std::vector<float> out(count + 4, -7.0f);
      down.copy(d.p, count * 4, c.V * 4, out.data(), st);
      EXPECT_EQ(std::memcmp(out.data(), h.data(), count * 4), 0) << mode << " rows " << c.rows << " V " << c.V;
      for (size_t i = count; i < out.size(); ++i) EXPECT_EQ(out[i], -7.0f) << "written past the end";
    }
  }
  unsetenv("K3_CUDA_LOGITS_COPY");
  ck(cudaStreamDestroy(st), "stream");
  EXPECT_EQ(k3::cuda::LogitsDownload::pieces_for(0, 100), 0u);
  EXPECT_EQ(k3::cuda::LogitsDownload::pieces_for(100, 100), 1u);
  EXPECT_EQ(k3::cuda::LogitsDownload::pieces_for(37 * 655360, 655360), 7u);  // 6 rows (3.9 MB) a piece
  EXPECT_EQ(k3::cuda::LogitsDownload::pieces_for(1000 * 4000, 4000), 1u);     // 1000 rows of 4 KB: < 4 MiB
  EXPECT_EQ(k3::cuda::LogitsDownload::pieces_for(size_t{4000} << 20, 4000), k3::cuda::LogitsDownload::kMaxPieces);
}

// Time per projection, weights rotated through >= 512 MB so every call reads HBM: the skinny path (incl.
// its hi/lo split) and, above 32 tokens, the merged bf16x2 GEMM vs the old paths (fp32 GEMV up to 8 tokens,
// two cuBLASLt GEMMs above: K3_CUDA_SKINNY=0 K3_CUDA_MERGED_X2=0).
TEST(CudaSkinnyTiming, SkinnyVsOld) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape { int64_t rows, cols; const char* what; };
  setenv("K3_CUDA_SKINNY", "0", 1);
  setenv("K3_CUDA_MERGED_X2", "0", 1);
  k3::cuda::LinearRunner old_lin(nullptr);
  unsetenv("K3_CUDA_SKINNY");
  unsetenv("K3_CUDA_MERGED_X2");
  k3::cuda::LinearRunner new_lin(nullptr);
  for (const Shape s : {Shape{4096, 2304, "Kimi-Linear KDA q/k/v"}, Shape{2304, 4096, "Kimi-Linear KDA o"},
                        Shape{163840, 2304, "lm_head"}}) {
    const int64_t bytes = s.rows * s.cols * 2;
    const int copies = static_cast<int>(std::max<int64_t>(2, (512ll << 20) / bytes));
    Dev<uint16_t> w(static_cast<size_t>(s.rows * s.cols * copies));
    ck(k3::cuda::fill_uniform_bf16(w.p, s.rows * s.cols * copies, 0.05f, 1, nullptr), "fill");
    for (int n : {2, 4, 8, 16, 32, 64, 128}) {
      Dev<float> x(static_cast<size_t>(n * s.cols)), y(static_cast<size_t>(n * s.rows));
      ck(k3::cuda::fill_uniform_f32(x.p, n * s.cols, -1.f, 1.f, 2, nullptr), "fill");
      double us[2];
      for (int v = 0; v < 2; ++v) {
        k3::cuda::LinearRunner& lin = v == 0 ? old_lin : new_lin;
        us[v] = k3cudatest::event_us(5, 40, [&](int r) {
          k3::WeightMatrix D;
          D.rows = s.rows;
          D.cols = s.cols;
          D.format = k3::WeightFormat::BF16;
          D.data = w.p + (static_cast<int64_t>(r + 5) % copies) * s.rows * s.cols;
          lin.run(D, x.p, n, y.p);
        });
      }
      std::printf("[ timing ] linear bf16 %6lld x %5lld n=%2d (%s): old %8.2f us  new %8.2f us (%6.1f GB/s, %5.1f%% "
                  "of 4.8 TB/s)  %.2fx\n",
                  (long long)s.rows, (long long)s.cols, n, s.what, us[0], us[1], bytes / us[1] / 1e3,
                  bytes / us[1] / 1e3 / 48.0, us[0] / us[1]);
    }
  }
}

}  // namespace
