// tree512 (src/k3/backend/cpu/reduce_tree512.h): the avx512bf16 tier's horizontal sums. reduce16's lane k
// must have the bits of reduce1(v[k]), and both those of GCC's _mm512_reduce_add_ps (the reduction the tier
// used before, so outputs did not change), on vectors whose lanes span 2^-24 .. 2^24 with both signs, where
// any other summation order rounds differently (checked: a left-to-right sum differs on most inputs).
// reduce_store: every (row, token) output lands at y[t * ldy + r] and nothing else is written.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "k3/backend/cpu/cpu_features.h"
#include "k3/backend/cpu/weight_simd512.h"

K3_AVX512BF16_BEGIN
// GCC 12's _mm512_reduce_add_ps (the reference below) warns of its extract's uninitialised pass-through.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include "k3/backend/cpu/reduce_tree512.h"

namespace {

struct TreeResults {
  float one[16], gcc[16], batched[16], sequential[16];
};

TreeResults sum_four_ways(const float (&lanes)[16][16]) {
  TreeResults out{};
  __m512 v[16];
  for (int k = 0; k < 16; ++k) {
    v[k] = _mm512_loadu_ps(lanes[k]);
    out.one[k] = k3::cpu::tree512::reduce1(v[k]);
    out.gcc[k] = _mm512_reduce_add_ps(v[k]);
    float s = 0.f;
    for (int i = 0; i < 16; ++i) s += lanes[k][i];
    out.sequential[k] = s;
  }
  _mm512_storeu_ps(out.batched, k3::cpu::tree512::reduce16(v));
  return out;
}

template <int T>
void store_tile(const float* fin_vals, int nr, float* y, int64_t ldy) {  // plain pointers: no library code in the region
  __m512 fin[16 * T];
  for (int i = 0; i < nr * T; ++i) fin[i] = _mm512_loadu_ps(fin_vals + static_cast<size_t>(i) * 16);
  k3::cpu::tree512::reduce_store<T>(fin, nr, y, ldy);
}

float reduce_one(const float* lanes) { return k3::cpu::tree512::reduce1(_mm512_loadu_ps(lanes)); }

}  // namespace
#pragma GCC diagnostic pop
K3_AVX512BF16_END

namespace {

bool have_avx512() {
  const auto f = k3::cpu::detect_cpu_features();
  return f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
}

void fill_wide(float (&lanes)[16][16], std::mt19937& rng) {
  std::uniform_real_distribution<double> e(-24, 24);
  for (auto& row : lanes)
    for (float& x : row) x = static_cast<float>((rng() & 1 ? 1 : -1) * std::exp2(e(rng)) * (1 + (rng() & 0xffff) / 65536.0));
}

TEST(ReduceTree512, BatchedEqualsOneAtATimeAndGcc) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(7);
  int order_matters = 0;
  for (int it = 0; it < 2000; ++it) {
    float lanes[16][16];
    fill_wide(lanes, rng);
    const TreeResults r = sum_four_ways(lanes);
    for (int k = 0; k < 16; ++k) {
      ASSERT_EQ(std::bit_cast<uint32_t>(r.one[k]), std::bit_cast<uint32_t>(r.gcc[k])) << "it " << it << " k " << k;
      ASSERT_EQ(std::bit_cast<uint32_t>(r.batched[k]), std::bit_cast<uint32_t>(r.one[k])) << "it " << it << " k " << k;
      order_matters += r.sequential[k] != r.one[k];
    }
  }
  // The inputs can tell trees apart: a left-to-right sum differs from the tree on most of the 32000 sums.
  EXPECT_GT(order_matters, 16000);
}

template <int T>
void check_store(int nr, int64_t ldy, std::mt19937& rng) {
  std::vector<float> fin(static_cast<size_t>(nr) * T * 16);
  std::uniform_real_distribution<float> u(-4.f, 4.f);
  for (float& x : fin) x = u(rng);
  const float sentinel = -12345.f;
  std::vector<float> y(static_cast<size_t>(ldy) * T + 16, sentinel);
  store_tile<T>(fin.data(), nr, y.data(), ldy);
  std::vector<bool> written(y.size(), false);
  for (int r = 0; r < nr; ++r)
    for (int t = 0; t < T; ++t) {
      const size_t at = static_cast<size_t>(t * ldy + r);
      const float want = reduce_one(&fin[static_cast<size_t>(r * T + t) * 16]);
      ASSERT_EQ(std::bit_cast<uint32_t>(y[at]), std::bit_cast<uint32_t>(want)) << "T " << T << " nr " << nr << " r " << r << " t " << t;
      written[at] = true;
    }
  for (size_t i = 0; i < y.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(y[i], sentinel) << "T " << T << " nr " << nr << ": wrote y[" << i << "]";
    }
  }
}

TEST(ReduceTree512, StoreWritesEachOutputOnce) {
  if (!have_avx512()) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(11);
  for (int nr = 1; nr <= 16; ++nr) check_store<1>(nr, 1, rng);
  for (int nr = 1; nr <= 4; ++nr)
    for (int64_t ldy : {4, 5, 37}) {
      check_store<2>(nr, ldy, rng);
      check_store<3>(nr, ldy, rng);
      check_store<4>(nr, ldy, rng);
      check_store<7>(nr, ldy, rng);
      check_store<12>(nr, ldy, rng);
    }
}

}  // namespace
