// The avx512bf16 kernel tier: BF16 weights with vdpbf16ps and MXFP4 weights with int8 VNNI (vpdpbusd).
// Unlike the avx2 and avx512 tiers, products are NOT the exact fp32 products: the activations are rounded
// once per token and matmul call (docs/perf/cpu.md, "The avx512bf16 tier"):
//
// - BF16: x rounded to bf16 (round to nearest even, vcvtne2ps2bf16; 8 significant bits): relative error
//   <= 2^-8 per activation; the bf16 x bf16 products are exact in fp32 and accumulate in fp32 (vdpbf16ps: two products
//   per lane and step; it treats denormal inputs as zero and flushes denormal results).
// - MXFP4: x quantised to int8 with one scale per 4 activations (a "quad": the 4 bytes vpdpbusd sums into
//   one int32 lane; llama.cpp's Q8_0 has one per 32): d = max|x| / 127 rounded up, q = round(x / d) in
//   [-127, 127], error <= d/2 per activation. A quad's sum of q x (2 x E2M1) is an exact int32, then scaled
//   by d (fp32) and by 0.5 x 2^(e8m0 - 127) into one fp32 accumulator per (row, token). A quad holding a
//   NaN or an infinity gets d = NaN, so the output is NaN (an exact tier gives inf or NaN there).
//
// Batch invariance holds as in the other tiers (weight_kernels.h): a token's activations are converted by
// the same code whatever n is, and the single-token dot IS the 1x1 (BF16) or 1-token (MXFP4) tile. F32 and
// F16 weights use the avx512 tier's exact kernels (weight_kernels.cpp's table).
//
// Only the functions between K3_AVX512BF16_BEGIN/END are compiled for AVX-512 + BF16 + VNNI; the drivers
// (act_convert_path.h: scratch buffers, threads) and the Paths at the end are plain code, so no inline function of a standard header is
// instantiated with that target (an AVX2-only CPU never runs EVEX code).
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "k3/backend/cpu/weight_kernels_avx512bf16.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/backend/cpu/prefetch_cursor.h"
#include "k3/backend/cpu/weight_kernels_avx512.h"
#include "k3/backend/cpu/weight_simd512.h"

namespace k3::cpu {

namespace {

// Per-token strides of the converted activations (plain constexpr code, used on both sides).
// BF16: cols rounded up to 32 values, zero-padded, so every step loads a full vector.
constexpr int64_t bf16_stride(int64_t cols) { return (cols + 31) / 32 * 32; }
// MXFP4: per pair of 32-blocks, 64 int8 (offset by 128, see q8_tokens) then 16 fp32 scales (one per quad).
constexpr int64_t kQ8PairBytes = 128;
constexpr int64_t q8_stride(int64_t cols) { return (cols / kMxfp4Group + 1) / 2 * kQ8PairBytes; }

// K3_MXFP4_ONE_TOKEN=tile: one-token MXFP4 rows through the token tile instead of mxfp4_one_token_rows (the A/B
// switch of the measurement; the same bits). Plain code: read once, before any EVEX function runs.
bool read_one_token_swapped() {
  const char* e = std::getenv("K3_MXFP4_ONE_TOKEN");
  return e == nullptr || std::strcmp(e, "tile") != 0;
}
const bool g_one_token_swapped = read_one_token_swapped();
inline bool one_token_swapped() { return g_one_token_swapped; }

// The one-token MXFP4 rows' software prefetch (mxfp4_one_token_rows): K3_MXFP4_PREFETCH=t0 | t1 | t2 | off (the
// cache level the lines ahead are asked into; t1, into L2: the default since session 30) and
// K3_MXFP4_PREFETCH_BYTES=N (how far ahead of the rows being read, 512..65536, default 4096; session 30: a distance in
// bytes, not in rows -- 8 rows were 8.7 KB of a 2048-wide expert's gate / up but 1.6 KB of its 384-wide down). Same bits.
// Session 50: t0 (into L1) read the experts 24 -> 30 GB/s at 2 threads on a Zen 4 box, but halved the whole step on the
// 16-thread Xeon host (kl48 GGUF 44.1 -> 22.1 tok/s, docs/perf/cpu.md): t1 stays the default.
struct OneTokenPrefetch {
  int hint = 1;
  int64_t bytes = 4096;
};
OneTokenPrefetch read_one_token_prefetch() {
  OneTokenPrefetch p;
  if (const char* e = std::getenv("K3_MXFP4_PREFETCH")) {
    if (std::strcmp(e, "t0") == 0) p.hint = 0;
    if (std::strcmp(e, "t2") == 0) p.hint = 2;
    if (std::strcmp(e, "off") == 0) p.hint = 3;
  }
  if (const char* e = std::getenv("K3_MXFP4_PREFETCH_BYTES")) {
    const long v = std::strtol(e, nullptr, 10);
    if (v >= 512 && v <= 65536) p.bytes = v;
  }
  return p;
}
const OneTokenPrefetch g_one_token_prefetch = read_one_token_prefetch();

}  // namespace

}  // namespace k3::cpu

K3_AVX512BF16_BEGIN

#include "k3/backend/cpu/q8_quads_simd.h"
#include "k3/backend/cpu/reduce_tree512.h"

namespace k3::cpu {

using namespace simd512;

namespace {

// ---- BF16: vdpbf16ps ----

// n tokens of x (rows of cols floats) to bf16, out[t * bf16_stride(cols) + i], zero-padded.
void bf16_round_tokens(const float* x, int64_t n, int64_t cols, uint16_t* out) {
  const int64_t ld = bf16_stride(cols);
  for (int64_t t = 0; t < n; ++t) {
    const float* xt = x + t * cols;
    uint16_t* o = out + t * ld;
    int64_t i = 0;
    // vcvtne2ps2bf16 puts its second operand in the low half: values i..i+31 in order.
    for (; i + 32 <= cols; i += 32)
      _mm512_storeu_si512(o + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(xt + i + 16), _mm512_loadu_ps(xt + i)));
    if (i < cols) {
      const int64_t k = cols - i;
      const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(std::min<int64_t>(k, 16)), xt + i);
      const __m512 hi = k > 16 ? _mm512_maskz_loadu_ps(first_lanes(k - 16), xt + i + 16) : _mm512_setzero_ps();
      _mm512_storeu_si512(o + i, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
  }
}

inline __m512 dpbf16(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }

// A tile's share of the columns, as in the avx512 tier (KSpan there): columns [k0, k1), k0 a multiple of
// 64, k1 == cols in the last block; between blocks the accumulators wait in `state` (exactly), so every
// (row, token) pair runs the dot's arithmetic whatever the blocking.
struct ColSpan {
  int64_t k0, k1;
  bool first, last;
  __m512* state;  // R x T x 2 accumulators between blocks
  // Several tokens, the first token tile: rows up to pf_rows (counted from the tile's first row; the caller's range)
  // have their columns [k0, k1) requested into L2 ~48 KB ahead of the rows being read (bf16_tile_rows).
  int64_t pf_rows = 0;
};

// R rows x T tokens; two accumulators per (row, token): a0 takes columns i..i+31 of each 64-step, a1
// i+32..i+63; then one more 32-step into a0 if there is one, the last cols % 32 (weights masked, the
// activations are zero-padded) into a1, one reduction. R = 3, T = 4: 24 accumulators of 32 zmm (session 20: 7 vector
// loads per 12 vdpbf16ps instead of 2 x 6's 8; docs/perf/cpu.md).
// The activations come packed for the tile: per 64-column step from k0, T x 64 values (token t at
// + t * 64), and in the last block the tail (< 64 values, zero-padded) as T x 64 more. One token's packed
// layout is its converted row (zero-padded to 32), so the dot and decode pass it as it is.
template <int R, int T>
__attribute__((always_inline)) inline void bf16_tile(const uint16_t* w, int64_t ldw, const uint16_t* xp, int64_t cols, float* y, int64_t ldy,
                      ColSpan ks) {
  __m512 acc[R][T][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < 2; ++h) acc[r][t][h] = ks.first ? _mm512_setzero_ps() : ks.state[(r * T + t) * 2 + h];
  int64_t i = ks.k0;
  for (; i + 64 <= ks.k1; i += 64, xp += T * 64) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      __m512i wv[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) wv[r] = _mm512_loadu_si512(w + r * ldw + i + 32 * h);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512i xv = _mm512_loadu_si512(xp + t * 64 + 32 * h);
        asm("" : "+v"(xv));  // one load per activation vector, not one folded into each instruction
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t][h] = dpbf16(acc[r][t][h], wv[r], xv);
      }
    }
  }
  if (!ks.last) {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < 2; ++h) ks.state[(r * T + t) * 2 + h] = acc[r][t][h];
    return;
  }
  __m512 fin[R * T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      __m512 a0 = acc[r][t][0], a1 = acc[r][t][1];
      const uint16_t* wr = w + r * ldw;
      const uint16_t* xt = xp + t * 64 - i;  // the tail's value j at xt + j
      int64_t j = i;
      if (j + 32 <= cols) {
        a0 = dpbf16(a0, _mm512_loadu_si512(wr + j), _mm512_loadu_si512(xt + j));
        j += 32;
      }
      if (j < cols) {
        const __mmask32 m = static_cast<__mmask32>((1u << (cols - j)) - 1u);
        a1 = dpbf16(a1, _mm512_maskz_loadu_epi16(m, wr + j), _mm512_loadu_si512(xt + j));
      }
      fin[r * T + t] = _mm512_add_ps(a0, a1);
    }
  if constexpr (R * T == 1)
    y[0] = tree512::reduce1(fin[0]);
  else
    tree512::reduce_store<T>(fin, R, y, ldy);
}

// bf16_tile over `rows` rows from w (3 at a time, then 2, then 1; row j's outputs at y + j, its parked
// accumulators at ks.state + j * T * 2): one call per row block instead of one per row group.
template <int T>
void bf16_tile_rows(const uint16_t* w, int64_t ldw, int64_t rows, const uint16_t* xp, int64_t cols, float* y,
                    int64_t ldy, ColSpan ks) {
  __m512* const state = ks.state;
  // From DRAM the tile's three interleaved row streams kept too few lines in flight (session 34: 16384 x 2048, one
  // core, 8 tokens 6.5-7.1 ms where the arithmetic takes ~2.9): the rows `ahead` rows on are requested as each group
  // starts (-3%: the rest of that loss is elsewhere).
  const int64_t span = (ks.k1 - ks.k0) * 2, ahead = std::max<int64_t>(3, (48 << 10) / std::max<int64_t>(1, span));
  const auto pf = [&](int64_t r, int64_t n) {
    for (int64_t j = r + ahead; j < std::min(r + ahead + n, ks.pf_rows); ++j)
      prefetch_lines<1>(reinterpret_cast<const uint8_t*>(w + j * ldw + ks.k0), span);
  };
  if (ks.pf_rows > 0)
    for (int64_t j = 0; j < std::min(ahead, ks.pf_rows); ++j)  // the first rows' own lines, then `ahead` on
      prefetch_lines<1>(reinterpret_cast<const uint8_t*>(w + j * ldw + ks.k0), span);
  int64_t r = 0;
  for (; r + 3 <= rows; r += 3) {
    pf(r, 3);
    ks.state = state ? state + r * T * 2 : nullptr;
    bf16_tile<3, T>(w + r * ldw, ldw, xp, cols, y + r, ldy, ks);
  }
  for (; r + 2 <= rows; r += 2) {
    ks.state = state ? state + r * T * 2 : nullptr;
    bf16_tile<2, T>(w + r * ldw, ldw, xp, cols, y + r, ldy, ks);
  }
  if (r < rows) {
    ks.state = state ? state + r * T * 2 : nullptr;
    bf16_tile<1, T>(w + r * ldw, ldw, xp, cols, y + r, ldy, ks);
  }
}

// One token (decode): one row at a time, each read start to end. Zen 4 (session 18, docs/perf/cpu.md
// "Session 18"): the 2-row tile's interleaved streams read BF16 at 76% of the 2-thread read rate (4 rows:
// 85%), one row at a time at 99-106%, as the avx512 tier's exact dot does; the default tier had lost decode to
// llama.cpp there. A row's arithmetic is the tile's whatever R is, so the bits are the dot's.
void bf16_decode_rows(const uint16_t* w, int64_t ldw, int64_t rows, const uint16_t* xp, int64_t cols, float* y) {
  const ColSpan ks{0, cols, true, true, nullptr};
  for (int64_t r = 0; r < rows; ++r) bf16_tile<1, 1>(w + r * ldw, ldw, xp, cols, y + r, 1, ks);
}

template <size_t... T>
constexpr auto bf16_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, float*, int64_t, ColSpan);
  return std::array<Tile, sizeof...(T)>{bf16_tile_rows<static_cast<int>(T) + 1>...};
}

constexpr int64_t kBf16T = 4;
constexpr int64_t kBf16KCols = 2048;     // 4 tokens x 2048 bf16 = 16 KiB of packed activations, a third of L1
constexpr int64_t kBf16StateRows = 128;  // rows parked between column blocks: 96 KiB

// Tokens [0, m) (converted rows ld values apart) x columns [k0, k1) into bf16_tile's layout.
void pack_bf16_tokens(const uint16_t* xb, int64_t ld, int64_t m, int64_t k0, int64_t k1, uint16_t* xp) {
  int64_t i = k0;
  for (; i + 64 <= k1; i += 64)
    for (int64_t t = 0; t < m; ++t, xp += 64) {  // 64 values: two zmm
      _mm512_storeu_si512(xp, _mm512_loadu_si512(xb + t * ld + i));
      _mm512_storeu_si512(xp + 32, _mm512_loadu_si512(xb + t * ld + i + 32));
    }
  if (i < k1)  // the tail: the converted rows are zero-padded to 32, so copy whole 32-value halves
    for (int64_t t = 0; t < m; ++t, xp += 64) {
      _mm512_storeu_si512(xp, _mm512_loadu_si512(xb + t * ld + i));
      _mm512_storeu_si512(xp + 32, k1 - i > 32 ? _mm512_loadu_si512(xb + t * ld + i + 32) : _mm512_setzero_si512());
    }
}

// Rows [r0, r1) x n converted tokens: y[t * ldy + (r - r0)]. Blocks of rows (~512 KiB of weights) stay in
// L2 while every token tile passes over them, one column block at a time (packed, fresh in L1).
void bf16_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint16_t* xb, int64_t n, float* y, int64_t ldy) {
  static constexpr auto tiles = bf16_tiles(std::make_index_sequence<kBf16T>());
  const int64_t cols = W.cols, ldx = bf16_stride(cols);
  const auto* base = static_cast<const uint16_t*>(W.data);
  if (n == 1) {  // one token (decode): its converted row is the packed layout
    bf16_decode_rows(base + r0 * cols, cols, r1 - r0, xb, cols, y);
    return;
  }
  const int64_t kblocks = (cols + kBf16KCols - 1) / kBf16KCols;
  const int64_t block =
      std::clamp<int64_t>((512 << 10) / (cols * 2) / 2 * 2, 2, kblocks > 1 ? kBf16StateRows : 1 << 20);
  __m512 state[kBf16StateRows * kBf16T * 2];
  alignas(64) uint16_t xp[(kBf16KCols / 64 + 1) * kBf16T * 64];
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kBf16T) {
      const int64_t m = std::min(kBf16T, n - t0);
      float* yt = y + t0 * ldy - r0;
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const bool last = kb + 1 == kblocks;
        const int64_t k0 = kb * kBf16KCols, k1 = last ? cols : k0 + kBf16KCols;
        pack_bf16_tokens(xb + t0 * ldx, ldx, m, k0, k1, xp);
        tiles[m - 1](base + b0 * cols, cols, b1 - b0, xp, cols, yt + b0, ldy,
                     {k0, k1, kb == 0, last, kblocks > 1 ? state : nullptr, t0 == 0 && g_tile_prefetch ? r1 - b0 : 0});
      }
    }
  }
}

// ---- MXFP4: int8 activations, vpdpbusd ----

// Layout of one pair of 32-blocks (g0 = 2p, g1 = 2p + 1) of a token, kQ8PairBytes: bytes 0-15 the even
// elements of g0, 16-31 the even elements of g1, 32-47 the odd of g0, 48-63 the odd of g1 (the order in
// which decode_pair finds the nibbles: low nibble = even element), each q + 128 as an unsigned byte;
// then 16 floats, the scale d of each int32 lane, i.e. of each 4 consecutive bytes ("quad": elements
// 8j, 8j+2, 8j+4, 8j+6 or 8j+1, ..., 8j+7 of a block). vpdpbusd sums exactly a quad per int32 lane, so a
// scale per quad costs the kernel nothing over a scale per block and bounds each activation's error by
// max|quad| / 254 instead of max|block| / 254 (an outlier spoils 3 neighbours, not 31). A missing g1
// (cols % 64 == 32) has q = 0 and d = 0.

void q8_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  const int64_t groups = cols / kMxfp4Group, ldq = q8_stride(cols);
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t p = 0; p * 2 < groups; ++p) {
      uint8_t* o = out + t * ldq + p * kQ8PairBytes;
      float* d = reinterpret_cast<float*>(o + 64);
      for (int b = 0; b < 2; ++b) {
        if (2 * p + b < groups) {
          const float* xg = x + t * cols + (2 * p + b) * kMxfp4Group;
          const __m512 v0 = _mm512_loadu_ps(xg), v1 = _mm512_loadu_ps(xg + 16);
          q8::quantise_quads(_mm512_permutex2var_ps(v0, even, v1), o + 16 * b, d + 4 * b);
          q8::quantise_quads(_mm512_permutex2var_ps(v0, odd, v1), o + 32 + 16 * b, d + 8 + 4 * b);
        } else {
          const __m128i zero_q = _mm_set1_epi8(static_cast<char>(0x80));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * b), zero_q);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 32 + 16 * b), zero_q);
          _mm_storeu_ps(d + 4 * b, _mm_setzero_ps());
          _mm_storeu_ps(d + 8 + 4 * b, _mm_setzero_ps());
        }
      }
    }
}

// One pair of groups of a row: w = the 64 weights doubled (int8, -12..12) in q8_tokens' byte order;
// corr = -128 x (sum of each int32 lane's 4 weights), which cancels the +128 of the activation bytes;
// wsc = 0.5 x 2^(e8m0 - 127) per lane's group. `two`: g1 exists (else only g0's 16 bytes are read).
// With kUnsigned: w = the weights + 12 (unsigned) and no corr (the caller's activation-side correction).
template <bool kUnsigned = false>
inline void decode_pair(const uint8_t* packed, const uint8_t* scales, bool two, __m512i& w, __m512i& corr,
                        __m512& wsc) {
  const __m256i b = two ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed))
                        : _mm256_maskz_loadu_epi8(0xFFFFu, packed);
  // Both halves hold the 32 bytes: the low half takes their low nibbles, the high half their high ones.
  w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(nibble_halves_ctrl(), _mm512_broadcast_i64x4(b)),
                              _mm512_broadcast_i32x4(kUnsigned ? e2m1x2_plus12_table() : e2m1x2_table()));
  if constexpr (!kUnsigned)
    corr = _mm512_sub_epi32(_mm512_setzero_si512(),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w));
  wsc = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(simd512::kHalfE8m0[scales[0]]),
                             _mm512_set1_ps(two ? simd512::kHalfE8m0[scales[1]] : 0.f));
}

// decode_pair for ggml's MXFP4 blocks (MXFP4_GGML: {e8m0, qs[16]}, element j = low nibble of qs[j], j + 16 =
// its high nibble): the same w, corr and wsc as decode_pair gives for the same values, so the two layouts
// run identical integer sums (a GGUF's experts give the HF checkpoint's bits in this tier too). A group's
// even elements 0, 2, .., 30 are the low then the high nibbles of its even bytes (odd: odd bytes): one vpermb
// puts a group's even (odd) bytes in two qwords, one for their low nibbles and one for their high ones, and
// vpmultishiftqb takes each qword's nibbles as decode_pair's do.
template <bool kUnsigned = false>
inline void decode_pair_ggml(const uint8_t* blocks, bool two, __m512i& w, __m512i& corr, __m512& wsc) {
  const __m512i src = _mm512_maskz_loadu_epi8(two ? (uint64_t{1} << 34) - 1 : (uint64_t{1} << 17) - 1, blocks);
  // qword k: g0's even bytes (qs[2i] at 1 + 2i) for k = 0, 1; g1's (18 + 2i) for 2, 3; the odd bytes for 4 - 7
  const __m512i gather = _mm512_set_epi64(0x211F1D1B19171513LL, 0x211F1D1B19171513LL, 0x100E0C0A08060402LL, 0x100E0C0A08060402LL,
                                          0x201E1C1A18161412LL, 0x201E1C1A18161412LL, 0x0F0D0B0907050301LL, 0x0F0D0B0907050301LL);
  // even qwords: the low nibbles (bit 8i), odd ones: the high nibbles (8i + 4)
  const __m512i ctrl = _mm512_set_epi64(0x3C342C241C140C04LL, 0x3830282018100800LL, 0x3C342C241C140C04LL, 0x3830282018100800LL,
                                        0x3C342C241C140C04LL, 0x3830282018100800LL, 0x3C342C241C140C04LL, 0x3830282018100800LL);
  w = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(ctrl, _mm512_permutexvar_epi8(gather, src)),
                              _mm512_broadcast_i32x4(kUnsigned ? e2m1x2_plus12_table() : e2m1x2_table()));
  if constexpr (!kUnsigned)
    corr = _mm512_sub_epi32(_mm512_setzero_si512(),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(static_cast<char>(0x80)), w));
  wsc = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(simd512::kHalfE8m0[blocks[0]]),
                             _mm512_set1_ps(two ? simd512::kHalfE8m0[blocks[17]] : 0.f));
}

// One row x T tokens over the pairs [p0, p1) of a token tile packed pair by pair (pair p of token t at
// xq + (p - p0) * T * kQ8PairBytes + t * kQ8PairBytes: one base pointer and constant offsets, where 12
// token pointers had spilled accumulators to the stack; with one token that is the plain converted
// row). Per pair of groups and token, the exact int32 quad sums (vpdpbusd), times the activation scales
// (fp32 product), then one fma by the weight scales into the token's accumulator. The activation scale
// comes first so that a denormal weight scale (e8m0 0 or 1) rounds only once. Between column blocks the
// accumulators wait in `state` (exactly), so the per-token arithmetic is the dot's whatever the blocking.
struct PairSpan {
  int64_t p0, p1;
  bool first, last;
  __m512* state;  // T accumulators between blocks (mxfp4_q8_tile_rows: the row block's, T per row)
  // Several tokens: the same pairs of the next row block's rows (data at pf + r * row data bytes, HF scales at
  // pf_scales + r * row scale bytes, r < pf_rows) are requested into L2 while this block computes.
  const uint8_t* pf = nullptr;
  const uint8_t* pf_scales = nullptr;
  int64_t pf_rows = 0;
};

template <WeightFormat F, int T>
__attribute__((always_inline)) inline void mxfp4_q8_tile(const uint8_t* packed, const uint8_t* scales, int64_t groups, const uint8_t* xq,
                                                         __m512* fin, PairSpan ps) {
  __m512 acc[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) acc[t] = ps.first ? _mm512_setzero_ps() : ps.state[t];
  for (int64_t p = ps.p0; p < ps.p1; ++p, xq += T * kQ8PairBytes) {
    __m512i w, corr;
    __m512 wsc;
    if constexpr (F == WeightFormat::MXFP4_GGML)
      decode_pair_ggml(packed + 34 * p, 2 * p + 1 < groups, w, corr, wsc);
    else
      decode_pair(packed + 32 * p, scales + 2 * p, 2 * p + 1 < groups, w, corr, wsc);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const uint8_t* q = xq + t * kQ8PairBytes;
      const __m512i dp = _mm512_dpbusd_epi32(corr, _mm512_loadu_si512(q), w);
      const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dp), _mm512_loadu_ps(reinterpret_cast<const float*>(q + 64)));
      acc[t] = _mm512_fmadd_ps(f, wsc, acc[t]);
    }
  }
  __m512* out = ps.last ? fin : ps.state;  // finished: the caller reduces (tree512::reduce_store)
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

// mxfp4_q8_tile over rows [r0, r1) of W (row r's outputs at y + (r - r0), its parked accumulators at
// ps.state + (r - r0) * T): one call per row block instead of one per row, whose call, stack-passed span
// and pointer set-up were ~2% of a kl-1b prefill. Each row runs the same tile.
template <WeightFormat F, int T>
void mxfp4_q8_tile_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, float* y, int64_t ldy,
                        PairSpan ps) {
  __m512* const state = ps.state;  // the block's: row r's at state + (r - r0) * T
  const int64_t groups = W.cols / kMxfp4Group, data_bytes = row_data_bytes(W.format, W.cols),
                scale_bytes = row_scale_bytes(W.format, W.cols);
  const uint8_t* data = W.row_data(r0);
  const uint8_t* scales = W.scales ? W.row_scales(r0) : nullptr;
  constexpr int G = T == 1 ? 16 : 4;  // rows whose finished accumulators are reduced together
  __m512 fin[G * T];
  for (int64_t g0 = 0; g0 < r1 - r0; g0 += G) {
    const int nr = static_cast<int>(std::min<int64_t>(G, r1 - r0 - g0));
    for (int64_t r = g0; r < g0 + nr; ++r) {
      if (r < ps.pf_rows) {
        constexpr int64_t kPairBytes = F == WeightFormat::MXFP4_GGML ? 34 : 32;
        prefetch_lines<1>(ps.pf + r * data_bytes + ps.p0 * kPairBytes, (ps.p1 - ps.p0) * kPairBytes);
        if (ps.pf_scales) prefetch_lines<1>(ps.pf_scales + r * scale_bytes + 2 * ps.p0, 2 * (ps.p1 - ps.p0));
      }
      ps.state = state ? state + r * T : nullptr;
      mxfp4_q8_tile<F, T>(data + r * data_bytes, scales ? scales + r * scale_bytes : nullptr, groups, xq,
                          fin + (r - g0) * T, ps);
    }
    if (ps.last) tree512::reduce_store<T>(fin, nr, y + g0, ldy);
  }
}

// One token (decode) over rows [r0, r1), the operands swapped on vpdpbusd: weights + 12 unsigned, activations
// signed (the stored q + 128 with its top bit flipped), and the correction -12 x (each lane's 4 activations)
// computed ONCE per call for all rows, where the tile above pays a vpdpbusd and a subtraction per pair of every
// row for -128 x (the lane's 4 weights). Both give each lane exactly sum(q w) in int32, so the outputs are the
// tile's bits; per pair of a row two of ~11 vector instructions fewer (a few percent from L2 / L3 alone; the rows
// side by side and the prefetch below carry the gain from DRAM, docs/perf/cpu.md session 25). Up to kOneTokenMaxPairs
// pairs (16384 columns); wider rows take the tile.
constexpr int64_t kOneTokenMaxPairs = 256;
template <WeightFormat F, int PF>
void mxfp4_one_token_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, float* y, int64_t ldy) {
  const int64_t kAhead = g_one_token_prefetch.bytes;
  const int64_t groups = W.cols / kMxfp4Group, pairs = (groups + 1) / 2, data_bytes = row_data_bytes(W.format, W.cols),
                scale_bytes = row_scale_bytes(W.format, W.cols);
  alignas(64) __m512i xs[kOneTokenMaxPairs], corr[kOneTokenMaxPairs];
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80)), twelve = _mm512_set1_epi8(12);
  for (int64_t p = 0; p < pairs; ++p) {
    xs[p] = _mm512_xor_si512(_mm512_loadu_si512(xq + p * kQ8PairBytes), flip);
    corr[p] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), twelve, xs[p]));
  }
  const uint8_t* data = W.row_data(r0);
  const uint8_t* scales = W.scales ? W.row_scales(r0) : nullptr;
  PrefetchCursor<PF> pf_data{reinterpret_cast<uintptr_t>(data) & ~uintptr_t{63}};
  PrefetchCursor<PF> pf_scales{reinterpret_cast<uintptr_t>(scales) & ~uintptr_t{63}};
  __m512 fin[16];
  for (int64_t g0 = 0; g0 < r1 - r0; g0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, r1 - r0 - g0));
    // kRows rows side by side: each row's accumulation is a chain of dependent FMAs (one per pair), so rows
    // interleave to keep the vector ports busy; a row's own arithmetic is unchanged.
    constexpr int kRows = 4;
    constexpr int64_t kPairBytes = F == WeightFormat::MXFP4_GGML ? 34 : 32;
    // M rows side by side, M a constant: with a run-time count (an early exit in the unrolled row loop) GCC kept the
    // accumulators on the stack, a load and a store around every FMA (perf annotate, session 41).
    auto row_group = [&]<int M>(int64_t r) {
      __m512 acc[M];
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps();
      for (int64_t p = 0; p < pairs; ++p) {
        const __m512 xsc = _mm512_loadu_ps(reinterpret_cast<const float*>(xq + p * kQ8PairBytes + 64));
        // The block's rows are one stream, read kRows rows side by side: after pair p the reading front is about
        // kRows pairs into the group; every line up to kAhead bytes past it is requested, each line once (cursors
        // over the data and the scales). From DRAM one core's 4 row streams alone kept too few lines in flight
        // (one token, 8 of 512 kl-1b-sized experts, 2 threads: 15.4 -> 21.4 GB/s with a prefetch of whole rows
        // ahead; KernelBench.DISABLED_MoeDecodeLayer, session 25). Prefetches never fault: lines past the block or
        // the matrix cost only the request.
        if constexpr (PF != 3) {
          const int64_t front = r * data_bytes + kRows * kPairBytes * (p + 1);
          pf_data.upto(reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(front + kAhead));
          if (scales) pf_scales.upto(reinterpret_cast<uintptr_t>(scales) + static_cast<uintptr_t>(r * scale_bytes + 2 * kRows * (p + 1) + kAhead / 16));
        }
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          const uint8_t* packed = data + (r + i) * data_bytes;
          __m512i w, unused;
          __m512 wsc;
          if constexpr (F == WeightFormat::MXFP4_GGML)
            decode_pair_ggml<true>(packed + 34 * p, 2 * p + 1 < groups, w, unused, wsc);
          else
            decode_pair<true>(packed + 32 * p, scales + (r + i) * scale_bytes + 2 * p, 2 * p + 1 < groups, w, unused, wsc);
          const __m512i dp = _mm512_dpbusd_epi32(corr[p], w, xs[p]);
          acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), xsc), wsc, acc[i]);
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) fin[r - g0 + i] = acc[i];
    };
    for (int64_t r = g0; r < g0 + nr; r += kRows) {
      switch (std::min<int64_t>(kRows, g0 + nr - r)) {
        case 4: row_group.template operator()<4>(r); break;
        case 3: row_group.template operator()<3>(r); break;
        case 2: row_group.template operator()<2>(r); break;
        default: row_group.template operator()<1>(r); break;
      }
    }
    tree512::reduce_store<1>(fin, nr, y + g0, ldy);
  }
}

template <WeightFormat F, size_t... T>
constexpr auto mxfp4_q8_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const WeightMatrix&, int64_t, int64_t, const uint8_t*, float*, int64_t, PairSpan);
  return std::array<Tile, sizeof...(T)>{mxfp4_q8_tile_rows<F, static_cast<int>(T) + 1>...};
}

constexpr int64_t kMxfp4T = 12;  // 12 accumulators + weights, correction, scales, temporaries
// Pairs per column block: 12 tokens x 16 pairs x 128 bytes = 24 KiB of packed activations, half of L1.
constexpr int64_t kQ8BlockPairs = 16;
constexpr int64_t kQ8StateRows = 64;  // rows whose accumulators wait between blocks: 48 KiB

template <WeightFormat F>
void mxfp4_rows_of(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t n, float* y, int64_t ldy) {
  static constexpr auto tiles = mxfp4_q8_tiles<F>(std::make_index_sequence<kMxfp4T>());
  const int64_t cols = W.cols, ldq = q8_stride(cols), groups = cols / kMxfp4Group, pairs = (groups + 1) / 2;
  if (n == 1) {  // one token (decode): its converted row is the packed layout, nothing to block or copy
    if (pairs <= kOneTokenMaxPairs && one_token_swapped()) {
      switch (g_one_token_prefetch.hint) {
        case 1: return mxfp4_one_token_rows<F, 1>(W, r0, r1, xq, y, ldy);
        case 2: return mxfp4_one_token_rows<F, 2>(W, r0, r1, xq, y, ldy);
        case 3: return mxfp4_one_token_rows<F, 3>(W, r0, r1, xq, y, ldy);
        default: return mxfp4_one_token_rows<F, 0>(W, r0, r1, xq, y, ldy);
      }
    }
    tiles[0](W, r0, r1, xq, y, ldy, {0, pairs, true, true, nullptr});
    return;
  }
  const int64_t block =
      std::clamp<int64_t>((256 << 10) / std::max<int64_t>(1, row_data_bytes(W.format, cols)), 1, kQ8StateRows);
  const int64_t kblocks = (pairs + kQ8BlockPairs - 1) / kQ8BlockPairs;
  __m512 state[kQ8StateRows * kMxfp4T];
  alignas(64) uint8_t xp[kMxfp4T * kQ8BlockPairs * kQ8PairBytes];
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kMxfp4T) {
      const int64_t m = std::min(kMxfp4T, n - t0);
      const auto tile = tiles[m - 1];
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t p0 = kb * kQ8BlockPairs, p1 = std::min(pairs, p0 + kQ8BlockPairs);
        // One token's packed layout is its converted row itself (no copy).
        const uint8_t* xt = m == 1 ? xq + t0 * ldq + p0 * kQ8PairBytes : xp;
        uint8_t* o = xp;
        for (int64_t p = p0; p < p1 && m > 1; ++p)
          for (int64_t t = 0; t < m; ++t, o += kQ8PairBytes) {
            const uint8_t* src = xq + (t0 + t) * ldq + p * kQ8PairBytes;
            _mm512_storeu_si512(o, _mm512_loadu_si512(src));
            _mm512_storeu_si512(o + 64, _mm512_loadu_si512(src + 64));
          }
        // As the K-quant tiles (weight_kernels_quant_vnni.cpp q8_rows): the first token tile requests the next row
        // block's pairs as it goes.
        const bool pf = t0 == 0 && b1 < r1 && g_tile_prefetch;
        if (t0 == 0 && b0 == r0 && g_tile_prefetch) {  // the first block: no block before it asked for its rows
          constexpr int64_t kPairBytes = F == WeightFormat::MXFP4_GGML ? 34 : 32;
          for (int64_t r = b0; r < b1; ++r) {
            prefetch_lines<1>(W.row_data(r) + p0 * kPairBytes, (p1 - p0) * kPairBytes);
            if (W.scales) prefetch_lines<1>(W.row_scales(r) + 2 * p0, 2 * (p1 - p0));
          }
        }
        tile(W, b0, b1, xt, y + t0 * ldy + (b0 - r0), ldy,
             {p0, p1, kb == 0, kb + 1 == kblocks, state, pf ? W.row_data(b1) : nullptr,
              pf && W.scales ? W.row_scales(b1) : nullptr, pf ? std::min(block, r1 - b1) : 0});
      }
    }
  }
}

void mxfp4_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t n, float* y, int64_t ldy) {
  mxfp4_rows_of<WeightFormat::MXFP4>(W, r0, r1, xq, n, y, ldy);
}
void mxfp4_ggml_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t n, float* y, int64_t ldy) {
  mxfp4_rows_of<WeightFormat::MXFP4_GGML>(W, r0, r1, xq, n, y, ldy);
}

}  // namespace

}  // namespace k3::cpu

K3_AVX512BF16_END

// ---- plain code: the Paths (act_convert_path.h builds the RowKernels entries) ----

namespace k3::cpu {

namespace {

// One tier format: how a token is converted (Prep, stride in bytes) and how rows run on converted tokens.
struct Bf16Path {
  static int64_t stride_bytes(int64_t cols) { return bf16_stride(cols) * 2; }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) {
    bf16_round_tokens(x, n, cols, reinterpret_cast<uint16_t*>(out));
  }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    bf16_rows(W, r0, r1, reinterpret_cast<const uint16_t*>(act), n, y, ldy);
  }
};
struct Mxfp4Path {
  static int64_t stride_bytes(int64_t cols) { return q8_stride(cols); }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) { q8_tokens(x, n, cols, out); }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    mxfp4_rows(W, r0, r1, act, n, y, ldy);
  }
};
struct Mxfp4GgmlPath : Mxfp4Path {
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    mxfp4_ggml_rows(W, r0, r1, act, n, y, ldy);
  }
};

}  // namespace

const RowKernels* avx512bf16_row_kernels(WeightFormat f) {
  // Dequant stays avx512's (exact widening; nothing to gain from the new instructions).
  static const RowKernels bf16 = act_path::kernels<Bf16Path>(*avx512_row_kernels(WeightFormat::BF16));
  static const RowKernels mxfp4 = act_path::kernels<Mxfp4Path>(*avx512_row_kernels(WeightFormat::MXFP4));
  static const RowKernels mxfp4_ggml = act_path::kernels<Mxfp4GgmlPath>(*avx512_row_kernels(WeightFormat::MXFP4_GGML));
  switch (f) {
    case WeightFormat::BF16: return &bf16;
    case WeightFormat::MXFP4: return &mxfp4;
    case WeightFormat::MXFP4_GGML: return &mxfp4_ggml;
    default: return nullptr;
  }
}

}  // namespace k3::cpu
