// Horizontal sums of zmm accumulators for the avx512bf16 tier's tiles: one vector at a time (`reduce1`),
// or 16 at once (`reduce16`), both in one fixed tree: lanes i + i+8, then + i+4, + i+2, + i+1 (the tree
// GCC's _mm512_reduce_add_ps uses). The same tree is what keeps a batch's outputs bit-equal to one token's
// (the tier's batch-invariance contract): a tile that sums 16 accumulators at once gives each the bits
// that `reduce1` gives it alone.
// Why 16 at once: a lone reduction is ~9 shuffles and adds for one float; 16 transposed together are 45
// (3 per output). A tile's dot over a short row (a Kimi-Linear expert's 384 columns: 6 pairs of MXFP4
// groups, 4 instructions each, per token) spent a quarter of its instructions on reductions.
// Include only inside a K3_AVX512BF16_BEGIN/END region (internal linkage: each file's copy is its own).
#pragma once
#include <immintrin.h>

#include <cstdint>

namespace k3::cpu::tree512 {

static inline __attribute__((always_inline)) float reduce1(__m512 v) {
  // (the upper half by a shuffle: GCC 12's extract intrinsics warn of an uninitialised pass-through operand)
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm512_castps512_ps256(_mm512_shuffle_f32x4(v, v, 0xEE)));  // i + i+8
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));         // i + i+4
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));                                         // i + i+2
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));                                       // i + i+1
}

// out lane k = reduce1(v[k]) for k < 16, bit for bit. The levels pair lanes across two vectors at a time
// (f32x4 shuffles, then in-lane shuffles), which leaves lane 4q + j holding the sum of input slot 4j + q;
// the inputs are read in that transposed order so that the lanes come out in v's order.
static inline __attribute__((always_inline)) __m512 reduce16(const __m512* v) {
  __m512 c[8], e[4], g[2];
  for (int k = 0; k < 8; ++k) {  // slots 2k, 2k+1: lanes i + i+8 of each, side by side
    const int s0 = 2 * k, s1 = 2 * k + 1;
    const __m512 a = v[(s0 & 3) * 4 + (s0 >> 2)], b = v[(s1 & 3) * 4 + (s1 >> 2)];
    c[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int m = 0; m < 4; ++m)  // i + i+4: quarter q of e[m] is slot 4m + q
    e[m] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * m], c[2 * m + 1], 0xDD));
  for (int n = 0; n < 2; ++n)  // i + i+2, within each quarter
    g[n] = _mm512_add_ps(_mm512_shuffle_ps(e[2 * n], e[2 * n + 1], 0x44), _mm512_shuffle_ps(e[2 * n], e[2 * n + 1], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(g[0], g[1], 0x88), _mm512_shuffle_ps(g[0], g[1], 0xDD));  // i + i+1
}

// The outputs of a tile of rows x T tokens: y[t * ldy + r] = reduce1(fin[r * T + t]) for r < nr, t < T,
// with nr <= 4 (T > 1) or nr <= 16 (T == 1), 16 sums per reduce16 (4 tokens x 4 rows, or 16 rows of one
// token), unused slots zero.
template <int T>
static inline __attribute__((always_inline)) void reduce_store(const __m512* fin, int nr, float* y, int64_t ldy) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 v[16];
  if constexpr (T == 1) {
    for (int k = 0; k < 16; ++k) v[k] = k < nr ? fin[k] : zero;
    _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << nr) - 1u), reduce16(v));
    return;
  }
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __mmask16 rows = static_cast<__mmask16>((1u << nr) - 1u);
  for (int t0 = 0; t0 < T; t0 += 4) {
    for (int k = 0; k < 16; ++k) {  // slot k: token t0 + k / 4, row k % 4
      const int t = t0 + (k >> 2), r = k & 3;
      v[k] = r < nr && t < T ? fin[r * T + t] : zero;
    }
    const __m512 s = reduce16(v);
    for (int tt = 0; tt < 4 && t0 + tt < T; ++tt)  // lanes 4 tt .. 4 tt + nr - 1 to token t0 + tt's outputs
      _mm512_mask_storeu_ps(y + (t0 + tt) * ldy, rows,
                            _mm512_permutexvar_ps(_mm512_add_epi32(iota, _mm512_set1_epi32(4 * tt)), s));
  }
}

}  // namespace k3::cpu::tree512
