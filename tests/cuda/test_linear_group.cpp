// Grouped projections (LinearRunner::run_group: the matrices that read the same x in one launch, the skinny
// tensor-core kernel for 2..32 tokens, the GEMV for 1..8) against the same matrices run one by one, bit for
// bit, and against cpu::matmul; plus a timing print of a Kimi-Linear KDA layer's six projections grouped vs
// one by one (CudaLinearGroupTiming, prints only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/linear_skinny.h"
#include "k3/core/dtype.h"

namespace {

using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::have_gpu;
using k3cudatest::randn;
using k3cudatest::rel_err;

// One matrix of a test group: host bf16 / fp32 copy (for cpu::matmul) and the device copy.
struct Mat {
  std::vector<uint16_t> bf;
  std::vector<float> f32;
  std::unique_ptr<Dev<uint16_t>> dbf;
  std::unique_ptr<Dev<float>> df32;
  k3::WeightMatrix host, dev;
};

Mat make_mat(int64_t rows, int64_t cols, k3::WeightFormat f, uint64_t seed) {
  Mat m;
  const auto w = randn(static_cast<size_t>(rows * cols), seed, 0.05f);
  m.host.rows = m.dev.rows = rows;
  m.host.cols = m.dev.cols = cols;
  m.host.format = m.dev.format = f;
  if (f == k3::WeightFormat::BF16) {
    m.bf.resize(w.size());
    for (size_t i = 0; i < w.size(); ++i) m.bf[i] = k3::f32_to_bf16(w[i]);
    m.dbf = std::make_unique<Dev<uint16_t>>(m.bf);
    m.host.data = m.bf.data();
    m.dev.data = m.dbf->p;
  } else {
    m.f32 = w;
    m.df32 = std::make_unique<Dev<float>>(m.f32);
    m.host.data = m.f32.data();
    m.dev.data = m.df32->p;
  }
  return m;
}

// Runs the group through run_group and each matrix through run(); every output must be bit-equal, nothing
// written past n tokens (NaN-poisoned tails), and within 2e-5 of cpu::matmul.
void check_group(const std::vector<Mat>& mats, int n, const char* what) {
  const int64_t cols = mats[0].dev.cols;
  auto x = randn(static_cast<size_t>(n * cols) + 4, 100 + n);
  Dev<float> dx(x);
  k3::cuda::LinearRunner lin(nullptr);
  std::vector<std::unique_ptr<Dev<float>>> yg, y1;
  std::vector<const k3::WeightMatrix*> W;
  std::vector<float*> Y;
  for (const Mat& m : mats) {
    const size_t outn = static_cast<size_t>((n + 1) * m.dev.rows);
    yg.push_back(std::make_unique<Dev<float>>(outn));
    y1.push_back(std::make_unique<Dev<float>>(outn));
    yg.back()->poison();
    y1.back()->poison();
    W.push_back(&m.dev);
    Y.push_back(yg.back()->p);
  }
  lin.run_group(W.data(), Y.data(), static_cast<int>(mats.size()), dx.p, n);
  for (size_t i = 0; i < mats.size(); ++i) lin.run(mats[i].dev, dx.p, n, y1[i]->p);
  ck(cudaDeviceSynchronize(), "sync");
  for (size_t i = 0; i < mats.size(); ++i) {
    const auto g = yg[i]->get(), o = y1[i]->get();
    ASSERT_EQ(std::memcmp(g.data(), o.data(), g.size() * 4), 0) << what << " matrix " << i << " n=" << n;
    const size_t valid = static_cast<size_t>(n * mats[i].dev.rows);
    for (size_t j = valid; j < g.size(); ++j) {
      uint32_t bits;
      std::memcpy(&bits, &g[j], 4);
      ASSERT_EQ(bits, 0xffffffffu) << what << " store past n in matrix " << i << " n=" << n;
    }
    std::vector<float> ref(valid);
    k3::cpu::matmul(mats[i].host, x.data(), n, ref.data());
    EXPECT_LT(rel_err(std::vector<float>(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(valid)), ref), 2e-5)
        << what << " matrix " << i << " n=" << n;
  }
}

// bf16 groups of 1..6 matrices with row counts off the 16 / 32 tiles (one large enough that the group takes
// two m16 tiles per block), every n in 1..32 (the GEMV at 1, the skinny kernel fused up to 8 tokens and
// with a separate split above); an fp32 group (GEMV up to 8 tokens, one by one above); a group whose widths
// keep one matrix off the skinny kernel (falls back to one by one).
TEST(CudaLinearGroup, EqualsOneByOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using F = k3::WeightFormat;
  std::vector<Mat> bf;
  const int64_t rows[] = {17, 1000, 1, 300, 8460, 33};
  for (int i = 0; i < 6; ++i) bf.push_back(make_mat(rows[i], 320, F::BF16, 7 + i));
  for (int n = 1; n <= 32; ++n) {
    std::vector<Mat> sub;
    for (int i = 0; i < 1 + (n % 6); ++i) sub.push_back(make_mat(rows[i], 320, F::BF16, 7 + i));
    check_group(sub, n, "bf16 subgroup");
    if (n % 4 == 1 || n == 32) check_group(bf, n, "bf16 six");
  }
  std::vector<Mat> f32;
  for (int i = 0; i < 3; ++i) f32.push_back(make_mat(rows[i] + 5, 72, F::F32, 40 + i));
  for (int n : {1, 3, 8, 9}) check_group(f32, n, "fp32");
  std::vector<Mat> mixed;
  mixed.push_back(make_mat(64, 96, F::BF16, 50));
  mixed.push_back(make_mat(64, 96, F::F32, 51));
  for (int n : {1, 4, 20}) check_group(mixed, n, "bf16 + fp32");
}

// The kernels refuse groups they cannot run: too many matrices, widths that differ, mixed formats.
TEST(CudaLinearGroup, RejectsWhatItCannotRun) {
  alignas(16) static uint16_t buf[64];
  k3::WeightMatrix a;
  a.rows = 4;
  a.cols = 64;
  a.format = k3::WeightFormat::BF16;
  a.data = buf;
  k3::WeightMatrix wide = a;
  wide.cols = 96;
  k3::WeightMatrix f32 = a;
  f32.format = k3::WeightFormat::F32;
  float y0[4];
  const k3::WeightMatrix* two[2] = {&a, &wide};
  float* ys[9] = {y0, y0, y0, y0, y0, y0, y0, y0, y0};
  EXPECT_EQ(k3::cuda::linear_skinny_group(two, ys, 2, nullptr, nullptr, 4, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::linear_gemv_group(two, ys, 2, nullptr, 1, nullptr), cudaErrorInvalidValue);
  const k3::WeightMatrix* mixed[2] = {&a, &f32};
  EXPECT_EQ(k3::cuda::linear_gemv_group(mixed, ys, 2, nullptr, 1, nullptr), cudaErrorInvalidValue);
  const k3::WeightMatrix* nine[9] = {&a, &a, &a, &a, &a, &a, &a, &a, &a};
  EXPECT_EQ(k3::cuda::linear_skinny_group(nine, ys, 9, nullptr, nullptr, 4, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::linear_gemv_group(nine, ys, 9, nullptr, 1, nullptr), cudaErrorInvalidValue);
}

// A Kimi-Linear KDA layer's projections of x (q, k, v 4096 x 2304; f_a, g_a 128 x 2304; b 32 x 2304) and
// an MLA layer's (q 6144, kv_a 576, g 4096), grouped vs one by one (K3_CUDA_LINEAR_GROUP=0), weights
// rotated through >= 512 MB so each call reads HBM. Prints us per group and GB/s of weights.
TEST(CudaLinearGroupTiming, KimiLinearLayers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Layer { const char* what; std::vector<int64_t> rows; };
  const int64_t cols = 2304;
  setenv("K3_CUDA_LINEAR_GROUP", "0", 1);
  k3::cuda::LinearRunner one(nullptr);
  unsetenv("K3_CUDA_LINEAR_GROUP");
  k3::cuda::LinearRunner grouped(nullptr);
  for (const Layer& L : {Layer{"KDA q/k/v/f_a/b/g_a", {4096, 4096, 4096, 128, 32, 128}},
                         Layer{"MLA q/kv_a/g", {6144, 576, 4096}}}) {
    int64_t total = 0;
    for (int64_t r : L.rows) total += r;
    const int64_t bytes = total * cols * 2;
    const int copies = static_cast<int>(std::max<int64_t>(2, (512ll << 20) / bytes));
    Dev<uint16_t> w(static_cast<size_t>(total * cols * copies));
    ck(k3::cuda::fill_uniform_bf16(w.p, total * cols * copies, 0.05f, 1, nullptr), "fill");
    for (int n : {1, 2, 4, 8, 16, 32}) {
      Dev<float> x(static_cast<size_t>(n * cols)), y(static_cast<size_t>(n * total));
      ck(k3::cuda::fill_uniform_f32(x.p, n * cols, -1.f, 1.f, 2, nullptr), "fill");
      double us[2];
      for (int v = 0; v < 2; ++v) {
        k3::cuda::LinearRunner& lin = v == 0 ? one : grouped;
        cudaEvent_t a, b;
        cudaEventCreate(&a);
        cudaEventCreate(&b);
        const int reps = 40;
        for (int r = -5; r < reps; ++r) {
          if (r == 0) cudaEventRecord(a);
          const uint16_t* base = w.p + (static_cast<int64_t>(r + 5) % copies) * total * cols;
          std::vector<k3::WeightMatrix> D(L.rows.size());
          std::vector<const k3::WeightMatrix*> W;
          std::vector<float*> Y;
          int64_t off = 0;
          for (size_t i = 0; i < L.rows.size(); ++i) {
            D[i].rows = L.rows[i];
            D[i].cols = cols;
            D[i].format = k3::WeightFormat::BF16;
            D[i].data = base + off * cols;
            W.push_back(&D[i]);
            Y.push_back(y.p + off * n);
            off += L.rows[i];
          }
          lin.run_group(W.data(), Y.data(), static_cast<int>(W.size()), x.p, n);
        }
        cudaEventRecord(b);
        ck(cudaEventSynchronize(b), "sync");
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        us[v] = 1000.0 * ms / reps;
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
      std::printf("[ group ] %-22s n=%2d  one by one %7.1f us (%5.0f GB/s)  grouped %7.1f us (%5.0f GB/s)  %.2fx\n", L.what,
                  n, us[0], bytes / us[0] / 1e3, us[1], bytes / us[1] / 1e3, us[0] / us[1]);
    }
  }
}

}  // namespace
