// The order of the CPU int8 tiers' one-token K-quant products (weight_kernels_avx2int8_k.cpp; the avx512bf16 / amx
// tiers' weight_kernels_vnni_k.cpp gives its bits), written out as scalar integer and float steps: the order the CUDA
// one-token kernel (backend/cuda/quant_gemv_q8.cu) reproduces so that the GPU's default numbers for a K-quant GGUF are
// the CPU's bit for bit. If a tier's kernel changes that order, this fails here, in CI, before the GPU kernel silently
// stops matching it (its own test, CudaQuantKernels.Q8GemvGivesTheCpuInt8TiersBits, runs only on a GPU).
//
// Per 256-value block of x: q = round-half-even(x (127 / max|x|)), d = max|x| / 127, the q sums per 16 values. Per
// block of weights and AVX2 lane L (0..7), in integers: Q4_K / Q5_K -- for each 32-byte quant chunk p, scale 2p times
// the products of its low nibbles (values 64p + 4L..+3) and scale 2p + 1 times its high nibbles' (64p + 32 + 4L..),
// and the min term m[L] times the q sum of sub-block L; Q6_K -- for each half h and k = 0..3 the 6-bit quants of values
// 128h + 32k + 4L..+3 times scale 8h + 2k (+ 1 for L >= 4), minus 32 times scale-weighted q sums 2L and 2L + 1. Then in
// block order acc_L = fma(dw d, sum_L, acc_L) (Q4_K / Q5_K: then acc_L = fma(-(dmin d), min_L, acc_L)); the value is
// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"
#include "k3/core/dtype.h"
#include "kernel_test_util.h"
#include "quant_test_ref.h"

namespace {

using k3::WeightFormat;

struct Q8Blocks {
  std::vector<int8_t> q;     // [blocks][256]
  std::vector<int> sum16;    // [blocks][16]
  std::vector<float> d;      // [blocks]
};

Q8Blocks q8k(const std::vector<float>& x) {
  const size_t nb = x.size() / 256;
  Q8Blocks r{std::vector<int8_t>(nb * 256), std::vector<int>(nb * 16), std::vector<float>(nb)};
  for (size_t k = 0; k < nb; ++k) {
    float amax = 0.f;
    for (int i = 0; i < 256; ++i) amax = std::fmax(amax, std::fabs(x[k * 256 + i]));
    const float id = amax > 0.f ? 127.f / amax : 0.f;
    r.d[k] = amax / 127.f;
    for (int i = 0; i < 256; ++i) r.q[k * 256 + i] = static_cast<int8_t>(std::nearbyint(x[k * 256 + i] * id));
    for (int j = 0; j < 16; ++j)
      for (int i = 0; i < 16; ++i) r.sum16[k * 16 + j] += r.q[k * 256 + 16 * j + i];
  }
  return r;
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return k3::f16_to_f32(h);
}
int byte_of(uint32_t v, int j) { return static_cast<int>((v >> (8 * j)) & 0xff); }
// Four products of byte lanes: unsigned weights (< 128) by signed activations.
int dot4(uint32_t w, const int8_t* q) {
  int s = 0;
  for (int j = 0; j < 4; ++j) s += byte_of(w, j) * q[j];
  return s;
}

// One row of blocks, the lane order above.
float row_value(WeightFormat f, const uint8_t* row, int nb, const Q8Blocks& x) {
  const int bytes = k3::weight_layout(f).block_bytes;
  float acc[8] = {};
  for (int b = 0; b < nb; ++b) {
    const uint8_t* wb = row + b * bytes;
    const int8_t* q = x.q.data() + b * 256;
    const int* s16 = x.sum16.data() + b * 16;
    for (int L = 0; L < 8; ++L) {
      if (f == WeightFormat::Q6_K) {
        const auto* sc = reinterpret_cast<const int8_t*>(wb + 192);
        int sum = 0;
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 4; ++k) {
            const uint32_t src = u32_at(wb + 64 * h + 32 * (k & 1) + 4 * L), qh = u32_at(wb + 128 + 32 * h + 4 * L);
            const uint32_t w = ((k >= 2 ? src >> 4 : src) & 0x0f0f0f0fu) | (((qh >> (2 * k)) & 0x03030303u) << 4);
            sum += sc[8 * h + 2 * k + (L >= 4 ? 1 : 0)] * dot4(w, q + 128 * h + 32 * k + 4 * L);
          }
        sum -= 32 * (s16[2 * L] * sc[2 * L] + s16[2 * L + 1] * sc[2 * L + 1]);
        acc[L] = std::fma(f16_at(wb + 208) * x.d[b], static_cast<float>(sum), acc[L]);
        continue;
      }
      const bool five = f == WeightFormat::Q5_K;
      const uint8_t* s = wb + 4;  // the 12 bytes of 6-bit scales and mins
      auto scale = [&](int j) { return j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); };
      auto min = [&](int j) { return j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4); };
      const uint32_t qh = five ? u32_at(wb + 16 + 4 * L) : 0;
      int sum = 0;
      for (int p = 0; p < 4; ++p) {
        const uint32_t qs = u32_at(wb + (five ? 48 : 16) + 32 * p + 4 * L);
        uint32_t lo = qs & 0x0f0f0f0fu, hi = (qs >> 4) & 0x0f0f0f0fu;
        if (five) {
          lo |= ((qh >> (2 * p)) & 0x01010101u) << 4;
          hi |= ((qh >> (2 * p + 1)) & 0x01010101u) << 4;
        }
        sum += scale(2 * p) * dot4(lo, q + 64 * p + 4 * L) + scale(2 * p + 1) * dot4(hi, q + 64 * p + 32 + 4 * L);
      }
      const int mins = min(L) * (s16[2 * L] + s16[2 * L + 1]);
      acc[L] = std::fma(f16_at(wb) * x.d[b], static_cast<float>(sum), acc[L]);
      acc[L] = std::fma(-(f16_at(wb + 2) * x.d[b]), static_cast<float>(mins), acc[L]);
    }
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

class KquantInt8Lanes : public k3test::CpuTierTest {};

TEST_P(KquantInt8Lanes, OneTokenProductsFollowTheStatedLaneOrder) {
  if (k3::cpu::isa_is_exact(GetParam())) GTEST_SKIP() << "an exact tier: fp32 products, no int8 lanes";
  for (const WeightFormat f : {WeightFormat::Q4_K, WeightFormat::Q5_K, WeightFormat::Q6_K})
    for (const int64_t cols : {256, 2304, 4096}) {
      const int64_t rows = 13, nb = cols / 256;
      std::mt19937 rng(static_cast<uint32_t>(cols) + static_cast<uint32_t>(f));
      const std::vector<uint8_t> blocks = k3test::random_blocks(f, rows * nb, rng, 8, 20);
      std::normal_distribution<float> nd(0.f, 2.f);
      std::vector<float> x(static_cast<size_t>(cols));
      for (auto& v : x) v = nd(rng);
      if (cols > 256) std::fill(x.begin(), x.begin() + 256, 0.f);  // a zero block: d = 0
      const k3::WeightMatrix W{f, blocks.data(), nullptr, rows, cols, k3::kHostDevice};
      std::vector<float> got(static_cast<size_t>(rows));
      k3::cpu::matmul(W, x.data(), 1, got.data());
      const Q8Blocks q = q8k(x);
      int differ = 0;
      for (int64_t r = 0; r < rows; ++r) {
        const float want = row_value(f, blocks.data() + r * nb * k3::weight_layout(f).block_bytes, static_cast<int>(nb), q);
        differ += std::memcmp(&want, &got[static_cast<size_t>(r)], 4) != 0;
      }
      EXPECT_EQ(differ, 0) << k3::weight_format_name(f) << " cols " << cols;
      EXPECT_NE(got[0], 0.f);
    }
}

INSTANTIATE_TEST_SUITE_P(Tiers, KquantInt8Lanes, k3test::kAllCpuTiers, k3test::cpu_tier_name);

}  // namespace
