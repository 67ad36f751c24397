// Comparison helpers of the kernel tests (float64 references vs fp32 kernels).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>

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

}  // namespace k3test
