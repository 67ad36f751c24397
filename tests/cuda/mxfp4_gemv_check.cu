// The same checks as test_mxfp4_gemv.cpp as a plain program (no GoogleTest), for machines without
// the project's dependencies; built by scripts/gpu-check with a single nvcc command. Exit 1 on failure.
#include "gemv_check.h"

using namespace k3::cuda_test;

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  cudaDeviceProp p{};
  cudaGetDeviceProperties(&p, 0);
  std::printf("device: %s, %d SMs\n", p.name, p.multiProcessorCount);
  std::printf("| kind | rows x cols | max rel err | us/call (cold L2) | GB/s | of 4.8 TB/s | us/call (hot) | GB/s hot |\n|---|---|---|---|---|---|---|---|\n");
  int fails = 0;
  for (Kind kind : {Kind::Mxfp4F32, Kind::Mxfp4Bf16, Kind::Bf16F32, Kind::Bf16Bf16}) {
    for (const Shape& s : test_shapes()) {
      const bool big = s.rows * s.cols >= (1 << 22);
      GemvResult r;
      try {
        r = run_gemv(kind, s.rows, s.cols, big ? 100 : 0);
      } catch (const std::exception& e) {
        std::printf("ERROR %s %lldx%lld: %s\n", kind_name(kind), (long long)s.rows, (long long)s.cols, e.what());
        return 1;
      }
      const bool ok = r.max_rel < 1e-5;
      fails += !ok;
      if (big)
        std::printf("| %s | %lld x %lld | %.2e%s | %.2f | %.1f | %.1f%% | %.2f | %.1f |\n", kind_name(kind),
                    (long long)s.rows, (long long)s.cols, r.max_rel, ok ? "" : " FAIL", r.us, r.gbps, r.gbps / 48.0,
                    r.us_hot, r.gbps_hot);
      else
        std::printf("| %s | %lld x %lld | %.2e%s | - | - | - | - | - |\n", kind_name(kind), (long long)s.rows,
                    (long long)s.cols, r.max_rel, ok ? "" : " FAIL");
    }
  }
  std::printf("%s (%d failures)\n", fails ? "FAIL" : "PASS", fails);
  return fails ? 1 : 0;
}
