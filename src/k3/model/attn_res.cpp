#include <cmath>

#include "k3/model/layers.h"

namespace k3 {

void attn_res_mix(const std::vector<const float*>& src, const AttnResWeights& w, int64_t n, int64_t H, float eps,
                  float* out) {
  const size_t m = src.size();
  std::vector<float> score(m);
  for (int64_t t = 0; t < n; ++t) {
    float mx = -INFINITY;
    for (size_t i = 0; i < m; ++i) {
      const float* v = src[i] + t * H;
      double ss = 0, dot = 0;
      for (int64_t d = 0; d < H; ++d) {
        ss += static_cast<double>(v[d]) * v[d];
        dot += static_cast<double>(v[d]) * w.w[static_cast<size_t>(d)];
      }
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(H)) + eps);
      score[i] = static_cast<float>(dot) * inv;
      mx = std::max(mx, score[i]);
    }
    float sum = 0;
    for (size_t i = 0; i < m; ++i) sum += (score[i] = std::exp(score[i] - mx));
    float* o = out + t * H;
    for (int64_t d = 0; d < H; ++d) o[d] = 0;
    for (size_t i = 0; i < m; ++i) {
      const float p = score[i] / sum;
      const float* v = src[i] + t * H;
      for (int64_t d = 0; d < H; ++d) o[d] += p * v[d];
    }
  }
}

}  // namespace k3
