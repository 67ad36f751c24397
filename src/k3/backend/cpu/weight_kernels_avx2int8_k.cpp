// The avx2int8 tier's Q4_K, Q5_K and Q6_K paths on per-block int8 activations (llama.cpp's Q8_K layout, which its AVX2
// vec_dot_q4_K_q8_K uses): the activations of each 256-value block as 256 int8 q = round(x / d) with ONE
// fp32 scale d = max|x| / 127 per block, and the sums of q per 16 values. A Q4_K block's 4-bit quants are
// unsigned, so `maddubs(w, q)` multiplies them as they are, the 6-bit sub-scales multiply the int16 pair sums
// in integers (`madd`), and the whole block stays in int32 lanes: two int -> float conversions and two fmas
// per block and token (products, then mins), instead of the quad path's convert, multiply and fma per 32 values (the quads keep a scale
// per 4 values: more accurate, ~2.5x the instructions; docs/perf/cpu.md "Session 15"). The sub-mins meet
// the per-16 q sums in one `madd` per block (8 lanes, one per sub-block): value = d sc q - dmin m, so
//   y = sum_b [ d_w d_x sum_j sc_j sum_{i in j} w_i q_i  -  dmin_w d_x sum_j m_j sum_{i in j} q_i ].
// Integer ranges: a maddubs pair <= 2 x 15 x 127 = 3810 (no saturation); times sc <= 63 and paired by madd
// <= 480k per int32 lane; 4 sub-block pairs per block: < 2^22. Batch invariance: every (row, token) runs the
// same operations in the same order in every tile size (T = 1 is the dot).
#include <immintrin.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/backend/cpu/weight_kernels_avx2int8.h"
#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/backend/cpu/weight_simd.h"
#include "k3/quant/block_decode.h"

namespace k3::cpu {

namespace {

constexpr int64_t kQK = 256;
// One converted block: q int8[256], then the q sums per 16 values (int16[16]), then d (fp32), padded to 32 B.
constexpr int64_t kSumsAt = 256, kDAt = 288, kBlockBytes = 320;
constexpr int64_t block_stride(int64_t cols) { return cols / kQK * kBlockBytes; }

// n tokens of cols (a multiple of 256) values. d = max|x| / 127 (0 for an all-zero block, whose q are 0);
// q = round-half-even(x * (127 / max|x|)) (cvtps under the default rounding mode, as nearbyint). A NaN or inf
// in the block makes d NaN, and so the outputs.
void q8k_block(const float* v, uint8_t* o) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 m = _mm256_setzero_ps(), poison = _mm256_setzero_ps();
  for (int k = 0; k < 32; ++k) {
    const __m256 x = _mm256_loadu_ps(v + 8 * k);
    m = _mm256_max_ps(m, _mm256_and_ps(x, abs_mask));
    poison = _mm256_add_ps(poison, _mm256_mul_ps(x, _mm256_setzero_ps()));  // NaN where x is NaN or inf
  }
  float lanes[8], bad[8];
  _mm256_storeu_ps(lanes, m);
  _mm256_storeu_ps(bad, poison);
  float amax = 0.f;
  bool finite = true;
  for (int i = 0; i < 8; ++i) {
    amax = std::max(amax, lanes[i]);
    finite = finite && !std::isnan(bad[i]);
  }
  const float d = finite ? amax / 127.f : NAN, id = amax > 0.f && finite ? 127.f / amax : 0.f;
  const __m256 idv = _mm256_set1_ps(id);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undo the packs' lane interleave
  for (int g = 0; g < 8; ++g) {
    __m256i i32[4];
    for (int k = 0; k < 4; ++k) i32[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 32 * g + 8 * k), idv));
    const __m256i i16 = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32 * g), _mm256_permutevar8x32_epi32(i16, order));
  }
  int16_t sums[16];
  const auto* q = reinterpret_cast<const int8_t*>(o);
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int i = 0; i < 16; ++i) s += q[16 * g + i];
    sums[g] = static_cast<int16_t>(s);
  }
  std::memcpy(o + kSumsAt, sums, sizeof sums);
  std::memcpy(o + kDAt, &d, sizeof d);
}

void q8k_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < cols / kQK; ++b) q8k_block(x + t * cols + b * kQK, out + t * block_stride(cols) + b * kBlockBytes);
}

// An f16 scale (F16C: exact, inline; quant::f16_at's out-of-line conversion was 6% of this kernel).
inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// A Q4_K block's 12 scale bytes as 8 unsigned bytes of 6-bit sub-scales (bytes 0..7) and 8 of 6-bit sub-mins
// (bytes 8..15), with word arithmetic instead of a per-sub-block decode (which was a third of this kernel).
// The layout (docs/quantization.md): for j < 4 scale j = s[j] & 63, min j = s[j + 4] & 63; for j >= 4 the low
// four bits come from s[j + 4] (scale: low nibble, min: high nibble) and the top two from the top bits of
// s[j - 4] (scale) or s[j] (min). As 32-bit words u0..u2 = s[0..3], s[4..7], s[8..11], byte-parallel.
inline __m128i k4_scales_mins(const uint8_t* s) {
  uint32_t u[3], o[4];
  std::memcpy(u, s, sizeof u);
  constexpr uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
  o[0] = u[0] & low6;
  o[1] = (u[2] & low4) | (((u[0] >> 6) & top2) << 4);
  o[2] = u[1] & low6;
  o[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4);
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(o));
}

// One Q4_K row x T tokens. Per 64 weights (one 32-byte load: sub-blocks 2p and 2p + 1) every token's int32
// lanes take its products, so the registers hold two weight vectors and T block sums at a time. The sub-mins
// meet the activations' per-16 sums in one madd per block and token (8 lanes: m_j x the sum over sub-block
// j), in the same accumulator as the products at their own scale.
//
// Q5_K (kFive) is the same block with a fifth bit per weight: 176 bytes {d, dmin, scales[12], qh[32], qs[128]}, the
// bit of value 64p + l at bit 2p of qh[l], of 64p + 32 + l at bit 2p + 1; the quants are 0..31, so a maddubs pair
// <= 2 x 31 x 127 = 7874, times sc <= 63 and paired <= 992k, 4 per lane: < 2^22, as exact as Q4_K's.
template <int T, bool kFive = false>
__attribute__((always_inline)) inline void q4k_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, int64_t ldq,
                                                    float* y, int64_t ldy) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  // Each min twice (one per 16-value half of its sub-block), as int16 lanes for madd with the per-16 sums.
  const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  for (int64_t b = 0; b < blocks; ++b) {
    constexpr int64_t kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
    const uint8_t* wb = row + b * kBytes;
    const float dw = f16(wb), dmin = f16(wb + 2);
    [[maybe_unused]] const __m256i qh = kFive ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 16)) : __m256i{};
    const __m128i sm = k4_scales_mins(wb + 4);
    const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));  // the 8 scales as int16, both halves
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup_mins));
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + kQs + 32 * p));
      __m256i lo = _mm256_and_si256(qw, low4);                        // values 64p .. 64p + 31
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qw, 4), low4);  // 64p + 32 .. 64p + 63
      if constexpr (kFive) {  // bits 2p and 2p + 1 of each qh byte to bit 4 (a byte's own bits: no carry across)
        const __m256i one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
      }
      // Scales 2p and 2p + 1 broadcast to every int16 lane (bytes 4p, 4p + 1 and 4p + 2, 4p + 3 of sc16).
      const __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>(((4 * p + 1) << 8) | (4 * p))));
      const __m256i s1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>(((4 * p + 3) << 8) | (4 * p + 2))));
      for (int t = 0; t < T; ++t) {
        const uint8_t* xb = xq + t * ldq + b * kBlockBytes + 64 * p;
        const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb));
        const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32));
        const __m256i p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, q0), s0);
        const __m256i p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, q1), s1);
        sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(p0, p1));
      }
    }
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = xq + t * ldq + b * kBlockBytes;
      float dx;
      std::memcpy(&dx, xb + kDAt, sizeof dx);
      // |m_j x sum over sub-block j| <= 63 x 32 x 127: exact in int32 and in fp32.
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kSumsAt));
      const __m256i mq = _mm256_madd_epi16(sums, mins16);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(mq), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = simd::hsum(acc[t]);
}

// One Q6_K row x T tokens: per half (128 values) the 6-bit quants (0..63, stored value q - 32) assembled from
// ql / qh as unsigned bytes for maddubs, the int8 scale of each 16 values applied in madd; the -32 offset as
// -32 sum_g scale_g (sum of q in group g) from the q sums, subtracted in the int32 lanes. Ranges: a maddubs pair
// <= 2 x 63 x 127 = 16002; times |scale| <= 128 and paired: < 4.1M per lane, 8 per block: < 2^25 (the int ->
// float conversion of a lane beyond 2^24 rounds, deterministically: within the fp32 bound).
template <int T>
__attribute__((always_inline)) inline void q6k_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, int64_t ldq,
                                                    float* y, int64_t ldy) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x03);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = row + b * 210;
    const float dw = f16(wb + 208);
    const auto* scales = reinterpret_cast<const int8_t*>(wb + 192);
    __m256i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 128 + 32 * h));
      const __m256i hb[4] = {_mm256_and_si256(qh, two), _mm256_and_si256(_mm256_srli_epi16(qh, 2), two),
                             _mm256_and_si256(_mm256_srli_epi16(qh, 4), two), _mm256_and_si256(_mm256_srli_epi16(qh, 6), two)};
      const __m256i lb[4] = {_mm256_and_si256(ql0, low4), _mm256_and_si256(ql1, low4),
                             _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4)};
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {  // values 128h + 32k .. + 31: groups 8h + 2k, 8h + 2k + 1
        const __m256i w = _mm256_or_si256(lb[k], _mm256_slli_epi16(hb[k], 4));
        const int g = 8 * h + 2 * k;
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(scales[g + 1]), _mm_set1_epi16(scales[g]));
        for (int t = 0; t < T; ++t) {
          const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + t * ldq + b * kBlockBytes + 32 * (g / 2)));
          sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), sc));
        }
      }
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = xq + t * ldq + b * kBlockBytes;
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kSumsAt));
      const __m256i off = _mm256_madd_epi16(sums, sc16);  // sum_g scale_g sum_g, in pairs of groups
      float dx;
      std::memcpy(&dx, xb + kDAt, sizeof dx);
      const __m256i tot = _mm256_sub_epi32(sumi[t], _mm256_slli_epi32(off, 5));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(tot), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = simd::hsum(acc[t]);
}

// Row r of a Q4_K / Q5_K / Q6_K matrix for T tokens (avx2int8_rows' K).
template <WeightFormat F>
struct KRows {
  template <int T>
  static void row(const WeightMatrix& W, int64_t r, const uint8_t* xq, int64_t ldq, float* y, int64_t ldy) {
    if constexpr (F == WeightFormat::Q4_K)
      q4k_tile<T>(W.row_data(r), W.cols / kQK, xq, ldq, y, ldy);
    else if constexpr (F == WeightFormat::Q5_K)
      q4k_tile<T, true>(W.row_data(r), W.cols / kQK, xq, ldq, y, ldy);
    else
      q6k_tile<T>(W.row_data(r), W.cols / kQK, xq, ldq, y, ldy);
  }
};

// 4 tokens: 4 block sums + 4 accumulators + the decoded weight vectors and temporaries in 16 ymm.
constexpr int kT = 4;

template <WeightFormat F>
using KPath = Avx2Int8Path<KRows<F>, kT, block_stride, q8k_tokens>;

}  // namespace

const RowKernels* avx2int8_k_row_kernels(WeightFormat f) {
  static const RowKernels q4 = act_path::kernels<KPath<WeightFormat::Q4_K>>(*avx2_quant_row_kernels(WeightFormat::Q4_K));
  static const RowKernels q5 = act_path::kernels<KPath<WeightFormat::Q5_K>>(*avx2_quant_row_kernels(WeightFormat::Q5_K));
  static const RowKernels q6 = act_path::kernels<KPath<WeightFormat::Q6_K>>(*avx2_quant_row_kernels(WeightFormat::Q6_K));
  return f == WeightFormat::Q4_K ? &q4 : f == WeightFormat::Q5_K ? &q5 : f == WeightFormat::Q6_K ? &q6 : nullptr;
}

}  // namespace k3::cpu
