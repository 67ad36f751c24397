// The bf16 decode GEMV (gemv_bf16.cu) against a float64 reference on random inputs: every row split (1, 2, 4, 8
// warps a row), widths off the 256-column chunk and past 64 chunks (a lane's second batch of loads), row counts off
// a block's rows, 1..8 tokens; nothing written past the rows (NaN-poisoned tails); a group bit-equal to its
// matrices one by one; the split rule on the Kimi-Linear shapes it was made for; bad arguments refused. Tolerance:
// fp32 accumulation over <= 20000 products of N(0, 0.05^2) x N(0, 1): 1e-5 of the largest output.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "cuda_test_util.h"
#include "k3/backend/cuda/gemv_bf16.h"
#include "k3/core/dtype.h"

namespace {

using k3cudatest::ck;
using k3cudatest::Dev;
using k3cudatest::have_gpu;
using k3cudatest::randn;

struct Bf16Mat {
  int64_t rows, cols;
  std::vector<uint16_t> w;
  std::unique_ptr<Dev<uint16_t>> d;
  Bf16Mat(int64_t r, int64_t c, uint64_t seed) : rows(r), cols(c) {
    const auto f = randn(static_cast<size_t>(r * c), seed, 0.05f);
    w.resize(f.size());
    for (size_t i = 0; i < f.size(); ++i) w[i] = k3::f32_to_bf16(f[i]);
    d = std::make_unique<Dev<uint16_t>>(w);
  }
  // float64 products of the bf16 values with x [n][cols]: [n][rows].
  std::vector<double> ref(const std::vector<float>& x, int n) const {
    std::vector<double> y(static_cast<size_t>(n * rows));
    for (int t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0;
        for (int64_t c = 0; c < cols; ++c)
          s += static_cast<double>(k3::bf16_to_f32(w[r * cols + c])) * x[t * cols + c];
        y[t * rows + r] = s;
      }
    return y;
  }
};

// Runs `mats` as one group on x; checks each against float64 and its poisoned tail; returns the outputs.
std::vector<std::vector<float>> run_and_check(const std::vector<const Bf16Mat*>& mats, int n, uint64_t seed) {
  const int64_t cols = mats[0]->cols;
  const auto x = randn(static_cast<size_t>(n * cols), seed);
  Dev<float> dx(x);
  std::vector<std::unique_ptr<Dev<float>>> ys;
  std::vector<const uint16_t*> W;
  std::vector<int64_t> rows;
  std::vector<float*> Y;
  for (const Bf16Mat* m : mats) {
    ys.push_back(std::make_unique<Dev<float>>(static_cast<size_t>((n + 1) * m->rows)));
    ys.back()->poison();
    W.push_back(m->d->p);
    rows.push_back(m->rows);
    Y.push_back(ys.back()->p);
  }
  ck(k3::cuda::gemv_bf16_group(W.data(), rows.data(), Y.data(), static_cast<int>(mats.size()), cols, dx.p, n, nullptr),
     "gemv_bf16_group");
  ck(cudaDeviceSynchronize(), "sync");
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < mats.size(); ++i) {
    const auto got = ys[i]->get();
    const auto ref = mats[i]->ref(x, n);
    double maxref = 0, maxdiff = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      maxref = std::max(maxref, std::fabs(ref[j]));
      maxdiff = std::max(maxdiff, std::isfinite(got[j]) ? std::fabs(got[j] - ref[j]) : INFINITY);
    }
    EXPECT_LT(maxdiff / maxref, 1e-5) << mats[i]->rows << "x" << cols << " n=" << n << " split "
                                      << k3::cuda::gemv_bf16_split(mats[i]->rows, cols);
    for (size_t j = ref.size(); j < got.size(); ++j) {
      uint32_t bits;
      std::memcpy(&bits, &got[j], 4);
      EXPECT_EQ(bits, 0xffffffffu) << "store past the rows: " << mats[i]->rows << "x" << cols << " n=" << n;
    }
    out.emplace_back(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(ref.size()));
  }
  return out;
}

TEST(CudaGemvBf16, SplitRuleOnKimiLinearShapes) {
  using k3::cuda::gemv_bf16_split;
  EXPECT_EQ(gemv_bf16_split(4096, 2304), 2);    // KDA q / k / v: 9 chunks a row -> 5 a warp
  EXPECT_EQ(gemv_bf16_split(2304, 4096), 2);    // KDA o: 16 chunks -> 8 a warp
  EXPECT_EQ(gemv_bf16_split(256, 2304), 8);     // the router: 256 rows would fill 32 SMs
  EXPECT_EQ(gemv_bf16_split(1024, 2304), 8);    // shared expert gate / up
  EXPECT_EQ(gemv_bf16_split(2304, 1024), 2);    // shared expert down
  EXPECT_EQ(gemv_bf16_split(4096, 128), 1);     // KDA f_b / g_b: half a chunk a row
  EXPECT_EQ(gemv_bf16_split(163840, 2304), 2);  // the head
  EXPECT_EQ(gemv_bf16_split(8, 20000), 8);      // 79 chunks: a warp's second batch of loads
}

TEST(CudaGemvBf16, MatchesFloat64EverySplit) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  struct Shape { int64_t rows, cols; int split; };
  const Shape shapes[] = {{4101, 2304, 2}, {37, 2304, 8}, {1000, 520, 2}, {600, 1032, 4}, {4500, 1032, 1}, {300, 2056, 8},
                          {33, 128, 1}, {70, 20000, 8}, {5000, 8, 1}};
  for (const Shape& s : shapes) {
    ASSERT_EQ(k3::cuda::gemv_bf16_split(s.rows, s.cols), s.split) << s.rows << "x" << s.cols;
    const Bf16Mat m(s.rows, s.cols, 11 + s.rows);
    for (int n : {1, 2, 5, 8}) run_and_check({&m}, n, 100 * n + s.cols);
  }
}

// A group of matrices with different splits: each output bit-equal to the matrix run alone.
TEST(CudaGemvBf16, GroupEqualsOneByOne) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const Bf16Mat a(4101, 2304, 1), b(37, 2304, 2), c(300, 2304, 3), d(1, 2304, 4);
  const std::vector<const Bf16Mat*> group = {&a, &b, &c, &d};
  for (int n : {1, 3, 8}) {
    const auto g = run_and_check(group, n, 7 + n);
    for (size_t i = 0; i < group.size(); ++i) {
      const auto one = run_and_check({group[i]}, n, 7 + n);
      ASSERT_EQ(std::memcmp(g[i].data(), one[0].data(), g[i].size() * 4), 0) << "matrix " << i << " n=" << n;
    }
  }
}

TEST(CudaGemvBf16, RefusesWhatItCannotRun) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Dev<float> x(64), y(64);
  Dev<uint16_t> w(64);
  const uint16_t* W[9] = {w.p, w.p, w.p, w.p, w.p, w.p, w.p, w.p, w.p};
  int64_t rows[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  float* Y[9] = {y.p, y.p, y.p, y.p, y.p, y.p, y.p, y.p, y.p};
  using k3::cuda::gemv_bf16_group;
  EXPECT_EQ(gemv_bf16_group(W, rows, Y, 9, 8, x.p, 1, nullptr), cudaErrorInvalidValue);      // > 8 matrices
  EXPECT_EQ(gemv_bf16_group(W, rows, Y, 1, 12, x.p, 1, nullptr), cudaErrorInvalidValue);     // cols % 8
  EXPECT_EQ(gemv_bf16_group(W, rows, Y, 1, 8, x.p + 1, 1, nullptr), cudaErrorInvalidValue);  // x off 16 bytes
  EXPECT_EQ(gemv_bf16_group(W, rows, Y, 1, 8, x.p, 9, nullptr), cudaErrorInvalidValue);      // > 8 tokens
  EXPECT_EQ(gemv_bf16_group(W, rows, Y, 0, 8, x.p, 1, nullptr), cudaErrorInvalidValue);
  rows[0] = 0;
  EXPECT_EQ(gemv_bf16_group(W, rows, Y, 1, 8, x.p, 1, nullptr), cudaErrorInvalidValue);
  const uint16_t* W1[1] = {w.p + 1};  // weights off 16 bytes: refused (the caller falls back to linear.cu's kernel)
  EXPECT_EQ(gemv_bf16_group(W1, rows + 1, Y, 1, 8, x.p, 1, nullptr), cudaErrorInvalidValue);
  const void* const* wv = reinterpret_cast<const void* const*>(W);
  EXPECT_TRUE(k3::cuda::gemv_bf16_applies(8, x.p, wv, 1));
  EXPECT_FALSE(k3::cuda::gemv_bf16_applies(12, x.p, wv, 1));
  EXPECT_FALSE(k3::cuda::gemv_bf16_applies(8, x.p + 1, wv, 1));
  EXPECT_FALSE(k3::cuda::gemv_bf16_applies(8, x.p, reinterpret_cast<const void* const*>(W1), 1));
}

}  // namespace
