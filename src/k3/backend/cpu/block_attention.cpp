#include "k3/backend/cpu/block_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "k3/core/thread_pool.h"

namespace k3::cpu {

void block_attention(const float* q, const float* k, const float* v, int64_t n, int64_t block, int64_t heads,
                     int64_t head_dim, float scale, float* o) {
  const int64_t C = heads * head_dim, n_blocks = n / block;
  // One task per (block, head): independent, and each computed the same way on any thread.
  parallel_for(n_blocks * heads, n_blocks * heads * block * block * head_dim > 65536, [&](int64_t task) {
    const int64_t b = task / heads, m = task % heads, r0 = b * block, c0 = m * head_dim;
    std::vector<double> p(static_cast<size_t>(block));
    for (int64_t i = 0; i < block; ++i) {
      const float* qi = q + (r0 + i) * C + c0;
      double mx = -INFINITY;
      for (int64_t j = 0; j < block; ++j) {
        const float* kj = k + (r0 + j) * C + c0;
        double dot = 0;
        for (int64_t d = 0; d < head_dim; ++d) dot += static_cast<double>(qi[d]) * kj[d];
        p[static_cast<size_t>(j)] = dot * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      float* oi = o + (r0 + i) * C + c0;
      for (int64_t d = 0; d < head_dim; ++d) {
        double acc = 0;
        for (int64_t j = 0; j < block; ++j) acc += p[static_cast<size_t>(j)] * v[(r0 + j) * C + c0 + d];
        oi[d] = static_cast<float>(acc / sum);
      }
    }
  });
}

}  // namespace k3::cpu
