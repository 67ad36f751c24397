// The KDA cores' contiguous-row helpers (kda.cpp's chunked form, kda_token.cpp's reference step): y += a x and y *= a
// over n floats, vectorised by the compiler, which fuses y += a * x into one fma -- the bits both files' loops have
// always had, so they share one definition.
#pragma once

namespace k3::cpu::kda_vec {

inline void axpy(int n, float a, const float* __restrict x, float* __restrict y) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

inline void scale(int n, float a, float* __restrict y) {
#pragma omp simd
  for (int i = 0; i < n; ++i) y[i] *= a;
}

}  // namespace k3::cpu::kda_vec
