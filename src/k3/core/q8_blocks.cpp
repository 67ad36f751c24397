// q8 blocks on the host (q8_blocks.h).
#include "k3/core/q8_blocks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "k3/core/error.h"

namespace k3 {

float quantise_q8_block(const float* x, int n, int8_t* q) {
  float m = 0.f;
  bool finite = true;
  for (int i = 0; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    m = std::max(m, std::fabs(x[i]));
  }
  if (!finite) {
    std::fill(q, q + n, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float inv = m >= kQ8MinScaledMax ? 127.f / m : 0.f;
  for (int i = 0; i < n; ++i) {
    const float r = std::nearbyint(x[i] * inv);  // the default rounding mode: to nearest, ties to even
    q[i] = static_cast<int8_t>(std::clamp(r, -127.f, 127.f));
  }
  return m / 127.f;
}

void fake_quant_q8_row(float* x, int64_t n) {
  if (n < 0) throw Error("fake_quant_q8_row: negative width " + std::to_string(n));
  int8_t q[kQ8Block];
  for (int64_t b = 0; b < n; b += kQ8Block) {
    const int len = static_cast<int>(std::min<int64_t>(kQ8Block, n - b));
    const float d = quantise_q8_block(x + b, len, q);
    for (int i = 0; i < len; ++i) x[b + i] = static_cast<float>(q[i]) * d;
  }
}

}  // namespace k3
