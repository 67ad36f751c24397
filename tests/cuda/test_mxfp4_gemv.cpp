// CUDA GEMV kernels against the CPU backend's matmul (k3::cpu::matmul), plus a timing line per shape.
#include <gtest/gtest.h>

#include "gemv_check.h"

using namespace k3::cuda_test;

class CudaGemv : public ::testing::TestWithParam<Kind> {};

TEST_P(CudaGemv, MatchesCpuMatmul) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const Kind kind = GetParam();
  for (const Shape& s : test_shapes()) {
    const bool big = s.rows * s.cols >= (1 << 22);
    const GemvResult r = run_gemv(kind, s.rows, s.cols, big ? 100 : 0);
    EXPECT_LT(r.max_rel, 1e-5) << kind_name(kind) << " " << s.rows << "x" << s.cols;
    if (big)
      std::printf("[ timing ] %-16s %5lld x %5lld  max_rel %.2e  %8.2f us  %7.1f GB/s  %5.1f%% of 4.8 TB/s  (hot L2 %7.1f GB/s)\n",
                  kind_name(kind), static_cast<long long>(s.rows), static_cast<long long>(s.cols), r.max_rel, r.us,
                  r.gbps, r.gbps / 48.0, r.gbps_hot);
  }
}

INSTANTIATE_TEST_SUITE_P(All, CudaGemv,
                         ::testing::Values(Kind::Mxfp4F32, Kind::Mxfp4Bf16, Kind::Bf16F32, Kind::Bf16Bf16));

TEST(CudaGemvArgs, RejectsBadShapes) {
  EXPECT_EQ(k3::cuda::mxfp4_gemv(nullptr, nullptr, 4, 33, static_cast<const float*>(nullptr), nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(k3::cuda::bf16_gemv(nullptr, 4, 12, static_cast<const float*>(nullptr), nullptr, nullptr),
            cudaErrorInvalidValue);
}
