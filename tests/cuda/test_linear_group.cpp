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
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "quant_test_blocks.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/linear_skinny.h"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_mma.h"
#include "k3/core/dtype.h"

namespace {

using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::have_gpu;
using k3cudatest::randn;
using k3cudatest::rel_err;
using k3cudatest::runner_with;

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
// written past n tokens (NaN-poisoned tails), and within tol of cpu::matmul (2e-5: bf16x2 GEMMs; plain bf16 rounds x,
// ~3e-3).
void check_group(const std::vector<Mat>& mats, int n, const char* what,
                 k3::cuda::GemmPrecision prec = k3::cuda::GemmPrecision::Bf16x2, double tol = 2e-5) {
  const int64_t cols = mats[0].dev.cols;
  auto x = randn(static_cast<size_t>(n * cols) + 4, 100 + n);
  Dev<float> dx(x);
  k3::cuda::LinearRunner lin(nullptr, prec);
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
    EXPECT_LT(rel_err(std::vector<float>(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(valid)), ref), tol)
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

// Prefill-sized groups (cuBLASLt GEMMs: run_group converts x once for all of them): bit-equal to run() one by one
// in both precisions, past the bf16x2 merged-halves bound (256 tokens) and below it (there run_group takes run()),
// including a matrix of another width in the group (one by one again).
TEST(CudaLinearGroup, PrefillSizesEqualOneByOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using F = k3::WeightFormat;
  using P = k3::cuda::GemmPrecision;
  std::vector<Mat> six;
  const int64_t rows[] = {512, 1000, 64, 300, 2048, 40};
  for (int i = 0; i < 6; ++i) six.push_back(make_mat(rows[i], 320, F::BF16, 60 + i));
  for (int n : {33, 300, 700}) {
    check_group(six, n, "bf16x2 six prefill", P::Bf16x2, 2e-5);
    check_group(six, n, "bf16 six prefill", P::Bf16, 1e-2);
  }
  std::vector<Mat> widths;
  widths.push_back(make_mat(128, 320, F::BF16, 70));
  widths.push_back(make_mat(128, 256, F::BF16, 71));
  check_group(widths, 300, "bf16 two widths prefill", P::Bf16, 1e-2);
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

// One GGUF block matrix of a test group: random blocks (quant_test_blocks.h), the CPU's rows, the device copy.
struct QMat {
  std::vector<uint8_t> blocks;
  std::unique_ptr<Dev<uint8_t>> d;
  k3::WeightMatrix dev;
  std::vector<float> rows;  // the CPU's dequantised rows (the float64 reference's weights)
  std::unique_ptr<Dev<uint8_t>> tiled;  // the tile-major copy dev.tiled points at (attach_tiled), if any
};

QMat make_qmat(k3::WeightFormat f, int64_t rows, int64_t cols, uint32_t seed) {
  QMat m;
  m.blocks = k3quanttest::random_blocks(f, rows, cols, seed, 4, 10);
  m.d = std::make_unique<Dev<uint8_t>>(m.blocks);
  const k3::WeightMatrix host = k3quanttest::host_matrix(f, m.blocks, rows, cols);
  m.rows = k3quanttest::cpu_rows(host);
  m.dev = host;
  m.dev.data = m.d->p;
  m.dev.device = 0;
  return m;
}

// Gives m the tile-major copy the uploader would (quant_mma_tiled.cuh).
void attach_tiled(QMat& m) {
  m.tiled = std::make_unique<Dev<uint8_t>>(static_cast<size_t>(k3::cuda::quant_mma_tiled_bytes(m.dev)));
  ck(k3::cuda::quant_mma_make_tiled(m.dev, m.tiled->p, nullptr), "tiled");
  m.dev.tiled = m.tiled->p;
}

// The six matrices of 2304 columns the group tests share (1 to 4096 rows, some not whole m16 tiles), seeds seed..+5.
struct QGroup {
  std::vector<QMat> q;
  std::vector<const k3::WeightMatrix*> W;
  static constexpr int64_t kCols = 2304;
};
QGroup make_group(k3::WeightFormat f, uint32_t seed, bool tiled) {
  const int64_t rows[] = {17, 4096, 1, 300, 15, 129};
  QGroup g;
  for (int i = 0; i < 6; ++i) {
    g.q.push_back(make_qmat(f, rows[i], QGroup::kCols, seed + static_cast<uint32_t>(i)));
    if (tiled) attach_tiled(g.q.back());
  }
  for (const QMat& m : g.q) g.W.push_back(&m.dev);
  return g;
}

// run_group over GGUF block matrices (and a bf16 / fp32 matrix among them) against run() one by one, bit for bit,
// nothing stored past n tokens, and each product within the tensor-core bound (the looser of the two paths) of the
// float64 product of the CPU's rows, with the tensor-core members' launch per matrix and per format (K3_QUANT_MMA_GROUP
// = 0 / 1). Groups: KDA-like (Q4_K q / k / v / gates / beta at 2304 columns: one v3 launch
// at one token), two formats (one launch each), 4096 columns (the XS form), an odd width that only the fp32 kernels
// take, and a bf16 + fp32 matrix riding along (run() for them).
TEST(CudaLinearGroup, GgufEqualsOneByOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using F = k3::WeightFormat;
  struct Spec { F f; int64_t rows; };
  struct Group { const char* what; int64_t cols; std::vector<Spec> mats; bool dense_too; };
  const Group groups[] = {
      {"KDA-like Q4_K", 2304, {{F::Q4_K, 1000}, {F::Q4_K, 1000}, {F::Q4_K, 1000}, {F::Q4_K, 128}, {F::Q4_K, 32}, {F::Q4_K, 128}}, false},
      {"Q4_K + Q6_K + Q8_0", 2304, {{F::Q4_K, 300}, {F::Q6_K, 200}, {F::Q4_K, 77}, {F::Q8_0, 64}, {F::Q6_K, 9}}, false},
      {"4096 wide (XS)", 4096, {{F::Q4_K, 260}, {F::Q6_K, 100}, {F::Q5_K, 40}, {F::Q6_K, 17}}, false},
      {"IQ4_XS + Q2_K, 768 wide", 768, {{F::IQ4_XS, 90}, {F::IQ4_XS, 33}, {F::Q2_K, 50}}, false},
      {"with bf16 and fp32", 2304, {{F::Q4_K, 96}, {F::Q4_K, 40}}, true},
  };
  for (const Group& G : groups) {
    std::vector<QMat> q;
    for (size_t i = 0; i < G.mats.size(); ++i) q.push_back(make_qmat(G.mats[i].f, G.mats[i].rows, G.cols, static_cast<uint32_t>(900 + 7 * i)));
    std::vector<Mat> dense;
    if (G.dense_too) {
      dense.push_back(make_mat(48, G.cols, F::BF16, 61));
      dense.push_back(make_mat(24, G.cols, F::F32, 62));
    }
    for (int n : {1, 2, 3, 8, 16, 40})
    for (const char* mma_group : {"0", "1"}) {  // the tensor-core members one launch each, or one launch per format
      SCOPED_TRACE(std::string(G.what) + ", n = " + std::to_string(n) + ", K3_QUANT_MMA_GROUP=" + mma_group);
      const std::vector<float> x = randn(static_cast<size_t>(n * G.cols), 300 + n);
      Dev<float> dx(x);
      const auto lin_p = runner_with("K3_QUANT_MMA_GROUP", mma_group);
      k3::cuda::LinearRunner& lin = *lin_p;
      std::vector<const k3::WeightMatrix*> W;
      for (const QMat& m : q) W.push_back(&m.dev);
      for (const Mat& m : dense) W.push_back(&m.dev);
      std::vector<std::unique_ptr<Dev<float>>> yg, y1;
      std::vector<float*> Y;
      for (const k3::WeightMatrix* w : W) {
        yg.push_back(std::make_unique<Dev<float>>(static_cast<size_t>((n + 1) * w->rows)));
        y1.push_back(std::make_unique<Dev<float>>(static_cast<size_t>((n + 1) * w->rows)));
        yg.back()->poison();
        y1.back()->poison();
        Y.push_back(yg.back()->p);
      }
      lin.run_group(W.data(), Y.data(), static_cast<int>(W.size()), dx.p, n);
      for (size_t i = 0; i < W.size(); ++i) lin.run(*W[i], dx.p, n, y1[i]->p);
      ck(cudaDeviceSynchronize(), "sync");
      for (size_t i = 0; i < W.size(); ++i) {
        const auto g = yg[i]->get(), o = y1[i]->get();
        ASSERT_EQ(std::memcmp(g.data(), o.data(), g.size() * 4), 0) << "matrix " << i;
        const size_t valid = static_cast<size_t>(n * W[i]->rows);
        for (size_t j = valid; j < g.size(); ++j) {
          uint32_t bits;
          std::memcpy(&bits, &g[j], 4);
          ASSERT_EQ(bits, 0xffffffffu) << "store past n in matrix " << i;
        }
        if (i >= q.size()) continue;  // bf16 / fp32: CudaLinearGroup.EqualsOneByOne holds them to cpu::matmul
        const auto p = k3quanttest::reference(q[i].rows, x, W[i]->rows, G.cols, n);
        const std::vector<float> got(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(valid));
        EXPECT_LE(k3quanttest::worst_ratio(got, p, k3quanttest::quant_mma_bound(G.cols, true)), 2.0) << "matrix " << i;
      }
    }
  }
}

// quant_gemv_group itself (what run_group takes at one token): bit-equal to quant_gemv per matrix, and it refuses what
// it cannot run in one launch -- two formats, two widths, nine matrices, two tokens, x off 16 bytes, a width v3 does
// not take (4352 > 4096 columns).
TEST(CudaLinearGroup, QuantGemvGroupEqualsQuantGemvAndRefuses) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using F = k3::WeightFormat;
  std::vector<QMat> q;
  const int64_t rows[] = {513, 8, 1, 4096, 129, 64, 7, 300};
  for (int i = 0; i < 8; ++i) q.push_back(make_qmat(F::Q6_K, rows[i], 2304, 40 + i));
  const std::vector<float> x = randn(2304, 77);
  Dev<float> dx(x);
  std::vector<const k3::WeightMatrix*> W;
  std::vector<std::unique_ptr<Dev<float>>> yg, y1;
  std::vector<float*> Y;
  for (const QMat& m : q) {
    W.push_back(&m.dev);
    yg.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(m.dev.rows)));
    y1.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(m.dev.rows)));
    yg.back()->poison();
    Y.push_back(yg.back()->p);
  }
  ASSERT_TRUE(k3::cuda::quant_gemv_groupable(W.data(), 8, dx.p, 1));
  ck(k3::cuda::quant_gemv_group(W.data(), Y.data(), 8, dx.p, 1, nullptr), "quant_gemv_group");
  for (size_t i = 0; i < W.size(); ++i) ck(k3::cuda::quant_gemv(*W[i], dx.p, 1, y1[i]->p, nullptr), "quant_gemv");
  ck(cudaDeviceSynchronize(), "sync");
  for (size_t i = 0; i < W.size(); ++i) {
    const auto g = yg[i]->get(), o = y1[i]->get();
    EXPECT_EQ(std::memcmp(g.data(), o.data(), g.size() * 4), 0) << "matrix " << i;
  }
  const QMat other = make_qmat(F::Q4_K, 16, 2304, 5), wide = make_qmat(F::Q6_K, 16, 4352, 6), narrow = make_qmat(F::Q8_0, 16, 2304, 7);
  const k3::WeightMatrix* two_formats[2] = {W[0], &other.dev};
  const k3::WeightMatrix* two_widths[2] = {W[0], &wide.dev};
  const k3::WeightMatrix* too_wide[1] = {&wide.dev};
  std::vector<const k3::WeightMatrix*> nine(9, W[0]);
  EXPECT_FALSE(k3::cuda::quant_gemv_groupable(two_formats, 2, dx.p, 1));
  EXPECT_FALSE(k3::cuda::quant_gemv_groupable(two_widths, 2, dx.p, 1));
  EXPECT_FALSE(k3::cuda::quant_gemv_groupable(nine.data(), 9, dx.p, 1));
  if (std::getenv("K3_QUANT_GEMV") == nullptr) {  // the rule: v3 at one token, rows up to 4096 wide (v3:N forces it)
    EXPECT_FALSE(k3::cuda::quant_gemv_groupable(W.data(), 2, dx.p, 2));
    EXPECT_FALSE(k3::cuda::quant_gemv_groupable(too_wide, 1, dx.p, 1));
  }
  EXPECT_FALSE(k3::cuda::quant_gemv_groupable(W.data(), 2, dx.p + 1, 1));  // x off 16 bytes: v1 by the rule
  const k3::WeightMatrix* q8[1] = {&narrow.dev};
  EXPECT_TRUE(k3::cuda::quant_gemv_groupable(q8, 1, dx.p, 1));  // every format with a v3 decoder
  EXPECT_EQ(k3::cuda::quant_gemv_group(two_formats, Y.data(), 2, dx.p, 1, nullptr), cudaErrorInvalidValue);
}

// quant_gemv_mma_group (what run_group takes at 2..16 tokens for Q4_K, every tensor-core batch for Q5_K, 2..7 for Q6_K):
// bit-equal to quant_gemv_mma per matrix on the same prepared x (with and without lo), rows off every tile size; refuses
// two formats, two widths, nine matrices, and batches where the rule takes the Rows form (Q6_K at 8 tokens, Q4_K at 17).
// n Gaussian activation rows prepared for the tensor-core GEMV (quant_mma_prep), split into hi + lo or hi alone.
struct PreppedX {
  Dev<float> x;
  Dev<uint16_t> hi, lo;
  Dev<float> xsum;
  k3::cuda::QuantMmaActs a;
  PreppedX(int n, int64_t cols, uint64_t seed, bool split)
      : x(randn(static_cast<size_t>(n * cols), seed)), hi(static_cast<size_t>(n * cols)), lo(static_cast<size_t>(n * cols)),
        xsum(static_cast<size_t>(k3::cuda::quant_mma_ldx(n) * (cols / 32))) {
    ck(k3::cuda::quant_mma_prep(x.p, n, cols, hi.p, split ? lo.p : nullptr, xsum.p, nullptr), "prep");
    a = k3::cuda::QuantMmaActs{hi.p, split ? lo.p : nullptr, xsum.p, n, cols};
  }
};

// quant_gemv_mma_group over W against `one` (each matrix on its own), bit for bit; the group's outputs poisoned first.
void expect_group_bits(const std::vector<const k3::WeightMatrix*>& W, const k3::cuda::QuantMmaActs& a,
                       const std::function<cudaError_t(const k3::WeightMatrix&, float*)>& one) {
  std::vector<std::unique_ptr<Dev<float>>> yg, y1;
  std::vector<float*> Y;
  for (const k3::WeightMatrix* w : W) {
    yg.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(a.n * w->rows)));
    y1.push_back(std::make_unique<Dev<float>>(static_cast<size_t>(a.n * w->rows)));
    yg.back()->poison();
    Y.push_back(yg.back()->p);
  }
  ck(k3::cuda::quant_gemv_mma_group(W.data(), Y.data(), static_cast<int>(W.size()), a, nullptr), "group");
  for (size_t i = 0; i < W.size(); ++i) ck(one(*W[i], y1[i]->p), "one");
  ck(cudaDeviceSynchronize(), "sync");
  for (size_t i = 0; i < W.size(); ++i) {
    const auto g = yg[i]->get(), o = y1[i]->get();
    EXPECT_EQ(std::memcmp(g.data(), o.data(), g.size() * 4), 0) << "matrix " << i;
  }
}

TEST(CudaLinearGroup, QuantMmaGroupEqualsQuantMmaAndRefuses) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using F = k3::WeightFormat;
  const int64_t cols = QGroup::kCols;
  for (F f : {F::Q4_K, F::Q5_K, F::Q6_K}) {
    const QGroup grp = make_group(f, 70, false);
    const std::vector<const k3::WeightMatrix*>& W = grp.W;
    for (int n : {2, 5, 7, 8, 16, 17}) {
      for (bool split : {true, false}) {
        SCOPED_TRACE(std::string(k3::weight_format_name(f)) + ", n = " + std::to_string(n) + (split ? ", hi + lo" : ", hi"));
        const PreppedX px(n, cols, 500 + n, split);
        const k3::cuda::QuantMmaActs& a = px.a;
        const bool ksplit = f == F::Q6_K ? n < 8 : f == F::Q4_K ? n <= 16 : true;  // quant_gemv_mma's rule (Q5_K: KSplit always)
        ASSERT_EQ(k3::cuda::quant_gemv_mma_groupable(W.data(), 6, a), ksplit);
        if (!ksplit) {
          std::vector<float*> none(6, nullptr);
          EXPECT_EQ(k3::cuda::quant_gemv_mma_group(W.data(), none.data(), 6, a, nullptr), cudaErrorInvalidValue);
          continue;
        }
        expect_group_bits(W, a, [&](const k3::WeightMatrix& w, float* y) { return k3::cuda::quant_gemv_mma(w, a, y, nullptr); });
      }
    }
  }
  const QMat a4 = make_qmat(F::Q4_K, 64, cols, 1), b6 = make_qmat(F::Q6_K, 64, cols, 2), wide = make_qmat(F::Q4_K, 64, 2560, 3);
  {  // a member with a tiled copy beside members without: no one launch
    QMat t4 = make_qmat(F::Q4_K, 64, cols, 4);
    attach_tiled(t4);
    Dev<uint16_t> h(4 * cols);
    Dev<float> s(8 * cols / 32);
    const k3::cuda::QuantMmaActs four{h.p, nullptr, s.p, 4, cols};
    const k3::WeightMatrix* mixed[2] = {&a4.dev, &t4.dev};
    EXPECT_FALSE(k3::cuda::quant_gemv_mma_groupable(mixed, 2, four));
  }
  Dev<uint16_t> hi(4 * 2560);
  Dev<float> xsum(8 * 2560 / 32);
  const k3::cuda::QuantMmaActs act{hi.p, nullptr, xsum.p, 4, cols};
  const k3::WeightMatrix* two_formats[2] = {&a4.dev, &b6.dev};
  const k3::WeightMatrix* two_widths[2] = {&a4.dev, &wide.dev};
  std::vector<const k3::WeightMatrix*> nine(9, &a4.dev);
  EXPECT_FALSE(k3::cuda::quant_gemv_mma_groupable(two_formats, 2, act));
  EXPECT_FALSE(k3::cuda::quant_gemv_mma_groupable(two_widths, 2, act));
  EXPECT_FALSE(k3::cuda::quant_gemv_mma_groupable(nine.data(), 9, act));
  EXPECT_TRUE(k3::cuda::quant_gemv_mma_groupable(two_formats, 1, act));
}

// The same with every member tiled (quant_mma_tiled.cuh; K3_QUANT_MMA_TILED=all): one Tiled launch, each product bit-equal
// to quant_gemv_mma's on its own (Tiled), 1..16 tokens.
TEST(CudaLinearGroup, TiledGroupEqualsTiledOneByOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using F = k3::WeightFormat;
  const int64_t cols = QGroup::kCols;
  for (F f : {F::Q4_K, F::Q5_K, F::Q6_K}) {
    const QGroup grp = make_group(f, 90, true);
    const std::vector<const k3::WeightMatrix*>& W = grp.W;
    for (int n : {1, 2, 7, 8, 16, 17}) {
      for (bool split : {true, false}) {
        SCOPED_TRACE(std::string(k3::weight_format_name(f)) + ", n = " + std::to_string(n) + (split ? ", hi + lo" : ", hi"));
        const PreppedX px(n, cols, 700 + n, split);
        const k3::cuda::QuantMmaActs& a = px.a;
        const bool tiled = n <= k3::cuda::kQuantMmaTiledMaxTokens;
        const bool ksplit = f == F::Q6_K ? n < 8 : f == F::Q4_K ? n <= 16 : true;  // above 16 tokens the untiled rule
        ASSERT_EQ(k3::cuda::quant_gemv_mma_groupable(W.data(), 6, a), tiled || ksplit);
        if (!tiled) continue;
        expect_group_bits(W, a, [&](const k3::WeightMatrix& w, float* y) {
          return k3::cuda::quant_gemv_mma(w, a, y, nullptr, 0, k3::cuda::QuantMmaForm::Tiled);
        });
      }
    }
  }
}

// Microseconds per run_group call of the matrices `rows` (format f, cols wide) laid back to back, the weights at copy
// r % copies of `w` (each copy bytes long) in call r: 5 warm-up calls, then 40 timed, so that each call reads HBM.
double group_us(k3::cuda::LinearRunner& lin, k3::WeightFormat f, const uint8_t* w, int64_t bytes, int copies,
                const std::vector<int64_t>& rows, int64_t cols, const float* x, float* y, int n) {
  const int64_t row_bytes = k3::row_data_bytes(f, cols);
  return k3cudatest::event_us(5, 40, [&](int r) {
    const uint8_t* base = w + (static_cast<int64_t>(r + 5) % copies) * bytes;
    std::vector<k3::WeightMatrix> D(rows.size());
    std::vector<const k3::WeightMatrix*> W;
    std::vector<float*> Y;
    int64_t off = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      D[i] = k3::WeightMatrix{f, base + off * row_bytes, nullptr, rows[i], cols, 0};
      W.push_back(&D[i]);
      Y.push_back(y + off * n);
      off += rows[i];
    }
    lin.run_group(W.data(), Y.data(), static_cast<int>(W.size()), x, n);
  });
}

struct Layer {
  const char* what;
  std::vector<int64_t> rows;
};

// Prints group_us for each layer and batch, one column per runner (runners[0] the reference of the ratios).
void time_layers(k3::WeightFormat f, const std::vector<Layer>& layers, const std::vector<int>& batches,
                 const std::vector<std::pair<const char*, k3::cuda::LinearRunner*>>& runners) {
  const int64_t cols = 2304;
  for (const Layer& L : layers) {
    int64_t total = 0;
    for (int64_t r : L.rows) total += r;
    const int64_t bytes = total * k3::row_data_bytes(f, cols);
    const int copies = static_cast<int>(std::max<int64_t>(2, (512ll << 20) / bytes));
    Dev<uint8_t> w(static_cast<size_t>(bytes * copies));
    if (f == k3::WeightFormat::BF16) {
      ck(k3::cuda::fill_uniform_bf16(reinterpret_cast<uint16_t*>(w.p), total * cols * copies, 0.05f, 1, nullptr), "fill");
    } else {
      const std::vector<uint8_t> blocks = k3quanttest::random_blocks(f, total, cols, 17, 4, 10);
      for (int c = 0; c < copies; ++c)
        ck(cudaMemcpy(w.p + c * bytes, blocks.data(), static_cast<size_t>(bytes), cudaMemcpyHostToDevice), "H2D");
    }
    for (int n : batches) {
      Dev<float> x(randn(static_cast<size_t>(n * cols), 9)), y(static_cast<size_t>(n * total));
      std::printf("[ group ] %s %-22s n=%2d", k3::weight_format_name(f), L.what, n);
      double ref = 0;
      for (const auto& [name, lin] : runners) {
        const double us = group_us(*lin, f, w.p, bytes, copies, L.rows, cols, x.p, y.p, n);
        if (ref == 0) ref = us;
        std::printf("  %s %7.1f us (%5.0f GB/s, %.2fx)", name, us, bytes / us / 1e3, ref / us);
      }
      std::printf("\n");
    }
  }
}

// Kimi-Linear layers' projections of x, grouped vs one by one (K3_CUDA_LINEAR_GROUP=0), the weights rotated through
// >= 512 MB. Prints only. bf16: a KDA layer's q, k, v 4096 x 2304, f_a, g_a 128 x 2304, b 32 x 2304 and an MLA layer's q
// 6144, kv_a 576, g 4096.
TEST(CudaLinearGroupTiming, KimiLinearLayers) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto one = runner_with("K3_CUDA_LINEAR_GROUP", "0");
  k3::cuda::LinearRunner grouped(nullptr);
  time_layers(k3::WeightFormat::BF16, {{"KDA q/k/v/f_a/b/g_a", {4096, 4096, 4096, 128, 32, 128}}, {"MLA q/kv_a/g", {6144, 576, 4096}}},
              {1, 2, 4, 8, 16, 32}, {{"one by one", one.get()}, {"grouped", &grouped}});
}

// The same with llama-quantize's Q4_K (the Kimi-Linear slice's Q4_K_M: KDA's six, MLA's q / kv_a, a shared expert's
// gate / up): the rule (the tensor-core members in one launch per format) against K3_QUANT_MMA_GROUP=0 (one each).
TEST(CudaLinearGroupTiming, KimiLinearLayersQ4K) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto one = runner_with("K3_CUDA_LINEAR_GROUP", "0"), mma_each = runner_with("K3_QUANT_MMA_GROUP", "0");
  k3::cuda::LinearRunner grouped(nullptr);
  time_layers(k3::WeightFormat::Q4_K,
              {{"KDA q/k/v/f_a/b/g_a", {4096, 4096, 4096, 128, 32, 128}}, {"MLA q/kv_a", {6144, 576}}, {"shared gate/up", {1024, 1024}}},
              {1, 2, 4, 8, 16}, {{"one by one", one.get()}, {"K3_QUANT_MMA_GROUP=0", mma_each.get()}, {"grouped", &grouped}});
}

}  // namespace
