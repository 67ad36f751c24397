// The AVX2 form of the MXFP4 row-block product (mxfp4_rowblocks_forms.h): for CPUs without AVX-512 (the avx2int8 tier's
// machines), which otherwise run MXFP4 experts one row and one pair of groups at a time at ~1 instruction a weight byte
// (weight_kernels_avx2int8.cpp; docs/perf/cpu.md "Session 17": compute-bound at ~8 GB/s a Zen 3 core).
//
// A quad of the copy (32 bytes: byte s = row s / 4 in its low nibble, row s / 4 + 8 in its high one, column s % 4) is two
// vpshufb lookups of code + 12 (unsigned, 0..24) after a shift and two masks; vpmaddubsw against the token's 4 activation
// bytes broadcast (signed) sums two columns into int16 (<= 2 x 24 x 127 = 6096: no saturation) and vpmaddwd by 1 the other
// two into the int32 lane of the row: 8 rows a vector, ~13 instructions a quad (16 rows x 4 columns) where the avx2int8
// tier spends ~30 on 64 weights of one row. The int32 dots start at the block's -12 x sum(q) and are exact, then the fp32
// steps of the avx512bf16 form in its order (its half_scales, one fma a block into acc[sub-block % 2], acc0 + acc1): the
// same bits.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "k3/backend/cpu/mxfp4_rowblocks.h"
#include "k3/backend/cpu/mxfp4_rowblocks_forms.h"
#include "k3/backend/cpu/weight_simd.h"     // e2m1x2_plus12_table
#include "k3/backend/cpu/weight_simd512.h"  // kHalfE8m0 (a plain table)
#include "k3/core/q8_blocks.h"

namespace k3::cpu::rowblocks_detail {

namespace {

constexpr int64_t kG = 32;

// 0.5 x 2^(s - 127) for 8 rows' scales: (s - 1) << 23 as float bits for s in 2..254, the table otherwise (the exact
// denormals of s = 0, 1 and NaN for 255) -- the avx512bf16 form's half_scales, 8 lanes at a time.
__attribute__((always_inline)) inline __m256 half_scales8(const uint8_t* s8) {
  const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s8)));
  const __m256i odd = _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(2), s), _mm256_cmpeq_epi32(s, _mm256_set1_epi32(255)));
  __m256 v = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_sub_epi32(s, _mm256_set1_epi32(1)), 23));
  if (const int m = _mm256_movemask_ps(_mm256_castsi256_ps(odd))) {
    alignas(32) float t[8];
    _mm256_store_ps(t, v);
    for (int r = 0; r < 8; ++r)
      if (m >> r & 1) t[r] = simd512::kHalfE8m0[s8[r]];
    v = _mm256_load_ps(t);
  }
  return v;
}

// One block of 32 values: q = nearest-even of x x (127 / m) (vcvtps2dq, IEEE division), d = m / 127, start = -12 sum(q);
// a non-finite value sends the block to the scalar rule.
void quantise32(const float* x, int8_t* q, float* d, int32_t* start) {
  __m256 v[4], m = _mm256_setzero_ps();
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(__builtin_inff());
  int bad = 0;
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    const __m256 a = _mm256_and_ps(v[k], abs_mask);
    bad |= _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), _mm256_cmp_ps(a, inf, _CMP_EQ_OQ)));
    m = _mm256_max_ps(m, a);
  }
  if (bad) return quantise_block_scalar(x, 32, q, d, start);
  m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
  m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
  m = _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));
  const __m256 c127 = _mm256_set1_ps(127.f);
  const __m256 inv = _mm256_and_ps(_mm256_div_ps(c127, m), _mm256_cmp_ps(m, _mm256_set1_ps(kQ8MinScaledMax), _CMP_GE_OQ));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i qi[4], sum = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    qi[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[k], inv)), lo), hi);
    sum = _mm256_add_epi32(sum, qi[k]);
  }
  // packs work per 128-bit lane: the dwords of (q0 q1 | q2 q3) come out as 0 2 1 3 pieces of 4 values
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
  *start = -12 * _mm_cvtsi128_si32(s4);
  *d = _mm_cvtss_f32(_mm_div_ss(_mm256_castps256_ps128(m), _mm_set_ss(127.f)));
}

// Rows of blocks [b0, b1) against T tokens, as the avx512bf16 form's rowblocks_kernel: per block of S values a token's
// int32 dots of rows 0-7 and 8-15 (two chains each where the block has several quads), then one fma a half into
// acc[t][sub-block % 2][half].
template <int S, int T>
void rows_kernel(const uint8_t* copy, int64_t cols, const Mxfp4GroupActs* a, int64_t b0, int64_t b1, float* const* y) {
  constexpr int kSubs = 32 / S, kQuads = S / 4;
  const int64_t groups = cols / kG, ahead = prefetch_ahead();
  const __m256i lut = _mm256_broadcastsi128_si256(simd::e2m1x2_plus12_table()), nib = _mm256_set1_epi8(0x0f),
                ones = _mm256_set1_epi16(1);
  const uint8_t* blk = copy + b0 * groups * kMxfp4RowBlockGroupBytes;
  for (int64_t b = b0; b < b1; ++b) {
    __m256 acc[T][2][2];
    for (int t = 0; t < T; ++t)
      for (int s = 0; s < 2; ++s) acc[t][s][0] = acc[t][s][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g, blk += kMxfp4RowBlockGroupBytes) {
      if (ahead > 0)
        for (int l = 0; l < 5; ++l) _mm_prefetch(reinterpret_cast<const char*>(blk + ahead + 64 * l), _MM_HINT_T0);
      const __m256 sc_lo = half_scales8(blk + 256), sc_hi = half_scales8(blk + 264);
#pragma GCC unroll 8
      for (int sb = 0; sb < kSubs; ++sb) {
        __m256i dot[T][2][2];  // [token][chain][rows half]
        for (int t = 0; t < T; ++t) {
          dot[t][0][0] = dot[t][0][1] = _mm256_set1_epi32(a[t].start[g * kSubs + sb]);
          dot[t][1][0] = dot[t][1][1] = _mm256_setzero_si256();
        }
#pragma GCC unroll 8
        for (int k = 0; k < kQuads; ++k) {
          const int qd = sb * kQuads + k;
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * qd));
          const __m256i w_lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(packed, nib));
          const __m256i w_hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(packed, 4), nib));
          for (int t = 0; t < T; ++t) {
            int32_t quad;
            std::memcpy(&quad, a[t].q + g * kG + 4 * qd, 4);
            const __m256i xq = _mm256_set1_epi32(quad);
            __m256i* d = dot[t][k % 2];
            d[0] = _mm256_add_epi32(d[0], _mm256_madd_epi16(_mm256_maddubs_epi16(w_lo, xq), ones));
            d[1] = _mm256_add_epi32(d[1], _mm256_madd_epi16(_mm256_maddubs_epi16(w_hi, xq), ones));
          }
        }
        for (int t = 0; t < T; ++t) {
          const __m256 ds = _mm256_set1_ps(a[t].d[g * kSubs + sb]);
          for (int h = 0; h < 2; ++h) {
            const __m256i dt = kQuads > 1 ? _mm256_add_epi32(dot[t][0][h], dot[t][1][h]) : dot[t][0][h];
            acc[t][sb % 2][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dt), _mm256_mul_ps(h ? sc_hi : sc_lo, ds), acc[t][sb % 2][h]);
          }
        }
      }
    }
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h) _mm256_storeu_ps(y[t] + 16 * (b - b0) + 8 * h, _mm256_add_ps(acc[t][0][h], acc[t][1][h]));
  }
}

// Tokens in tiles of up to kTileTokens: 4 measured best at prefill (pp256 on 2 threads, session 66, docs/perf/cpu.md:
// tiles of 2 / 4 / 8 82 / 94 / 88 tok/s, means of 2-4 runs; some accumulators leave the 16 ymm registers at 4, yet the weights are decoded
// half as often as at 2). One token (decode) is the T = 1 kernel whatever this is.
constexpr int kTileTokens = 4;
template <int S, size_t... T>
constexpr auto token_tiles(std::index_sequence<T...>) {
  return std::array<RowBlocksKernel, sizeof...(T)>{rows_kernel<S, static_cast<int>(T) + 1>...};
}
template <int S>
void rows_tokens(const uint8_t* copy, int64_t cols, const uint8_t* act, int64_t stride, int64_t n, int64_t b0, int64_t b1,
                 float* y, int64_t ldy) {
  static constexpr auto tiles = token_tiles<S>(std::make_index_sequence<kTileTokens>());
  run_token_tiles(tiles, copy, cols, act, stride, n, b0, b1, y, ldy);
}

}  // namespace

void avx2_quantise(const float* x, int64_t n, int64_t cols, int S, int64_t stride, uint8_t* out) {
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    uint8_t* o = out + t * stride;
    auto* q = reinterpret_cast<int8_t*>(o);
    auto* d = reinterpret_cast<float*>(o + cols);
    auto* start = reinterpret_cast<int32_t*>(o + cols + cols / S * 4);
    for (int64_t c = 0; c < cols; c += S) {
      if (S == 32)
        quantise32(xt + c, q + c, d + c / S, start + c / S);
      else
        quantise_block_scalar(xt + c, S, q + c, d + c / S, start + c / S);
    }
  }
}

void avx2_rows(int S, const uint8_t* copy, int64_t cols, const uint8_t* act, int64_t stride, int64_t n, int64_t b0,
               int64_t b1, float* y, int64_t ldy) {
  switch (S) {
    case 4: return rows_tokens<4>(copy, cols, act, stride, n, b0, b1, y, ldy);
    case 8: return rows_tokens<8>(copy, cols, act, stride, n, b0, b1, y, ldy);
    case 16: return rows_tokens<16>(copy, cols, act, stride, n, b0, b1, y, ldy);
    default: return rows_tokens<32>(copy, cols, act, stride, n, b0, b1, y, ldy);
  }
}

}  // namespace k3::cpu::rowblocks_detail
