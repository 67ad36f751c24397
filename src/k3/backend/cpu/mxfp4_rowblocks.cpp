// The 16-row MXFP4 repack and its product over tiles of tokens (mxfp4_rowblocks.h). Only the functions between
// K3_AVX512BF16_BEGIN/END (the avx512bf16 form of the activations' quantisation and the product) are compiled for
// AVX-512 + VBMI + VNNI; the repack is plain code, the AVX2 form is mxfp4_rowblocks_avx2.cpp (mxfp4_rowblocks_forms.h),
// and an AVX2-only CPU never runs EVEX code (the form is picked from the CPU's features).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12's AVX-512 intrinsic headers (as the tier's files)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "k3/backend/cpu/mxfp4_rowblocks.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "k3/backend/cpu/cpu_features.h"
#include "k3/backend/cpu/cpu_isa.h"
#include "k3/backend/cpu/mxfp4_rowblocks_forms.h"
#include "k3/backend/cpu/weight_simd512.h"
#include "k3/core/error.h"
#include "k3/core/q8_blocks.h"

namespace k3::cpu {

namespace {

constexpr int64_t kG = 32;  // an MXFP4 group
// The smallest block maximum that is scaled (core/q8_blocks.h): below it 127 / max overflows to infinity (max < 127 /
// FLT_MAX ~ 2^-121), so such a block quantises to q = 0 (it was all -127 for a denormal block: vcvtps2dq of inf and NaN
// is INT_MIN).
constexpr float kMinScaledMax = kQ8MinScaledMax;

// Row r's group g as 32 E2M1 codes in column order (one per byte) and its E8M0 scale, from either MXFP4 layout.
void group_codes(const WeightMatrix& W, int64_t r, int64_t g, uint8_t codes[kG], uint8_t& scale) {
  const uint8_t* row = W.row_data(r);
  if (W.format == WeightFormat::MXFP4) {  // element c: byte c / 2, low nibble for even c
    const uint8_t* p = row + g * (kG / 2);
    for (int j = 0; j < 16; ++j) {
      codes[2 * j] = p[j] & 15;
      codes[2 * j + 1] = p[j] >> 4;
    }
    scale = W.row_scales(r)[g];
  } else {  // {e8m0, qs[16]}: element j low nibble of qs[j], j + 16 its high one
    const uint8_t* blk = row + g * 17;
    for (int j = 0; j < 16; ++j) {
      codes[j] = blk[1 + j] & 15;
      codes[j + 16] = blk[1 + j] >> 4;
    }
    scale = blk[0];
  }
}

}  // namespace

bool mxfp4_rowblocks_supported(const WeightMatrix& W) {
  return (W.format == WeightFormat::MXFP4 || W.format == WeightFormat::MXFP4_GGML) && W.rows > 0 &&
         W.rows % kMxfp4RowBlockRows == 0 && W.cols > 0 && W.cols % kG == 0 && W.data != nullptr &&
         (W.format != WeightFormat::MXFP4 || W.scales != nullptr);
}

int64_t mxfp4_rowblocks_bytes(const WeightMatrix& W) {
  return W.rows / kMxfp4RowBlockRows * (W.cols / kG) * kMxfp4RowBlockGroupBytes;
}

void mxfp4_rowblocks_write(const WeightMatrix& W, uint8_t* out) {
  if (!mxfp4_rowblocks_supported(W))
    throw Error("mxfp4_rowblocks: needs an MXFP4 matrix with rows a multiple of 16 and columns a multiple of 32 (got " +
                std::to_string(W.rows) + " x " + std::to_string(W.cols) + ")");
  const int64_t groups = W.cols / kG, blocks = W.rows / kMxfp4RowBlockRows;
  uint8_t codes[16][kG];
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* dst = out + (b * groups + g) * kMxfp4RowBlockGroupBytes;
      for (int r = 0; r < 16; ++r) group_codes(W, 16 * b + r, g, codes[r], dst[256 + r]);
      // byte s of quad qd: rows s / 4 (low nibble) and s / 4 + 8 of column 4 qd + s % 4 -- as 32-bit words, quad qd's
      // word r is row r's codes 4 qd .. 4 qd + 3 (one per byte) or'd with row r + 8's shifted up a nibble
      for (int qd = 0; qd < 8; ++qd)
        for (int r = 0; r < 8; ++r) {
          uint32_t lo, hi;
          std::memcpy(&lo, codes[r] + 4 * qd, 4);
          std::memcpy(&hi, codes[r + 8] + 4 * qd, 4);
          const uint32_t w = lo | hi << 4;
          std::memcpy(dst + 32 * qd + 4 * r, &w, 4);
        }
    }
}

int mxfp4_rowblocks_act_block() {
  static const int v = [] {
    const char* e = std::getenv("K3_MXFP4_RB_ACT_BLOCK");
    const int n = e ? std::atoi(e) : 32;
    return n == 4 || n == 8 || n == 16 || n == 32 ? n : 32;
  }();
  return v;
}

int64_t mxfp4_rowblocks_act_bytes(int64_t cols) {
  return (cols + cols / mxfp4_rowblocks_act_block() * 8 + 63) / 64 * 64;
}

Mxfp4GroupActs mxfp4_rowblocks_acts(const uint8_t* act, int64_t cols) {
  const int64_t blocks = cols / mxfp4_rowblocks_act_block();
  return {reinterpret_cast<const int8_t*>(act), reinterpret_cast<const float*>(act + cols),
          reinterpret_cast<const int32_t*>(act + cols + blocks * 4), mxfp4_rowblocks_act_block()};
}

bool mxfp4_rowblocks_form_ok(Mxfp4RowBlocksForm f) {  // the features of the tier whose instructions the form uses
  static const bool avx2 = isa_missing_features(detect_cpu_features(), CpuIsa::Avx2Int8, false).empty();
  static const bool avx512 = isa_missing_features(detect_cpu_features(), CpuIsa::Avx512Bf16, false).empty();
  return f == Mxfp4RowBlocksForm::Avx512Bf16 ? avx512 : avx2;
}

bool mxfp4_rowblocks_cpu_ok() { return mxfp4_rowblocks_form_ok(Mxfp4RowBlocksForm::Avx2); }

Mxfp4RowBlocksForm mxfp4_rowblocks_form() {
  const CpuIsa isa = active_cpu_isa();
  const bool avx2_tier = isa == CpuIsa::Avx2 || isa == CpuIsa::Avx2Int8;  // K3_CPU_ISA asked for AVX2 code
  return mxfp4_rowblocks_form_ok(Mxfp4RowBlocksForm::Avx512Bf16) && !avx2_tier ? Mxfp4RowBlocksForm::Avx512Bf16
                                                                                : Mxfp4RowBlocksForm::Avx2;
}

bool mxfp4_rowblocks_job(const WeightMatrix& W, int64_t n) {
  return n >= 1 && W.tiled != nullptr && W.device == kHostDevice &&
         (W.format == WeightFormat::MXFP4 || W.format == WeightFormat::MXFP4_GGML) && mxfp4_rowblocks_cpu_ok();
}

namespace rowblocks_detail {
// K3_MXFP4_RB_PREFETCH=N: the product requests the lines N bytes ahead of its stream (0: none; default 2048). The A/B
// knob of the measurement (docs/perf/cpu.md, session 53).
int64_t prefetch_ahead() {
  static const int64_t v = [] {
    const char* e = std::getenv("K3_MXFP4_RB_PREFETCH");
    const long long n = e ? std::atoll(e) : 2048;
    return n >= 0 && n <= (1 << 20) ? static_cast<int64_t>(n) / 64 * 64 : int64_t{2048};
  }();
  return v;
}

// One activation block of S values the scalar way: core/q8_blocks.h's rule (a block holding a NaN or an infinity:
// q = 0, d = NaN), and start = -12 x sum(q).
void quantise_block_scalar(const float* x, int S, int8_t* q, float* d, int32_t* start) {
  *d = quantise_q8_block(x, S, q);
  int32_t sum = 0;
  for (int k = 0; k < S; ++k) sum += q[k];
  *start = -12 * sum;
}
}  // namespace rowblocks_detail
using rowblocks_detail::prefetch_ahead;
using rowblocks_detail::quantise_block_scalar;

K3_AVX512BF16_BEGIN
namespace {

// 0.5 x 2^(s - 127) for the 16 row scales of a group: (s - 1) << 23 as float bits for s in 2..254, the table (the
// exact denormals of s = 0, 1 and NaN for 255) otherwise.
__attribute__((always_inline)) inline __m512 half_scales(const uint8_t* s16) {
  const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s16)));
  const __mmask16 odd = _mm512_cmplt_epu32_mask(s, _mm512_set1_epi32(2)) | _mm512_cmpeq_epi32_mask(s, _mm512_set1_epi32(255));
  __m512 v = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_sub_epi32(s, _mm512_set1_epi32(1)), 23));
  if (odd) {
    alignas(64) float t[16];
    _mm512_store_ps(t, v);
    for (int r = 0; r < 16; ++r)
      if (odd >> r & 1) t[r] = simd512::kHalfE8m0[s16[r]];
    v = _mm512_load_ps(t);
  }
  return v;
}

// Every lane of m (|x|, 16 lanes) gets the max of its aligned segment of S lanes (S = 4, 8, 16).
template <int S>
__attribute__((always_inline)) inline __m512 segment_max(__m512 m) {
  m = _mm512_max_ps(m, _mm512_permute_ps(m, 0xB1));  // pairs
  m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4E));  // fours
  if constexpr (S >= 8) m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0xB1));  // eights: 128-bit lanes swapped pairwise
  if constexpr (S >= 16) m = _mm512_max_ps(m, _mm512_shuffle_f32x4(m, m, 0x4E));
  return m;
}
template <int S>
__attribute__((always_inline)) inline __m512i segment_sum(__m512i v) {
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(0xB1)));
  v = _mm512_add_epi32(v, _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(0x4E)));
  if constexpr (S >= 8) v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, 0xB1));
  if constexpr (S >= 16) v = _mm512_add_epi32(v, _mm512_shuffle_i32x4(v, v, 0x4E));
  return v;
}


// One token: per block of S values q = nearest-even of x x 127 / max |x| (vcvtps2dq rounds to nearest-even, the
// division is IEEE's: the scalar form's bits), d = max / 127, start = -12 x sum(q).
template <int S>
void quantise_token(const float* x, int64_t cols, uint8_t* out) {
  int8_t* q = reinterpret_cast<int8_t*>(out);
  float* d = reinterpret_cast<float*>(out + cols);
  int32_t* start = reinterpret_cast<int32_t*>(out + cols + cols / S * 4);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512 c127 = _mm512_set1_ps(127.f);
  constexpr int W = S == 32 ? 32 : 16;  // values a step
  constexpr __mmask16 firsts = S == 4 ? 0x1111 : S == 8 ? 0x0101 : 0x0001;
  for (int64_t c = 0; c < cols; c += W) {
    const __m512 v0 = _mm512_loadu_ps(x + c), v1 = S == 32 ? _mm512_loadu_ps(x + c + 16) : _mm512_setzero_ps();
    if (_mm512_fpclass_ps_mask(v0, 0x99) | _mm512_fpclass_ps_mask(v1, 0x99)) {  // QNaN, +-inf, SNaN: rare
      for (int k = 0; k < W; k += S) quantise_block_scalar(x + c + k, S, q + c + k, d + (c + k) / S, start + (c + k) / S);
      continue;
    }
    __m512 m = _mm512_abs_ps(v0);
    if constexpr (S == 32) m = _mm512_max_ps(m, _mm512_abs_ps(v1));
    m = segment_max<S == 32 ? 16 : S>(m);
    const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(m, _mm512_set1_ps(kMinScaledMax), _CMP_GE_OQ), c127, m);
    const __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), lo), hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c), _mm512_cvtepi32_epi8(q0));
    __m512i sum = q0;
    if constexpr (S == 32) {
      const __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)), lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + c + 16), _mm512_cvtepi32_epi8(q1));
      sum = _mm512_add_epi32(sum, q1);
    }
    sum = _mm512_mullo_epi32(segment_sum<S == 32 ? 16 : S>(sum), _mm512_set1_epi32(-12));
    _mm512_mask_compressstoreu_ps(d + c / S, firsts, _mm512_div_ps(m, c127));
    _mm512_mask_compressstoreu_epi32(start + c / S, firsts, sum);
  }
}

// Rows of blocks [b0, b1) against T tokens (a[t], y[t]: token t's activations and outputs, y[t][16 (b - b0) + r]), with
// activation blocks of S values: per group, 32 / S int32 dots a token (each over the quads of its block), each scaled by
// the 16 rows' E8M0 x the block's d into one of two fp32 accumulators. Each quad is decoded once for the T tokens; a
// token's arithmetic is the same whatever T (the int32 dots are exact, the fp32 steps the same in the same order), so a
// token's outputs have the same bits alone or in a batch (docs/engine.md: the CPU engine is batch-invariant).
template <int S, int T>
void rowblocks_kernel(const uint8_t* copy, int64_t cols, const Mxfp4GroupActs* a, int64_t b0, int64_t b1, float* const* y) {
  constexpr int kSubs = 32 / S, kQuads = S / 4;
  const int64_t groups = cols / kG, ahead = prefetch_ahead();
  // the tier's decode: a quad's 32 bytes to 64 nibbles (simd512::nibble_halves_ctrl), each code to code + 12 (unsigned:
  // vpdpbusd's first operand; the start value cancels the 12s)
  const __m512i ctrl = simd512::nibble_halves_ctrl(), lut = _mm512_broadcast_i32x4(simd512::e2m1x2_plus12_table());
  const uint8_t* blk = copy + b0 * groups * kMxfp4RowBlockGroupBytes;
  for (int64_t b = b0; b < b1; ++b) {
    __m512 acc[T][2];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t][0] = acc[t][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; ++g, blk += kMxfp4RowBlockGroupBytes) {
      if (ahead > 0)  // the group's 272 bytes touch at most 6 lines; ask for the lines `ahead` bytes on
        for (int l = 0; l < 5; ++l) _mm_prefetch(reinterpret_cast<const char*>(blk + ahead + 64 * l), _MM_HINT_T0);
      const __m512 rows_sc = half_scales(blk + 256);
#pragma GCC unroll 8
      for (int sb = 0; sb < kSubs; ++sb) {
        // a token's block: two chains where it has several quads (eight in one chain: ~40 cycles of latency at T = 1)
        __m512i dot0[T], dot1[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          dot0[t] = _mm512_set1_epi32(a[t].start[g * kSubs + sb]);
          dot1[t] = _mm512_setzero_si512();
        }
#pragma GCC unroll 8
        for (int k = 0; k < kQuads; ++k) {
          const int qd = sb * kQuads + k;
          const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * qd));
          const __m512i w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_broadcast_i64x4(packed)), lut);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) {
            int32_t quad;
            __builtin_memcpy(&quad, a[t].q + g * kG + 4 * qd, 4);
            if (k % 2 == 0)
              dot0[t] = _mm512_dpbusd_epi32(dot0[t], w, _mm512_set1_epi32(quad));
            else
              dot1[t] = _mm512_dpbusd_epi32(dot1[t], w, _mm512_set1_epi32(quad));
          }
        }
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const __m512i dot = kQuads > 1 ? _mm512_add_epi32(dot0[t], dot1[t]) : dot0[t];
          acc[t][sb % 2] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(rows_sc, _mm512_set1_ps(a[t].d[g * kSubs + sb])),
                                           acc[t][sb % 2]);
        }
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) _mm512_storeu_ps(y[t] + 16 * (b - b0), _mm512_add_ps(acc[t][0], acc[t][1]));
  }
}

// Tokens in tiles of up to kTileTokens (the registers: 3 a token + 5), each tile over the row blocks.
constexpr int kTileTokens = 8;
template <int S, size_t... T>
constexpr auto token_tiles(std::index_sequence<T...>) {
  return std::array<rowblocks_detail::RowBlocksKernel, sizeof...(T)>{rowblocks_kernel<S, static_cast<int>(T) + 1>...};
}
template <int S>
void rows_tokens(const uint8_t* copy, int64_t cols, const uint8_t* act, int64_t stride, int64_t n, int64_t b0, int64_t b1,
                 float* y, int64_t ldy) {
  static constexpr auto tiles = token_tiles<S>(std::make_index_sequence<kTileTokens>());
  rowblocks_detail::run_token_tiles(tiles, copy, cols, act, stride, n, b0, b1, y, ldy);
}

}  // namespace
K3_AVX512BF16_END

namespace {
// The instruction-set forms (mxfp4_rowblocks_forms.h) for the activation block chosen at start-up (K3_MXFP4_RB_ACT_BLOCK).
struct BlockForms {
  void (*quantise)(const float*, int64_t, int64_t, int, int64_t, uint8_t*);
  void (*rows)(int, const uint8_t*, int64_t, const uint8_t*, int64_t, int64_t, int64_t, int64_t, float*, int64_t);
};
template <int S>
void avx512_quantise_as(const float* x, int64_t n, int64_t cols, int, int64_t stride, uint8_t* out) {
  for (int64_t t = 0; t < n; ++t) quantise_token<S>(x + t * cols, cols, out + t * stride);
}
template <int S>
void avx512_rows_as(int, const uint8_t* copy, int64_t cols, const uint8_t* act, int64_t stride, int64_t n, int64_t b0,
                    int64_t b1, float* y, int64_t ldy) {
  rows_tokens<S>(copy, cols, act, stride, n, b0, b1, y, ldy);
}
template <int S>
constexpr BlockForms avx512_forms() {
  return {avx512_quantise_as<S>, avx512_rows_as<S>};
}
const BlockForms& block_forms(Mxfp4RowBlocksForm f) {
  static const BlockForms avx2{rowblocks_detail::avx2_quantise, rowblocks_detail::avx2_rows};
  static const BlockForms avx512 = [] {
    switch (mxfp4_rowblocks_act_block()) {
      case 4: return avx512_forms<4>();
      case 8: return avx512_forms<8>();
      case 16: return avx512_forms<16>();
      default: return avx512_forms<32>();
    }
  }();
  return f == Mxfp4RowBlocksForm::Avx512Bf16 ? avx512 : avx2;
}
}  // namespace

void mxfp4_rowblocks_prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  mxfp4_rowblocks_prepare(x, n, cols, out, mxfp4_rowblocks_form());
}

void mxfp4_rowblocks_prepare(const float* x, int64_t n, int64_t cols, uint8_t* out, Mxfp4RowBlocksForm f) {
  if (cols <= 0 || cols % kG != 0) throw Error("mxfp4_rowblocks_prepare: columns must be a positive multiple of 32");
  if (!mxfp4_rowblocks_form_ok(f)) throw Error("mxfp4_rowblocks_prepare: this CPU lacks the form's features");
  block_forms(f).quantise(x, n, cols, mxfp4_rowblocks_act_block(), mxfp4_rowblocks_act_bytes(cols), out);
}

void mxfp4_rowblocks_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y,
                          int64_t ldy) {
  mxfp4_rowblocks_rows(W, r0, r1, act, n, y, ldy, mxfp4_rowblocks_form());
}

void mxfp4_rowblocks_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y,
                          int64_t ldy, Mxfp4RowBlocksForm f) {
  if (!mxfp4_rowblocks_job(W, n) || !mxfp4_rowblocks_form_ok(f))
    throw Error("mxfp4_rowblocks_rows: needs tokens, a host MXFP4 matrix with its copy, and the form's CPU features");
  if (r0 < 0 || r1 > W.rows || r0 > r1 || r0 % kMxfp4RowBlockRows != 0 || r1 % kMxfp4RowBlockRows != 0)
    throw Error("mxfp4_rowblocks_rows: rows [" + std::to_string(r0) + ", " + std::to_string(r1) +
                ") are not whole 16-row blocks of " + std::to_string(W.rows));
  if (W.cols % kG != 0) throw Error("mxfp4_rowblocks_rows: columns must be a multiple of 32");
  if (n > 1 && ldy < r1 - r0) throw Error("mxfp4_rowblocks_rows: the outputs' stride is shorter than the rows");
  block_forms(f).rows(mxfp4_rowblocks_act_block(), static_cast<const uint8_t*>(W.tiled), W.cols, act,
                      mxfp4_rowblocks_act_bytes(W.cols), n, r0 / kMxfp4RowBlockRows, r1 / kMxfp4RowBlockRows, y, ldy);
}

}  // namespace k3::cpu
