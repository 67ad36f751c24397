// The one-token MXFP4 (HF layout) step -- 4 rows side by side over one pair of groups, as mxfp4_one_token_rows in
// src/k3/backend/cpu/weight_kernels_avx512bf16.cpp does it -- cut out with variants that drop or replace one part each,
// timed from L2, to see where a step's time goes on a box without hardware counters (docs/perf/cpu.md, session 34).
// Variants 1-3 compute wrong values on purpose (they only price a part); 4 and 5 are alternatives that were tried.
//   g++ -O2 -std=c++20 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vbmi -mavx512vnni -mfma \
//     scripts/perf/mxfp4_step_variants.cpp -o msv && ./msv 384 2048 && ./msv 2048 384
// Keep it in step with the kernel when that changes.
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>
#include <array>
#include <cmath>
static float kHalf[256];
inline __m128i tbl() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }
template <int V>
__attribute__((noinline)) void rows4(const uint8_t* data, const uint8_t* scales, int64_t R, int64_t pairs, const __m512i* xs, const __m512i* corr, const float* xsf, float* y) {
  const int64_t db = pairs * 32, sb = pairs * 2;
  const __m512i ctrl = _mm512_set_epi64(0x3C342C241C140C04LL, 0x3C342C241C140C04LL, 0x3C342C241C140C04LL, 0x3C342C241C140C04LL,
                                        0x3830282018100800LL, 0x3830282018100800LL, 0x3830282018100800LL, 0x3830282018100800LL);
  const __m512i table = _mm512_broadcast_i32x4(tbl());
  for (int64_t r = 0; r < R; r += 4) {
    __m512 acc[4];
    for (int i = 0; i < 4; ++i) acc[i] = _mm512_setzero_ps();
    __m512 S[4];
    for (int64_t p = 0; p < pairs; ++p) {
      const __m512 xsc = _mm512_loadu_ps(xsf + 16 * p);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const uint8_t* packed = data + (r + i) * db + 32 * p;
        const uint8_t* sc = scales + (r + i) * sb + 2 * p;
        __m512i w;
        if constexpr (V == 4) {  // nibble split decode (activations in lo/hi order)
          const __m512i b = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i*)packed));
          const __m512i sh = _mm512_srlv_epi16(b, _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL, 0, 0, 0, 0));
          w = _mm512_shuffle_epi8(table, _mm512_and_si512(sh, _mm512_set1_epi8(0x0F)));
        } else {
          const __m256i b = _mm256_loadu_si256((const __m256i*)packed);
          w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_broadcast_i64x4(b)), table);
        }
        __m512 wsc;
        if constexpr (V == 5 || V == 6) {
          if ((p & 7) == 0) {
            const __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)sc));
            __m512i v = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
            v = _mm512_mask_sllv_epi32(v, _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), _mm512_set1_epi32(0x00200000), e);
            v = _mm512_mask_mov_epi32(v, _mm512_cmpeq_epu32_mask(e, _mm512_set1_epi32(255)), _mm512_set1_epi32(0x7fc00000));
            S[i] = _mm512_castsi512_ps(v);
          }
          const int q = 2 * (p & 7);
          const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(q), _mm512_setr_epi32(0,0,0,0,1,1,1,1,0,0,0,0,1,1,1,1));
          wsc = _mm512_permutexvar_ps(idx, S[i]);
        } else if constexpr (V == 1) wsc = _mm512_set1_ps(0.5f);
        else wsc = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(kHalf[sc[0]]), _mm512_set1_ps(kHalf[sc[1]]));
        const __m512i dp = _mm512_dpbusd_epi32(corr[p], w, xs[p]);
        if constexpr (V == 2) acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), wsc, acc[i]);
        else if constexpr (V == 3) acc[i] = _mm512_castsi512_ps(_mm512_add_epi32(dp, _mm512_castps_si512(acc[i])));
        else acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), xsc), wsc, acc[i]);
      }
    }
    for (int i = 0; i < 4; ++i) y[r + i] = _mm512_reduce_add_ps(acc[i]);
  }
}
int main(int argc, char** argv) {
  for (int i = 0; i < 256; ++i) kHalf[i] = std::ldexp(0.5f, i - 127);
  const int64_t R = atoll(argv[1]), C = atoll(argv[2]), pairs = C / 64;
  std::mt19937 rng(1);
  std::vector<uint8_t> d(R * C / 2), s(R * pairs * 2);
  for (auto& b : d) b = rng();
  for (auto& b : s) b = 120 + rng() % 8;
  __m512i* xs = static_cast<__m512i*>(std::aligned_alloc(64, static_cast<size_t>(pairs) * 64));
  __m512i* corr = static_cast<__m512i*>(std::aligned_alloc(64, static_cast<size_t>(pairs) * 64));
  for (int64_t p = 0; p < pairs; ++p) xs[p] = _mm512_set1_epi32(rng());
  for (int64_t p = 0; p < pairs; ++p) corr[p] = _mm512_set1_epi32(rng() % 100);
  std::vector<float> xsf(16 * pairs, 0.01f), y(R);
  auto run = [&](auto f, const char* n) {
    double best = 1e9;
    const int reps = std::max<int64_t>(1, 100000000 / (R * C));
    for (int t = 0; t < 7; ++t) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) f(d.data(), s.data(), R, pairs, xs, corr, xsf.data(), y.data());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
    }
    std::printf("%-28s %lldx%lld: %.2f us %.1f GB/s  %.2f ns/row-pair\n", n, (long long)R, (long long)C, best * 1e6, (d.size() + s.size()) / best / 1e9, best * 1e9 / (R * pairs));
  };
  run(rows4<0>, "as is");
  run(rows4<1>, "const weight scale");
  run(rows4<2>, "no xsc mul");
  run(rows4<3>, "int add only");
  run(rows4<4>, "nibble-split decode");
  run(rows4<5>, "scales per 8 pairs + vpermps");
}
