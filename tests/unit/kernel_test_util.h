// Comparison helpers of the kernel tests (float64 references vs fp32 kernels).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/weight_kernels.h"

namespace k3test {

// max |got - ref| / max |ref| (infinity if got has a non-finite value).
template <class A, class B>
double rel_err(const A& got, const B& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double md = 0, mr = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(double(got[i]))) return INFINITY;
    md = std::max(md, std::fabs(double(got[i]) - double(ref[i])));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return mr > 0 ? md / mr : md;
}

// Tracks the worst error of a test and prints it at the end (the measured tolerance margin).
struct Worst {
  double v = 0;
  const char* what;
  explicit Worst(const char* w) : what(w) {}
  void add(double x) { v = std::max(v, x); }
  ~Worst() { std::printf("[ max rel err ] %s: %.3g\n", what, v); }
};

// Kernel tests that run once per CPU tier with kernels (cpu_isa.h), the tier forced in-process; a tier the
// CPU cannot run is skipped with the reason. Instantiate with kAllCpuTiers and cpu_tier_name.
class CpuTierTest : public ::testing::TestWithParam<k3::cpu::CpuIsa> {
 protected:
  void SetUp() override {
    const auto& cpu = k3::cpu::cpu_state();
    if (const std::string m = k3::cpu::isa_missing_features(cpu.features, GetParam(), cpu.amx_status == "granted"); !m.empty())
      GTEST_SKIP() << "this CPU cannot run the " << k3::cpu::isa_name(GetParam()) << " tier (missing: " << m << ")";
    k3::cpu::force_cpu_isa_for_testing(GetParam());
  }
  void TearDown() override { k3::cpu::force_cpu_isa_for_testing(std::nullopt); }
};
inline const auto kAllCpuTiers =
    ::testing::Values(k3::cpu::CpuIsa::Avx2, k3::cpu::CpuIsa::Avx2Int8, k3::cpu::CpuIsa::Avx512, k3::cpu::CpuIsa::Avx512Bf16,
                      k3::cpu::CpuIsa::Amx);
inline std::string cpu_tier_name(const ::testing::TestParamInfo<k3::cpu::CpuIsa>& info) {
  return std::string(k3::cpu::isa_name(info.param));
}

}  // namespace k3test
