// The avx512bf16 tier's Q4_K, Q5_K and Q6_K kernels on per-block int8 activations (llama.cpp's Q8_K layout): the
// avx2int8 tier's per-block path (weight_kernels_avx2int8_k.cpp) on 512-bit registers, with AVX512_VNNI's vpdpwssd
// applying the weights' sub-scales. Why: on a 2-core Zen 4 the quad path (weight_kernels_quant_vnni.cpp: one activation
// scale per 4 values) is bound by its per-token arithmetic -- an int8 dot, a conversion, the quads' scale multiply and an
// fma per 64 values and token -- so a second token cost the dense products 1.7-1.9x the first (docs/perf/cpu.md,
// sessions 34-35). Here a token costs per 64 values one maddubs and one vpdpwssd, and per 256 two conversions and two
// fmas: the block stays in int32 lanes, as in llama.cpp's vec_dot_q4_K_q8_K.
//
// Same numbers as avx2int8, bit for bit. The activations are quantised by the same arithmetic (d = max|x| / 127, q =
// round-half-even(x 127 / max|x|), saturated to int8; the per-16 sums of q), only stored in the order the 512-bit loads
// want (Q4_K / Q5_K: a 64-byte load of quants holds the low nibbles of two 32-byte chunks, so the activations of chunk
// pairs are interleaved likewise; Q6_K: natural order). Each 512-bit int32 lane i < 8 plus lane i + 8 holds exactly the
// integer sum of avx2int8's lane i (the same products, grouped otherwise: integer sums are exact), folded to 8 lanes per
// block before the same fp32 tail (one fma per block of the products at dw dx, one of the mins at dmin dx; avx2's hsum).
// So a K-quant GGUF gives the same logits on an AVX2 and an AVX-512 machine. Q4_K's 16-row decode layout
// (decode_layout.h; session 44) has its own one-token kernel below, which forms the same 8 lanes per row: the same
// bits. Integer ranges as in avx2int8 (a maddubs pair <= 2 x 63 x 127 = 16002, no saturation; lanes < 2^25).
//
// Batch invariance (weight_kernels.h): a token is converted by the same code whatever n is, and each (row, token) pair
// runs the same operations in the same order in every tile size (T = 1 is the dot).
// GCC 12's avx512fintrin.h reads an uninitialised __Y in its _mm512_reduce_* / cast helpers (a false positive; the same
// pragmas as weight_kernels_quant_vnni.cpp).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/backend/cpu/decode_layout.h"
#include "k3/backend/cpu/kquant_act_order.h"
#include "k3/backend/cpu/weight_kernels_avx512bf16.h"
#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/backend/cpu/weight_simd.h"
#include "k3/backend/cpu/weight_simd512.h"

namespace k3::cpu {
namespace {

constexpr int64_t kQK = 256;
// One converted block (avx2int8's layout): q int8[256] (in the format's load order), the q sums per 16 values in natural
// order (int16[16]), d (fp32), padded to 320 bytes.
// Then (for Q4_K's 16-row kernel) the q sums per sub-block (32 values) as int16[8] (|sum| <= 32 x 127).
constexpr int64_t kSumsAt = 256, kDAt = 288, kSubSumsAt = 292, kBlockBytes = 320;
constexpr int64_t block_stride(int64_t cols) { return cols / kQK * kBlockBytes; }
constexpr int kT = 8;  // tokens per tile: 8 int32 block sums + 8 accumulators + 4 scale vectors + weights in 32 zmm

}  // namespace
}  // namespace k3::cpu

K3_AVX512BF16_BEGIN

#include "k3/backend/cpu/prefetch_cursor.h"
#include "k3/backend/cpu/quant_decode_simd.h"  // qsimd::f16_at

namespace k3::cpu {
namespace {

template <bool kNibblePairs>
void q8k_block(const float* v, uint8_t* o) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  __m512 m = _mm512_setzero_ps(), poison = _mm512_setzero_ps();
  for (int k = 0; k < 16; ++k) {
    const __m512 x = _mm512_loadu_ps(v + 16 * k);
    m = _mm512_max_ps(m, _mm512_and_ps(x, abs_mask));
    poison = _mm512_add_ps(poison, _mm512_mul_ps(x, _mm512_setzero_ps()));  // NaN where x is NaN or inf
  }
  const float amax = _mm512_reduce_max_ps(m);
  const bool finite = !std::isnan(_mm512_reduce_add_ps(poison));
  const float d = finite ? amax / 127.f : NAN, id = amax > 0.f && finite ? 127.f / amax : 0.f;
  const __m512 idv = _mm512_set1_ps(id);
  int16_t sums[16];
  for (int c = 0; c < 4; ++c)
    for (int p = 0; p < 4; ++p) {
      const int src = kquant_group_src<kNibblePairs>(c, p);
      // round-half-even (the default MXCSR mode, as avx2int8's cvtps), saturated to int8 as its two packs do
      const __m128i q = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + src), idv)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 64 * c + 16 * p), q);
      sums[src / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(_mm512_cvtepi8_epi32(q)));
    }
  std::memcpy(o + kSumsAt, sums, sizeof sums);
  std::memcpy(o + kDAt, &d, sizeof d);
  if constexpr (kNibblePairs) {  // Q4_K / Q5_K's layout: what Q4_K's 16-row kernel reads
    int16_t sub[8];
    for (int j = 0; j < 8; ++j) sub[j] = static_cast<int16_t>(sums[2 * j] + sums[2 * j + 1]);
    std::memcpy(o + kSubSumsAt, sub, sizeof sub);
  }
}

template <bool kNibblePairs>
void q8k_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < cols / kQK; ++b)
      q8k_block<kNibblePairs>(x + t * cols + b * kQK, out + t * block_stride(cols) + b * kBlockBytes);
}

// avx2int8's k4_scales_mins in one 16-byte register: a Q4_K / Q5_K block's 12 scale bytes (s; the 4 bytes after them
// are the block's own and ignored) as 8 6-bit sub-scales (bytes 0..7) and 8 sub-mins (8..15). Words u0..u2 = s[0..11]:
// out = [u0 & 63s, (u2 & 15s) | ((u0 >> 6) & 3s) << 4, u1 & 63s, ((u2 >> 4) & 15s) | ((u1 >> 6) & 3s) << 4], byte-wise.
// (As fast as avx2int8's scalar form here -- one_token_rate, console -- but no store of four words reloaded as a vector.)
inline __m128i k4_scales_mins(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i p = _mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4));  // u0 u2 u1 u2>>4
  const __m128i low = _mm_and_si128(p, _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
  const __m128i q = _mm_shuffle_epi32(v, _MM_SHUFFLE(1, 1, 0, 0));  // u0 u0 u1 u1
  const __m128i top = _mm_and_si128(_mm_slli_epi32(_mm_srli_epi32(q, 6), 4), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm_or_si128(low, top);
}

// int16 word a in the low 256-bit half, b in the high one (per-half shift counts, per-half scale indices).
inline __m512i halves16(int a, int b) {
  return _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(a)), _mm256_set1_epi16(static_cast<int16_t>(b)), 1);
}

inline __m256i fold(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }

// One token's software prefetch: pf requests the weights `ahead` bytes past each block (null: none).
struct Stream {
  PrefetchCursor<1>* pf = nullptr;
  int64_t ahead = 0;
  __attribute__((always_inline)) void at(const uint8_t* block_end) const {
    if (pf) pf->upto(reinterpret_cast<uintptr_t>(block_end) + static_cast<uintptr_t>(ahead));
  }
};

// One Q4_K / Q5_K row x T tokens. Load k (0, 1) of 64 quant bytes: lo = sub-blocks 4k (bytes 0-31) and 4k + 2 (32-63),
// hi = 4k + 1 and 4k + 3; their int16 sub-scales broadcast per 256-bit half.
template <int T, bool kFive>
__attribute__((always_inline)) inline void k45_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, int64_t ldq, float* y,
                                                    int64_t ldy, Stream st) {
  constexpr int64_t kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m128i dup_mins = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = row + b * kBytes;
    st.at(wb + kBytes);
    const float dw = qsimd::f16_at(wb), dmin = qsimd::f16_at(wb + 2);
    const __m128i sm = k4_scales_mins(wb + 4);
    const __m512i sc16 = _mm512_castsi256_si512(_mm256_cvtepu8_epi16(sm));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(sm, dup_mins));
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm512_setzero_si512();
    [[maybe_unused]] __m512i qh;
    if constexpr (kFive) qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 16)));
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      const __m512i q = _mm512_loadu_si512(wb + kQs + 64 * k);
      __m512i lo = _mm512_and_si512(q, nib), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
      if constexpr (kFive) {  // avx2int8's bits 2p / 2p + 1 of qh for chunk p = 2k (low half), 2k + 1 (high half)
        const __m512i one = _mm512_set1_epi8(1);
        lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, halves16(4 * k, 4 * k + 2)), one), 4));
        hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, halves16(4 * k + 1, 4 * k + 3)), one), 4));
      }
      const __m512i s_lo = _mm512_permutexvar_epi16(halves16(4 * k, 4 * k + 2), sc16);
      const __m512i s_hi = _mm512_permutexvar_epi16(halves16(4 * k + 1, 4 * k + 3), sc16);
      for (int t = 0; t < T; ++t) {
        const uint8_t* xb = xq + t * ldq + b * kBlockBytes + 128 * k;
        sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xb)), s_lo);
        sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xb + 64)), s_hi);
      }
    }
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = xq + t * ldq + b * kBlockBytes;
      float dx;
      std::memcpy(&dx, xb + kDAt, sizeof dx);
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kSumsAt));
      const __m256i mq = _mm256_madd_epi16(sums, mins16);
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(fold(sumi[t])), acc[t]);
      acc[t] = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * dx), _mm256_cvtepi32_ps(mq), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = simd::hsum(acc[t]);  // avx2int8's reduction: the same bits
}

// One Q6_K row x T tokens. Half h (128 values), part j: the low (j = 0) or high (j = 1) nibbles of ql bytes [64 h, + 64)
// = values 128 h + 64 j + [0, 64), their top 2 bits from qh bytes [128 + 32 h, + 32) at bit pairs 2j (low 256-bit half)
// and 2j + 1 (high); quants 0..63 unsigned, the -32 offset taken from the q sums as in avx2int8. Each 128-bit quarter q
// of a part is one 16-value group, 8 h + 4 j + q, and meets that group's int8 scale.
template <int T>
__attribute__((always_inline)) inline void k6_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, int64_t ldq, float* y,
                                                   int64_t ldy, Stream st) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(0x03);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = row + b * 210;
    st.at(wb + 210);
    const float dw = qsimd::f16_at(wb + 208);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 192));
    const __m256i sc16y = _mm256_cvtepi8_epi16(sc8);  // the 16 int8 scales as words
    const __m512i sc16 = _mm512_castsi256_si512(sc16y);
    __m512i sumi[T];
    for (int t = 0; t < T; ++t) sumi[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(wb + 64 * h);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 128 + 32 * h)));
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        const __m512i lb = j == 0 ? _mm512_and_si512(ql, nib) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), nib);
        const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, halves16(4 * j, 4 * j + 2)), two);
        const __m512i w = _mm512_or_si512(lb, _mm512_slli_epi16(hb, 4));
        // 128-bit lane q takes group 8 h + 4 j + q: word 4 j + q of scales 8 h .. 8 h + 7 (broadcast per half)
        // word lane L (0..31) takes group 8 h + 4 j + L / 8
        const __m512i idx = _mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(8 * h + 4 * j)),
                                             _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 0,
                                                              0, 0, 0, 0, 0, 0, 0));
        const __m512i sc = _mm512_permutexvar_epi16(idx, sc16);
        for (int t = 0; t < T; ++t) {
          const __m512i q = _mm512_loadu_si512(xq + t * ldq + b * kBlockBytes + 128 * h + 64 * j);
          sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(w, q), sc);
        }
      }
    }
    for (int t = 0; t < T; ++t) {
      const uint8_t* xb = xq + t * ldq + b * kBlockBytes;
      const __m256i sums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + kSumsAt));
      const __m256i off = _mm256_madd_epi16(sums, sc16y);  // sum_g scale_g sum_g, in pairs of groups
      float dx;
      std::memcpy(&dx, xb + kDAt, sizeof dx);
      const __m256i tot = _mm256_sub_epi32(fold(sumi[t]), _mm256_slli_epi32(off, 5));
      acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(tot), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = simd::hsum(acc[t]);  // avx2int8's reduction: the same bits
}

// Q4_K's 16-row decode layout (decode_layout.h), one token: rows 16 g .. 16 g + 15 of one group, lane r = row r. It
// forms, per row, the stored-row kernel's 8 lanes (k45_tile<1>): lane i = sum over the sub-blocks j of sc_j x the
// products of values 4 i .. 4 i + 3 of sub-block j, and the mins lane i = m_i x the q sum of sub-block i; so 8 int32
// vectors P[i] (16 rows each), 8 fp32 accumulators, the same two fmas per block and lane, and at the end avx2's hsum
// order over the 8: the stored rows' bits. Per sub-block the 16 rows' 32 quants are four 64-byte loads (low and high
// nibbles: quads 2 h and 2 h + 1), each quad multiplied by its 4 activations broadcast (vpmaddubsw: unsigned quants,
// signed activations, pair sums <= 2 x 15 x 127, exact) and by the rows' sub-scales into P (vpdpwssd). ~18 instructions
// per row and block against the stored rows' ~45. (vpdpbusd then vpmulld per quad: 30.7 GB/s a thread in L2, this
// form: see docs/perf/cpu.md session 44.)
__attribute__((always_inline)) inline __m512i act_quad(const uint8_t* xb, int s) {
  int32_t v;
  std::memcpy(&v, xb + 4 * s, sizeof v);
  return _mm512_set1_epi32(v);
}

__attribute__((always_inline)) inline void q4k_group_one_token(const uint8_t* g, int64_t blocks, const uint8_t* xq, float* y,
                                                               Stream st) {
  __m512 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i dup_words = _mm512_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8, 7, 7, 6, 6, 5, 5, 4, 4, 3,
                                             3, 2, 2, 1, 1, 0, 0);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* gb = g + b * kQ4KGroupBlockBytes;
    const uint8_t* xb = xq + b * kBlockBytes;
    st.at(gb + kQ4KGroupBlockBytes);
    __m512i P[8];
    for (int i = 0; i < 8; ++i) P[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      // the rows' sub-scales as int16 pairs (sc, sc): a quad's two maddubs pair sums times sc in one vpdpwssd
      const __m512i sc = _mm512_permutexvar_epi16(
          dup_words, _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 64 + 16 * j)))));
#pragma GCC unroll 4
      for (int h = 0; h < 4; ++h) {
        const __m512i q = _mm512_loadu_si512(gb + 320 + 256 * j + 64 * h);
        const __m512i lo = _mm512_maddubs_epi16(_mm512_and_si512(q, nib), act_quad(xb, kKquantSubBlockQuads.q[j][2 * h]));
        const __m512i hi = _mm512_maddubs_epi16(_mm512_and_si512(_mm512_srli_epi16(q, 4), nib),
                                                act_quad(xb, kKquantSubBlockQuads.q[j][2 * h + 1]));
        P[2 * h] = _mm512_dpwssd_epi32(P[2 * h], lo, sc);
        P[2 * h + 1] = _mm512_dpwssd_epi32(P[2 * h + 1], hi, sc);
      }
    }
    float dx;
    std::memcpy(&dx, xb + kDAt, sizeof dx);
    int16_t sub[8];
    std::memcpy(sub, xb + kSubSumsAt, sizeof sub);
    const __m512 dxv = _mm512_set1_ps(dx);
    const __m512 a = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb))), dxv);
    const __m512 m = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(gb + 32))), dxv);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i mins = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(gb + 192 + 16 * i)));
      const __m512i M = _mm512_madd_epi16(mins, _mm512_set1_epi32(static_cast<uint16_t>(sub[i])));  // m x sum + 0 x 0
      acc[i] = _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(P[i]), acc[i]);
      acc[i] = _mm512_fnmadd_ps(m, _mm512_cvtepi32_ps(M), acc[i]);
    }
  }
  // simd::hsum's order per row: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))
  const __m512 e = _mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6]));
  const __m512 o = _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7]));
  _mm512_storeu_ps(y, _mm512_add_ps(e, o));
}

template <WeightFormat F, int T>
__attribute__((always_inline)) inline void k_row(const uint8_t* row, int64_t blocks, const uint8_t* xq, int64_t ldq, float* y,
                                                 int64_t ldy, Stream st) {
  if constexpr (F == WeightFormat::Q6_K)
    k6_tile<T>(row, blocks, xq, ldq, y, ldy, st);
  else
    k45_tile<T, F == WeightFormat::Q5_K>(row, blocks, xq, ldq, y, ldy, st);
}

// Rows [r0, r1) x T tokens (row r's outputs at y + (r - r0)); the rows of pf_rows are requested into L2 first, a row
// at a time (the next row block's, while this one computes: the several-token tiles, as session 34's).
template <WeightFormat F, int T>
void k_tile_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t ldq, float* y, int64_t ldy,
                 const uint8_t* pf, int64_t pf_rows) {
  const int64_t row_bytes = row_data_bytes(F, W.cols), blocks = W.cols / kQK;
  for (int64_t r = r0; r < r1; ++r) {
    if (r - r0 < pf_rows) prefetch_lines<1>(pf + (r - r0) * row_bytes, row_bytes);
    k_row<F, T>(W.row_data(r), blocks, xq, ldq, y + (r - r0), ldy, Stream{});
  }
}

// One token over rows [r0, r1): the rows' one stream prefetched through one cursor, `ahead` bytes past each block.
template <WeightFormat F>
void k_one_token_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, float* y, int64_t ahead);

// One token over rows [r0, r1) of a Q4_K matrix with its 16-row copy: the whole groups from the copy (one cursor), the
// rows before and after them from the stored rows.
void q4k_decode_layout_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, float* y, int64_t ahead) {
  const int64_t g0 = (r0 + kQ4KGroupRows - 1) / kQ4KGroupRows, g1 = r1 / kQ4KGroupRows, blocks = W.cols / kQK;
  if (g0 >= g1) return k_one_token_rows<WeightFormat::Q4_K>(W, r0, r1, xq, y, ahead);
  const int64_t a = g0 * kQ4KGroupRows, e = g1 * kQ4KGroupRows;
  for (int64_t r = r0; r < a; ++r) k_row<WeightFormat::Q4_K, 1>(W.row_data(r), blocks, xq, 0, y + (r - r0), 1, Stream{});
  const auto* base = static_cast<const uint8_t*>(W.tiled);
  PrefetchCursor<1> pf{reinterpret_cast<uintptr_t>(base + g0 * blocks * kQ4KGroupBlockBytes) & ~uintptr_t{63}};
  for (int64_t g = g0; g < g1; ++g)
    q4k_group_one_token(base + g * blocks * kQ4KGroupBlockBytes, blocks, xq, y + (g * kQ4KGroupRows - r0),
                        Stream{ahead > 0 ? &pf : nullptr, ahead});
  for (int64_t r = e; r < r1; ++r) k_row<WeightFormat::Q4_K, 1>(W.row_data(r), blocks, xq, 0, y + (r - r0), 1, Stream{});
}

template <WeightFormat F>
void k_one_token_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, float* y, int64_t ahead) {
  const int64_t row_bytes = row_data_bytes(F, W.cols), blocks = W.cols / kQK;
  const uint8_t* data = W.row_data(r0);
  PrefetchCursor<1> pf{reinterpret_cast<uintptr_t>(data) & ~uintptr_t{63}};
  for (int64_t r = 0; r < r1 - r0; ++r)
    k_row<F, 1>(data + r * row_bytes, blocks, xq, 0, y + r, 1, Stream{ahead > 0 ? &pf : nullptr, ahead});
}

template <WeightFormat F, size_t... T>
constexpr auto k_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const WeightMatrix&, int64_t, int64_t, const uint8_t*, int64_t, float*, int64_t, const uint8_t*, int64_t);
  return std::array<Tile, sizeof...(T)>{k_tile_rows<F, static_cast<int>(T) + 1>...};
}

// Rows [r0, r1) x n converted tokens: blocks of rows (~128 KiB of weights) stay in L2 while the token tiles pass; the
// first tile of a block requests the next block's rows (K3_TILE_PREFETCH=0: not).
template <WeightFormat F>
void k_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t n, float* y, int64_t ldy) {
  static constexpr auto tiles = k_tiles<F>(std::make_index_sequence<kT>());
  const int64_t ldq = block_stride(W.cols), row_bytes = row_data_bytes(F, W.cols);
  if (n == 1) {
    if constexpr (F == WeightFormat::Q4_K)
      if (W.tiled != nullptr && W.device == kHostDevice)
        return q4k_decode_layout_rows(W, r0, r1, xq, y, avx512bf16_quant_prefetch_bytes());
    return k_one_token_rows<F>(W, r0, r1, xq, y, avx512bf16_quant_prefetch_bytes());
  }
  const int64_t block = std::max<int64_t>(1, (128 << 10) / std::max<int64_t>(1, row_bytes));
  if (g_tile_prefetch)
    for (int64_t r = r0; r < std::min(r1, r0 + block); ++r) prefetch_lines<1>(W.row_data(r), row_bytes);
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kT) {
      const int64_t m = std::min<int64_t>(kT, n - t0);
      const bool pf = t0 == 0 && b1 < r1 && g_tile_prefetch;
      tiles[m - 1](W, b0, b1, xq + t0 * ldq, ldq, y + t0 * ldy + (b0 - r0), ldy, pf ? W.row_data(b1) : nullptr,
                   pf ? std::min(block, r1 - b1) : 0);
    }
  }
}

}  // namespace
}  // namespace k3::cpu

K3_AVX512BF16_END

// ---- plain code: the Paths (act_convert_path.h builds the RowKernels entries) ----

namespace k3::cpu {
namespace {

template <WeightFormat F>
struct KPath {
  static int64_t stride_bytes(int64_t cols) { return block_stride(cols); }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) {
    q8k_tokens<F != WeightFormat::Q6_K>(x, n, cols, out);
  }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    k_rows<F>(W, r0, r1, act, n, y, ldy);
  }
};

template <WeightFormat F>
const RowKernels* k_kernels() {
  static const RowKernels k = act_path::kernels<KPath<F>>(*avx512_quant_row_kernels(F));
  return &k;
}

}  // namespace

const RowKernels* avx512bf16_k_row_kernels(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_K: return k_kernels<WeightFormat::Q4_K>();
    case WeightFormat::Q5_K: return k_kernels<WeightFormat::Q5_K>();
    case WeightFormat::Q6_K: return k_kernels<WeightFormat::Q6_K>();
    default: return nullptr;
  }
}

}  // namespace k3::cpu
