// Shared GEMV check helpers of test_mxfp4_gemv.cpp (GoogleTest, run by scripts/gpu-check):
// random weights, the CUDA GEMV against k3::cpu::matmul, and cudaEvent timing.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "k3/backend/cpu/ops.h"
#include "k3/backend/cuda/mxfp4_gemv.h"
#include "k3/core/dtype.h"
#include "k3/core/weight.h"

namespace k3::cuda_test {

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct GemvResult {
  double max_rel = 0;   // max|gpu - cpu| / max|cpu|
  double us = 0;        // per call
  double gbps = 0;      // weight bytes / time, L2 flushed before each call (HBM-bound)
  double us_hot = 0, gbps_hot = 0;  // back-to-back calls (weight may stay in the 50 MB L2)
};

enum class Kind { Mxfp4F32, Mxfp4Bf16, Bf16F32, Bf16Bf16 };
inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Mxfp4F32: return "mxfp4 W, f32 x";
    case Kind::Mxfp4Bf16: return "mxfp4 W, bf16 x";
    case Kind::Bf16F32: return "bf16 W, f32 x";
    default: return "bf16 W, bf16 x";
  }
}

inline GemvResult run_gemv(Kind kind, int64_t rows, int64_t cols, int reps = 100, uint32_t seed = 1) {
  std::mt19937 rng(seed + static_cast<uint32_t>(rows * 31 + cols));
  const bool mx = kind == Kind::Mxfp4F32 || kind == Kind::Mxfp4Bf16;
  const bool xbf = kind == Kind::Mxfp4Bf16 || kind == Kind::Bf16Bf16;
  std::vector<uint8_t> packed, scales;
  std::vector<uint16_t> wbf;
  WeightMatrix W;
  W.rows = rows;
  W.cols = cols;
  if (mx) {
    packed.resize(static_cast<size_t>(rows * cols / 2));
    scales.resize(static_cast<size_t>(rows * cols / 32));
    std::uniform_int_distribution<int> nib(1, 15), sc(120, 130);
    for (auto& b : packed) {  // never zero nibbles (0 and 8 = +-0 avoided: 8 is -0, keep it rare but allowed)
      int lo = nib(rng), hi = nib(rng);
      b = static_cast<uint8_t>(lo | (hi << 4));
    }
    for (auto& s : scales) s = static_cast<uint8_t>(sc(rng));
    W.format = WeightFormat::MXFP4;
    W.data = packed.data();
    W.scales = scales.data();
  } else {
    wbf.resize(static_cast<size_t>(rows * cols));
    std::normal_distribution<float> nd(0.f, 0.05f);
    for (auto& w : wbf) w = f32_to_bf16(nd(rng));
    W.format = WeightFormat::BF16;
    W.data = wbf.data();
  }
  std::vector<float> x(static_cast<size_t>(cols));
  std::vector<uint16_t> xb(static_cast<size_t>(cols));
  std::normal_distribution<float> nx(0.f, 1.f);
  for (int64_t i = 0; i < cols; ++i) {
    xb[i] = f32_to_bf16(nx(rng));
    x[i] = xbf ? bf16_to_f32(xb[i]) : nx(rng);
  }
  std::vector<float> ref(static_cast<size_t>(rows)), out(static_cast<size_t>(rows));
  cpu::matmul(W, x.data(), 1, ref.data());

  void *dW = nullptr, *dS = nullptr, *dx = nullptr;
  float* dy = nullptr;
  const size_t wbytes = mx ? packed.size() : wbf.size() * 2;
  ck(cudaMalloc(&dW, wbytes), "malloc W");
  ck(cudaMemcpy(dW, mx ? static_cast<const void*>(packed.data()) : wbf.data(), wbytes, cudaMemcpyHostToDevice), "cp W");
  if (mx) {
    ck(cudaMalloc(&dS, scales.size()), "malloc S");
    ck(cudaMemcpy(dS, scales.data(), scales.size(), cudaMemcpyHostToDevice), "cp S");
  }
  ck(cudaMalloc(&dx, x.size() * 4), "malloc x");
  if (xbf)
    ck(cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), "cp x");
  else
    ck(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "cp x");
  ck(cudaMalloc(reinterpret_cast<void**>(&dy), out.size() * 4), "malloc y");
  cudaStream_t st;
  ck(cudaStreamCreate(&st), "stream");
  auto call = [&]() {
    const auto* P = static_cast<const uint8_t*>(dW);
    const auto* S = static_cast<const uint8_t*>(dS);
    const auto* B = static_cast<const uint16_t*>(dW);
    switch (kind) {
      case Kind::Mxfp4F32: return cuda::mxfp4_gemv(P, S, rows, cols, static_cast<const float*>(dx), dy, st);
      case Kind::Mxfp4Bf16: return cuda::mxfp4_gemv(P, S, rows, cols, static_cast<const uint16_t*>(dx), dy, st);
      case Kind::Bf16F32: return cuda::bf16_gemv(B, rows, cols, static_cast<const float*>(dx), dy, st);
      default: return cuda::bf16_gemv(B, rows, cols, static_cast<const uint16_t*>(dx), dy, st);
    }
  };
  ck(call(), "launch");
  ck(cudaStreamSynchronize(st), "sync");
  ck(cudaMemcpy(out.data(), dy, out.size() * 4, cudaMemcpyDeviceToHost), "cp y");
  double maxref = 0, maxdiff = 0;
  for (int64_t r = 0; r < rows; ++r) {
    maxref = std::max(maxref, std::fabs(static_cast<double>(ref[r])));
    const double d = std::fabs(static_cast<double>(ref[r]) - out[r]);
    maxdiff = std::isnan(d) ? INFINITY : std::max(maxdiff, d);
  }
  GemvResult res;
  res.max_rel = maxdiff / std::max(maxref, 1e-30);
  // Timing: warm-up, then `reps` back-to-back launches between two events. The weight (<= ~25 MB)
  // may partly sit in the 50 MB L2 across reps; flush it by touching a 256 MB buffer before timing.
  if (reps > 0) {
    void* flush = nullptr;
    ck(cudaMalloc(&flush, 256u << 20), "malloc flush");
    for (int i = 0; i < 10; ++i) ck(call(), "warm");
    cudaEvent_t e0, e1;
    ck(cudaEventCreate(&e0), "ev");
    ck(cudaEventCreate(&e1), "ev");
    float ms_total = 0;
    // Hot-L2 number: plain back-to-back reps (what a decode loop over many weights does NOT see when the
    // model is larger than L2); we report the cold number: flush, then time, per rep batch of 1.
    for (int i = 0; i < reps; ++i) {
      ck(cudaMemsetAsync(flush, i & 0xff, 256u << 20, st), "flush");
      ck(cudaEventRecord(e0, st), "rec");
      ck(call(), "time");
      ck(cudaEventRecord(e1, st), "rec");
      ck(cudaEventSynchronize(e1), "evsync");
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
      ms_total += ms;
    }
    res.us = 1000.0 * ms_total / reps;
    const double bytes = static_cast<double>(W.bytes());
    res.gbps = bytes / (res.us * 1e-6) / 1e9;
    ck(cudaEventRecord(e0, st), "rec");
    for (int i = 0; i < reps; ++i) ck(call(), "time hot");
    ck(cudaEventRecord(e1, st), "rec");
    ck(cudaEventSynchronize(e1), "evsync");
    float ms_hot = 0;
    ck(cudaEventElapsedTime(&ms_hot, e0, e1), "elapsed");
    res.us_hot = 1000.0 * ms_hot / reps;
    res.gbps_hot = bytes / (res.us_hot * 1e-6) / 1e9;
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(flush);
  }
  cudaStreamDestroy(st);
  cudaFree(dW);
  cudaFree(dS);
  cudaFree(dx);
  cudaFree(dy);
  return res;
}

struct Shape {
  int64_t rows, cols;
};
// K3's projection shapes (model-spec) plus small and odd row counts.
inline const std::vector<Shape>& test_shapes() {
  static const std::vector<Shape> s = {{3072, 3584}, {3584, 1536}, {7168, 3584}, {1, 32},    {17, 64},
                                       {33, 96},     {1001, 512},  {4097, 2048}, {16, 7168}, {129, 14336}};
  return s;
}

}  // namespace k3::cuda_test
