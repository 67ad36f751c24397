// Small helpers the CUDA kernel tests share: error check, GPU presence, a typed device buffer.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "k3/backend/cuda/linear.h"
#include "k3/core/dtype.h"

namespace k3cudatest {

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// n elements of T in device memory (at least one allocated), freed on destruction.
template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t n_) : n(n_) { ck(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void put(const std::vector<T>& h) { ck(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), "H2D"); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    ck(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
  // All bytes 0xff: NaN for floats, so an output a kernel forgot to write shows.
  void poison() { ck(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)), "memset"); }
};

// n Gaussian values (mean 0, standard deviation `scale`) from a seeded generator.
inline std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// n values in [lo, hi) from a linear congruential generator: cheap for the timing tests' 10^8-element inputs (a
// Mersenne twister over them would dominate the run time).
inline std::vector<float> lcg_fill(size_t n, float lo, float hi, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + (hi - lo) * static_cast<float>(s >> 8) * (1.0f / 16777216.0f);
  }
  return v;
}

// Each value as bf16 bits, rounded to nearest even (k3::f32_to_bf16, the kernels' rounding).
inline std::vector<uint16_t> bf16_bits(const std::vector<float>& x) {
  std::vector<uint16_t> r(x.size());
  for (size_t i = 0; i < x.size(); ++i) r[i] = k3::f32_to_bf16(x[i]);
  return r;
}

// max |got - ref| / max |ref| (at least 1e-30); infinity for a size mismatch or any non-finite output.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double maxref = 0, maxdiff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    maxref = std::max(maxref, std::fabs(static_cast<double>(ref[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!std::isfinite(got[i]) || !std::isfinite(d)) return INFINITY;
    maxdiff = std::max(maxdiff, d);
  }
  return maxdiff / std::max(maxref, 1e-30);
}

// Microseconds per call(r) on the default stream by CUDA events: `warm` untimed calls (r < 0), then `reps` timed (r =
// 0 .. reps - 1); the caller rotates its weights by r so that each call reads HBM. For the Timing tests (prints only).
inline double event_us(int warm, int reps, const std::function<void(int)>& call) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int r = -warm; r < reps; ++r) {
    if (r == 0) cudaEventRecord(a);
    call(r);
  }
  cudaEventRecord(b);
  ck(cudaEventSynchronize(b), "event sync");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0 * ms / reps;
}

// A LinearRunner made while VAR=VALUE (its switches are read when it is made); the variable is unset after.
inline std::unique_ptr<k3::cuda::LinearRunner> runner_with(const char* var, const char* value, cudaStream_t stream = nullptr) {
  setenv(var, value, 1);
  auto r = std::make_unique<k3::cuda::LinearRunner>(stream);
  unsetenv(var);
  return r;
}

}  // namespace k3cudatest

#define SKIP_WITHOUT_GPU() \
  if (!k3cudatest::have_gpu()) GTEST_SKIP() << "no CUDA device"
