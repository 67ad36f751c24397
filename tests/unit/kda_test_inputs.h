// Shared by the KDA recurrence tests (test_kda.cpp, test_kda_state_dtype.cpp): one sequence's inputs and
// the host helpers that make them realistic (L2-normed q / k, gates through softplus / sigmoid).
#pragma once
#include <cmath>
#include <cstddef>
#include <vector>

namespace k3test {

using Vec = std::vector<float>;

struct KdaInputs {
  int T, H, D;
  Vec q, k, v, g, beta, state;
};

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// Each row of D values scaled to norm `extra` (x / sqrt(sum x^2 + 1e-6) * extra).
inline void l2norm_rows(Vec& x, int D, float extra) {
  for (std::size_t r = 0; r < x.size() / D; ++r) {
    double s = 0;
    for (int d = 0; d < D; ++d) s += double(x[r * D + d]) * x[r * D + d];
    const float inv = float(1.0 / std::sqrt(s + 1e-6)) * extra;
    for (int d = 0; d < D; ++d) x[r * D + d] *= inv;
  }
}

}  // namespace k3test
