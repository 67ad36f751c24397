// The avx512bf16 tier's kernels of GGUF's block formats (Q8_0 and the other 32-element formats without a min, the
// K formats, IQ4_XS, the codebook i-quants): int8 weights x int8 activations with vpdpbusd (AVX512_VNNI), the
// activations converted once per matmul call (act_convert_path.h), as llama.cpp's CPU backend does (its
// vec_dot_*_q8_K / q8_0).
// Like the tier's MXFP4 kernels the products are NOT the exact fp32 products (docs/perf/cpu.md):
//
// - Activations: int8 with one fp32 scale per QUAD of 4 consecutive values (the 4 bytes one vpdpbusd lane
//   sums; q8_quads_simd.h): d = max|x| / 127 rounded up, q = round(x / d), |d q - x| <= d/2 (1 + 2^-16).
//   llama.cpp keeps one scale per 256 (Q8_K) or per 32 (Q8_0) and applies the weights' sub-scales in
//   int16/int32; here every int32 lane is scaled in fp32 anyway (the sub-scales differ per 16 or 32 lanes),
//   so a scale per quad costs the kernel nothing, and an outlier coarsens 3 neighbours instead of 255.
// - Weights: each block's decoder (quant_decode_simd.h, the exact tiers' decoders) hands 32 int8 quants
//   with their fp32 sub-scale and sub-min per 16 values (value = dl * q - ml); two such halves make one
//   64-value chunk: w (int8) and wsc (dl per lane). Q4_K, Q5_K, Q6_K, Q3_K, Q2_K and IQ4_XS have their own
//   decoders here (a block's sub-scales and mins in one vector instead of scalar code per 16 or 32).
// - Per (row, token, chunk): one vpdpbusd (the exact int32 quad sums q_x . q_w), int -> float, times the
//   quads' d (fp32) = f; a 256-block's four chunks summed as (f0 dl0 + f1 dl1) + (f2 dl2 + f3 dl3) (lanes),
//   for formats with sub-mins (Q4_K, Q5_K, Q2_K) minus the 16 ml times the fp32 sums of the UNROUNDED
//   activations over each 16 values (computed once per token in prepare; so the min part carries no
//   activation rounding at all), then added to the token's 16-lane accumulator; Q8_0 and the codebook
//   i-quants: one fma of f by the lane sub-scales per chunk. One reduction per (row, token) at the end.
// - Weight quants: Q4_K, Q5_K, Q2_K's are unsigned (0..31) and go in vpdpbusd's u8 operand against plain
//   int8 activations; the other formats' are signed and meet q + 128 bytes, the offset cancelled by
//   starting the int32 sum at -128 x (sum of each lane's 4 quants), computed once per row and tile. One token of
//   the pair formats (pair_one_token_rows, BiasedAcc1; Q8_0 at rows of up to 4 blocks) moves the offset to the
//   weights instead: w + 128 against q, the sum started at -128 x each quad's sum of q, computed once per call --
//   the same int32.
// - One token: the rows' 16-lane accumulators are summed 16 rows at a time (reduce_tree512.h: the tree and bits
//   of _mm512_reduce_add_ps).
//
// Batch invariance (weight_kernels.h): a token is converted by the same code whatever n is, and each
// (row, token) pair runs the same operations in the same order in every tile size (T = 1 is the dot);
// column blocks park the accumulators exactly. A NaN / inf activation poisons its quad's d (NaN output).
//
// Only the functions between K3_AVX512BF16_BEGIN/END are compiled for the tier; the drivers are plain code.
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/backend/cpu/kquant_act_order.h"
#include "k3/backend/cpu/prefetch_cursor.h"
#include "k3/backend/cpu/weight_kernels_avx512bf16.h"
#include "k3/backend/cpu/weight_kernels_quant.h"
#include "k3/backend/cpu/weight_simd512.h"
#include "k3/core/dtype.h"
#include "k3/core/format_dispatch.h"
#include "k3/core/weight_format.h"
#include "k3/quant/iq_tables.h"

namespace k3::cpu {

namespace {

// The converted activations of one token, unit by unit. A unit is 64 values (the pair formats: one pair of their
// 32-blocks; the last pair of a row of odd block count has q = 0, d = 0 in its second half) or 256
// (the K and i-quant formats' blocks). Per 64 values ("chunk"): 64 bytes in natural order, q + 128 (for
// formats with signed quants) or q (unsigned_quants), then the 16 quads' scales (fp32); a 256-unit adds
// the 16 fp32 sums of each 16 unrounded activations.
constexpr int64_t kChunkBytes = 128;
constexpr int64_t kUnit256Bytes = 4 * kChunkBytes + 64;

// The 32-element formats without a min (Q8_0, and llama-quantize's fallbacks for rows that are not whole 256-blocks:
// Q5_0, Q4_0, IQ4_NL): a unit is a pair of their blocks, decoded by the exact decoders into signed int8 quants.
constexpr bool is_pair_format(WeightFormat f) {
  return f == WeightFormat::Q8_0 || f == WeightFormat::Q5_0 || f == WeightFormat::Q4_0 || f == WeightFormat::IQ4_NL;
}
constexpr int64_t kQuantPrefetchBytes = 4096;  // the one-token prefetch distance (K3_QUANT_PREFETCH; read_quant_prefetch)
constexpr int kQuantPrefetchHint = 1;          // its cache level: _MM_HINT_T1 (K3_QUANT_PREFETCH_HINT)
constexpr int64_t unit_elems(WeightFormat f) { return is_pair_format(f) ? 64 : 256; }
constexpr int64_t unit_bytes(WeightFormat f) { return is_pair_format(f) ? kChunkBytes : kUnit256Bytes; }
// The weight bytes of one unit (a pair of 32-element blocks, or one 256-element block).
constexpr int64_t unit_weight_bytes(WeightFormat f) { return weight_layout(f).block_bytes * (is_pair_format(f) ? 2 : 1); }
constexpr int64_t units(WeightFormat f, int64_t cols) { return (cols + unit_elems(f) - 1) / unit_elems(f); }
// The codebook i-quants whose units take BiasedAcc1 for one token (unit_iq2xxs and after).
constexpr bool is_biased_iq(WeightFormat f) {
  return f == WeightFormat::IQ2_XXS || f == WeightFormat::IQ3_XXS || f == WeightFormat::IQ2_XS || f == WeightFormat::IQ3_S;
}
// Formats whose values carry a sub-min (value = dl q - ml).
constexpr bool has_min(WeightFormat f) {
  return f == WeightFormat::Q4_K || f == WeightFormat::Q5_K || f == WeightFormat::Q2_K;
}
// Formats whose quants are unsigned (vpdpbusd's u8 operand against plain int8 activations: no offset to
// cancel); the others' are signed and meet q + 128.
constexpr bool unsigned_quants(WeightFormat f) { return has_min(f); }

// The tables of the IQ2_XXS / IQ2_XS / IQ3_XXS / IQ3_S units (unit_iq2xxs and after, below): built at start, outside
// the tier's target region, so on every CPU.
struct IqCodeTables {
  alignas(64) uint16_t iq2[256];     // IQ2_XXS row -> value i's level index in bits [2 i, 2 i + 2)
  alignas(64) uint16_t iq3[256];     // IQ3_XXS row (4 values) -> value i's level index in bits [3 i, 3 i + 3)
  alignas(64) uint16_t iq2xs[512];   // IQ2_XS row -> as iq2
  alignas(64) uint16_t iq3s[512];    // IQ3_S row -> as iq3
  alignas(64) int8_t iq2_level[64];  // a byte's low 2 bits -> that level's value (vpermb reads the low 6 bits)
  alignas(64) int8_t iq3_level[64];  // low 3 bits -> value
  alignas(64) int8_t iq2xs_level[64];  // as iq2_level (the same 3 values)
  alignas(64) int8_t iq3s_level[64];   // as iq3_level (IQ3_S's own 8 values)
  alignas(64) uint8_t sign[128];     // 7-bit sign code -> sign byte: quant::kIq2Signs, 64-byte aligned for vpermi2b
  // The signed levels of IQ2_XXS / IQ3_XXS (iq_signed_chunk): index bits [0, kBits) a level code, bit kBits the sign
  // (1: negated); vpermb reads the low 6 bits, so the table repeats every 2^(kBits + 1) entries. _b: the same + 128
  // (mod 256), the weights of BiasedAcc1 (w + 128 against q).
  alignas(64) int8_t iq2_signed[64], iq2_signed_b[64];
  alignas(64) int8_t iq3_signed[64], iq3_signed_b[64];
  // The levels + 128 of IQ2_XS / IQ3_S (their chunks negate by 0 - x, which maps 128 + l to 128 - l mod 256 too).
  alignas(64) int8_t iq2xs_level_b[64], iq3s_level_b[64];
  // iq2 split into its words' low and high bytes (unit2_iq2xxs: 64 rows a vpermi2b, against 32 a vpermt2w).
  alignas(64) uint8_t iq2_lo[256], iq2_hi[256];
  alignas(64) uint8_t iq3_lo[256], iq3_hi[256];  // iq3 the same way (unit_iq3xxs: a block's 64 rows at once)
};

// levels (index: a code in the low `bits`, the sign in bit `bits`) -> value (+ 128 when biased), repeated to 64 entries.
void signed_levels(const int8_t* level_of, int bits, bool biased, int8_t* out) {
  for (int e = 0; e < 64; ++e) {
    const int v = (e >> bits & 1 ? -1 : 1) * level_of[e % (1 << bits)] + (biased ? 128 : 0);
    out[e] = static_cast<int8_t>(static_cast<uint8_t>(v));
  }
}

// Each of the `rows` rows of a grid (`bytes` values a row) as level indices (`bits` each) into the grid's sorted
// distinct values, which `level_of` receives (index e -> value of e's low `bits`). The grids are fixed tables: more distinct values than the bits hold cannot happen, and is
// checked (abort) once at start rather than assumed.
template <class Row>
void code_grid(const Row* grid, int rows, int bytes, int bits, uint16_t* codes, int8_t* level_of) {
  uint8_t lv[8];
  int nl = 0;
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < bytes; ++i) {
      const uint8_t v = static_cast<uint8_t>(grid[r] >> (8 * i));
      if (std::find(lv, lv + nl, v) != lv + nl) continue;
      if (nl == (1 << bits)) {
        std::fprintf(stderr, "k3: an i-quant grid has more than %d levels\n", 1 << bits);
        std::abort();
      }
      lv[nl++] = v;
    }
  std::sort(lv, lv + nl);
  for (int r = 0; r < rows; ++r) {
    uint16_t c = 0;
    for (int i = 0; i < bytes; ++i)
      c |= static_cast<uint16_t>((std::find(lv, lv + nl, static_cast<uint8_t>(grid[r] >> (8 * i))) - lv) << (bits * i));
    codes[r] = c;
  }
  for (int e = 0; e < 64; ++e) level_of[e] = static_cast<int8_t>(lv[std::min(e % (1 << bits), nl - 1)]);
}

IqCodeTables make_iq_code_tables() {
  IqCodeTables t{};
  code_grid(quant::kIq2xxsGrid, 256, 8, 2, t.iq2, t.iq2_level);
  code_grid(quant::kIq3xxsGrid, 256, 4, 3, t.iq3, t.iq3_level);
  code_grid(quant::kIq2xsGrid, 512, 8, 2, t.iq2xs, t.iq2xs_level);
  code_grid(quant::kIq3sGrid, 512, 4, 3, t.iq3s, t.iq3s_level);
  std::copy(quant::kIq2Signs, quant::kIq2Signs + 128, t.sign);
  for (int r = 0; r < 256; ++r) {
    t.iq2_lo[r] = static_cast<uint8_t>(t.iq2[r]), t.iq2_hi[r] = static_cast<uint8_t>(t.iq2[r] >> 8);
    t.iq3_lo[r] = static_cast<uint8_t>(t.iq3[r]), t.iq3_hi[r] = static_cast<uint8_t>(t.iq3[r] >> 8);
  }
  signed_levels(t.iq2_level, 2, false, t.iq2_signed);
  signed_levels(t.iq2_level, 2, true, t.iq2_signed_b);
  signed_levels(t.iq3_level, 3, false, t.iq3_signed);
  signed_levels(t.iq3_level, 3, true, t.iq3_signed_b);
  for (int e = 0; e < 64; ++e) {
    t.iq2xs_level_b[e] = static_cast<int8_t>(static_cast<uint8_t>(t.iq2xs_level[e] + 128));
    t.iq3s_level_b[e] = static_cast<int8_t>(static_cast<uint8_t>(t.iq3s_level[e] + 128));
  }
  return t;
}
const IqCodeTables g_iq_codes = make_iq_code_tables();

// Byte-shuffle controls built at compile time (vpermb / vpermw / vpmultishiftqb operands).
struct IqControls {
  alignas(64) uint16_t iq2_pick[4][32];  // chunk c: qword j's low word <- row word 8 c + j
  alignas(64) uint16_t iq3_pick[2][32];  // chunk k of a 32-row half: qword j's words 0, 1 <- row words 16 k + 2 j, + 1
  alignas(64) uint8_t shift2[64];      // byte i of a qword <- bits [2 i, ...)
  alignas(64) uint8_t shift3[64];      // byte i <- bits [3 i, ...) (i < 4), [16 + 3 (i - 4), ...) (i >= 4)
  alignas(64) uint8_t sign_spread_w[4][64];  // the same from sign bytes one per word (IQ2_XS: group k's at byte 2 k)
  alignas(64) uint8_t bit_of[64];      // byte 8 j + i: 1 << i
  alignas(64) uint8_t aux_codes[64];   // qword: bytes 0..3 <- bits [32 + 7 k, ...) (IQ2_XXS's aux word in the high half)
  // IQ2_XXS / IQ3_XXS (iq_signed_chunk, session 51): a chunk's 8 groups of 8 values are its qwords j = 0..7, so the
  // rows are looked up with group j of every chunk in qword j, and one vpmultishiftqb per chunk spreads its codes (one
  // more its sign bits) -- no vpermw per chunk.
  alignas(64) uint8_t iq2_rows_t[64];    // IQ2_XXS: word 4 j + c <- grid byte of group 8 c + j (byte 8 (2c + j/4) + j%4)
  alignas(64) uint8_t code_shift2[4][64];  // chunk c: byte 8 j + i <- bits [16 c + 2 i, ...) of qword j
  alignas(64) uint8_t code_shift3[2][64];  // chunk k of a half: byte i <- bits [32 k + 3 i, ...), [32 k + 16 + 3 (i-4), ...)
  alignas(64) uint8_t sign_shift2[4][64];  // chunk c: byte 8 j + i <- bit i of byte c of qword j at bit 2
  alignas(64) uint8_t sign_shift3[4][64];  // the same at bit 3
  alignas(64) uint8_t sign_t2[64];       // IQ2_XXS: byte 8 j + c <- sign byte of group 8 c + j (byte 8 (2c + j/4) + j%4)
  alignas(64) uint8_t sign_t3[64];       // IQ3_XXS: byte 8 j + c <- byte 8 c + j
  alignas(64) uint8_t aux3_codes[64];    // qword c: byte j <- bits [7 j, ...) (j < 4), [32 + 7 (j - 4), ...)
  // unit2_iq2xxs: byte 16 m + 8 h + t <- grid byte of group (8 c + j) of block h (j = 2 m + t / 4, c = t % 4), so that
  // vpunpcklbw / vpunpckhbw of the looked-up low and high bytes give each block's codes in iq2_rows_t's word order.
  alignas(64) uint8_t iq2_rows_2[64];
  // unit_iq3xxs: byte 16 m + 8 h + t <- grid byte 32 h + 16 k + 2 j + e of the block's 64, so that half h's codes
  // have word w = 8 m + t = 4 j + 2 k + e <- row 2 j + e of the half's chunk k (code_shift3's order).
  alignas(64) uint8_t iq3_rows_2[64];
  constexpr IqControls()
      : iq2_pick(), iq3_pick(), shift2(), shift3(), sign_spread_w(), bit_of(), aux_codes(), iq2_rows_t(), code_shift2(),
        code_shift3(), sign_shift2(), sign_shift3(), sign_t2(), sign_t3(), aux3_codes(), iq2_rows_2(), iq3_rows_2() {
    for (int w = 0; w < 32; ++w) {
      const int j = w / 4, c = w % 4;
      iq2_rows_t[2 * w] = static_cast<uint8_t>(8 * (2 * c + j / 4) + j % 4);
    }
    for (int b = 0; b < 64; ++b) {
      const int i = b % 8, j = b / 8;
      for (int c = 0; c < 4; ++c) {
        code_shift2[c][b] = static_cast<uint8_t>(16 * c + 2 * i);
        sign_shift2[c][b] = static_cast<uint8_t>((8 * c + i - 2 + 64) % 64);
        sign_shift3[c][b] = static_cast<uint8_t>((8 * c + i - 3 + 64) % 64);
      }
      for (int k = 0; k < 2; ++k) code_shift3[k][b] = static_cast<uint8_t>(32 * k + (i < 4 ? 3 * i : 16 + 3 * (i - 4)));
      const int c = i % 4;  // bytes 4..7 of a qword repeat 0..3 (unread)
      sign_t2[b] = static_cast<uint8_t>(8 * (2 * c + j / 4) + j % 4);
      sign_t3[b] = static_cast<uint8_t>(8 * c + j);
      aux3_codes[b] = static_cast<uint8_t>(i < 4 ? 7 * i : 32 + 7 * (i - 4));
      const int m = b / 16, h = b / 8 % 2, t = b % 8, jj = 2 * m + t / 4, cc = t % 4;
      iq2_rows_2[b] = static_cast<uint8_t>(64 * h + 8 * (2 * cc + jj / 4) + jj % 4);
      const int w = 8 * m + t;
      iq3_rows_2[b] = static_cast<uint8_t>(32 * h + 16 * (w % 4 / 2) + 2 * (w / 4) + w % 2);
    }
    for (int c = 0; c < 4; ++c)
      for (int w = 0; w < 32; ++w) iq2_pick[c][w] = static_cast<uint16_t>(8 * c + w / 4);
    for (int k = 0; k < 2; ++k)
      for (int w = 0; w < 32; ++w) iq3_pick[k][w] = static_cast<uint16_t>(16 * k + 2 * (w / 4) + (w % 4 == 1 ? 1 : 0));
    for (int b = 0; b < 64; ++b) {
      const int i = b % 8, j = b / 8;
      shift2[b] = static_cast<uint8_t>(2 * i);
      shift3[b] = static_cast<uint8_t>(i < 4 ? 3 * i : 16 + 3 * (i - 4));
      bit_of[b] = static_cast<uint8_t>(1 << i);
      for (int c = 0; c < 4; ++c) sign_spread_w[c][b] = static_cast<uint8_t>(2 * (8 * c + j));
      aux_codes[b] = static_cast<uint8_t>(32 + 7 * (i % 4));
    }
  }
};
inline constexpr IqControls kIqCtl{};

// The pair units of Q5_0 / Q4_0 / IQ4_NL (unit_nibble_pair): a pair of blocks (bb bytes each, the quants at qs in
// each) loaded as one vector z; the controls move and shift its bytes into a chunk's 64 values in natural order.
struct NibblePairControls {
  alignas(64) uint8_t quants[64];  // byte 16 L + j <- quant byte j of block L / 2 (lanes 0, 1: the first block)
  alignas(64) uint8_t shift[64];   // vpmultishiftqb: lanes 0, 2 keep the low nibbles, lanes 1, 3 take the high ones
  alignas(64) uint8_t fifth[64];   // Q5_0: byte p <- byte (p % 32) / 8 of its block's fifth bits (bit p % 8 is p's)
  alignas(64) int8_t q4_0[64], q5_0[64];  // vpermb tables (index: the low 6 bits): nibble i & 15 -> i - 8, i - 16
  alignas(64) uint8_t q4_0b[64], q5_0b[64];  // the same + 128 (BiasedAcc1)
  alignas(32) uint16_t d[16];                // vpermw: lanes 0-7 <- the first block's f16 d (word 0), 8-15 the second's
  constexpr NibblePairControls(int bb, int qs) : quants(), shift(), fifth(), q4_0(), q5_0(), q4_0b(), q5_0b(), d() {
    for (int p = 0; p < 64; ++p) {
      const int block = p / 32, lane = p / 16;
      quants[p] = static_cast<uint8_t>(block * bb + qs + p % 16);
      shift[p] = static_cast<uint8_t>(8 * (p % 8) + (lane % 2 ? 4 : 0));
      fifth[p] = static_cast<uint8_t>(block * bb + 2 + p % 32 / 8);
      q4_0[p] = static_cast<int8_t>(p % 16 - 8);
      q5_0[p] = static_cast<int8_t>(p % 16 - 16);
      q4_0b[p] = static_cast<uint8_t>(p % 16 - 8 + 128);
      q5_0b[p] = static_cast<uint8_t>(p % 16 - 16 + 128);
    }
    for (int k = 0; k < 16; ++k) d[k] = static_cast<uint16_t>(k < 8 ? 0 : bb / 2);
  }
};
inline constexpr NibblePairControls kQ5_0Pair{22, 6}, kQ4Pair{18, 2};  // Q4_0 and IQ4_NL share their layout

// The one-token pair rows' copy of their token (pair_one_token_rows), per thread, 64-byte aligned, grown to the widest
// row. Here, outside the tier's target region: a std::vector instantiated inside it would be AVX-512 code that the
// linker may pick for every file's copy.
uint8_t* biased_token_scratch(int64_t bytes) {
  thread_local std::vector<uint8_t> buf;
  if (buf.size() < static_cast<size_t>(bytes) + 64) buf.resize(static_cast<size_t>(bytes) + 64);
  return buf.data() + (-reinterpret_cast<uintptr_t>(buf.data()) & 63);
}

}  // namespace

}  // namespace k3::cpu

K3_AVX512BF16_BEGIN

// Inside the target region: the static inline decoders and the quad quantiser are compiled for the tier
// in this file only.
#include "k3/backend/cpu/q8_quads_simd.h"
#include "k3/backend/cpu/quant_decode_simd.h"
#include "k3/backend/cpu/reduce_tree512.h"

namespace k3::cpu {

namespace {

// ---- activations ----

// Tokens of a 256-unit format: per unit 4 chunks of quads, then the 16 sums of 16 (fp32, each the same
// 16-lane reduction whatever n; natural order). kOffset: the bytes are q + 128 (weights signed), else q (weights
// unsigned). kNibblePairs: kquant_group_src's Q4_K order (kquant_act_order.h).
template <bool kOffset, bool kNibblePairs = false>
void q8k_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  const int64_t nu = cols / 256;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t u = 0; u < nu; ++u) {
      const float* xu = x + t * cols + u * 256;
      uint8_t* o = out + (t * nu + u) * kUnit256Bytes;
      for (int c = 0; c < 4; ++c)
        for (int k = 0; k < 4; ++k)
          q8::quantise_quads<kOffset>(_mm512_loadu_ps(xu + kquant_group_src<kNibblePairs>(c, k)), o + kChunkBytes * c + 16 * k,
                                      reinterpret_cast<float*>(o + kChunkBytes * c + 64) + 4 * k);
      float* sums = reinterpret_cast<float*>(o + 4 * kChunkBytes);
      for (int k = 0; k < 16; ++k) sums[k] = _mm512_reduce_add_ps(_mm512_loadu_ps(xu + 16 * k));
    }
}

// Tokens of the pair formats (cols a multiple of 32): chunks of 64, a missing second half as q = 0, d = 0.
void pair_tokens(const float* x, int64_t n, int64_t cols, uint8_t* out) {
  const int64_t nu = units(WeightFormat::Q8_0, cols);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t u = 0; u < nu; ++u) {
      uint8_t* o = out + (t * nu + u) * kChunkBytes;
      float* d = reinterpret_cast<float*>(o + 64);
      for (int k = 0; k < 4; ++k) {
        const int64_t i = u * 64 + 16 * k;
        if (i < cols) {
          q8::quantise_quads(_mm512_loadu_ps(x + t * cols + i), o + 16 * k, d + 4 * k);
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 16 * k), _mm_set1_epi8(static_cast<char>(0x80)));
          _mm_storeu_ps(d + 4 * k, _mm_setzero_ps());
        }
      }
    }
}

// ---- weights x activations ----

// The accumulators of one row x T tokens over one unit's activations (token t at xq + t * UB).
// kSigned: the weights are signed and the activation bytes q + 128 (vpdpbusd is u8 x s8: corr cancels the
// offset); else the weights are unsigned (0..63) and go in vpdpbusd's unsigned operand against q itself.
template <int T, int64_t UB, bool kSigned>
struct Q8Acc {
  __m512 acc[T];
  const uint8_t* xq;

  // Values [64 c, 64 c + 64) of the unit: w their quants, wsc the sub-scale of each lane.
  __attribute__((always_inline)) void chunk(int c, __m512i w, __m512 wsc) {
    __m512i corr = _mm512_setzero_si512();
    if constexpr (kSigned)
      corr = _mm512_sub_epi32(corr, _mm512_dpbusd_epi32(corr, _mm512_set1_epi8(static_cast<char>(0x80)), w));
    const uint8_t* q = xq + c * kChunkBytes;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512i x = _mm512_loadu_si512(q + t * UB);
      const __m512i dp = kSigned ? _mm512_dpbusd_epi32(corr, x, w) : _mm512_dpbusd_epi32(corr, w, x);
      const __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(dp), _mm512_loadu_ps(reinterpret_cast<const float*>(q + t * UB + 64)));
      acc[t] = _mm512_fmadd_ps(f, wsc, acc[t]);
    }
  }

  // One 256-unit: its 4 chunks (w, lane sub-scales wsc) and, kMins, the sub-mins of each 16 values. Per
  // token the chunks' products are summed as a tree, (f0 wsc0 + f1 wsc1) + (f2 wsc2 + f3 wsc3) - ml . sums,
  // then added to acc: one dependent add per unit instead of a chain of five fmas (decode, one token, is
  // latency-bound on that chain).
  template <bool kMins>
  __attribute__((always_inline)) void unit(const __m512i w[4], const __m512 wsc[4], __m512 ml16) {
    __m512i corr[4];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      corr[c] = _mm512_setzero_si512();
      if constexpr (kSigned)
        corr[c] = _mm512_sub_epi32(corr[c], _mm512_dpbusd_epi32(corr[c], _mm512_set1_epi8(static_cast<char>(0x80)), w[c]));
    }
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const uint8_t* q = xq + t * UB;
      __m512 f[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i x = _mm512_loadu_si512(q + c * kChunkBytes);
        const __m512i dp = kSigned ? _mm512_dpbusd_epi32(corr[c], x, w[c]) : _mm512_dpbusd_epi32(corr[c], w[c], x);
        f[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(dp), _mm512_loadu_ps(reinterpret_cast<const float*>(q + c * kChunkBytes + 64)));
      }
      __m512 u = _mm512_add_ps(_mm512_fmadd_ps(f[1], wsc[1], _mm512_mul_ps(f[0], wsc[0])),
                               _mm512_fmadd_ps(f[3], wsc[3], _mm512_mul_ps(f[2], wsc[2])));
      if constexpr (kMins) u = _mm512_fnmadd_ps(ml16, _mm512_loadu_ps(reinterpret_cast<const float*>(q + 4 * kChunkBytes)), u);
      acc[t] = _mm512_add_ps(acc[t], u);
    }
  }
};

// One token of a pair format (pair_one_token_rows) with the +128 offset moved from the activations to the weights:
// the token's chunks hold q (int8), the quads' d and -128 x each quad's sum of q (int32; kBiasedChunkBytes a chunk),
// and vpdpbusd(-128 sum q, w + 128, q) = sum w q is the int32 that Q8Acc gets from vpdpbusd(-128 sum w, q + 128, w)
// -- without Q8Acc's per-row correction (a vpdpbusd and a subtraction in every chunk's dependency chain). Then the
// same int -> float, times d, fma by the lane scales: the same bits. chunk() takes signed quants (the Q8Sink
// decoders, Q8_0's pair unit), chunk_biased() quants + 128 (unit_nibble_pair's tables hold the offset).
// kLoad64: unit_nibble_pair may load 64 bytes at the pair (past it: the rows after it in the same matrix).
constexpr int64_t kBiasedChunkBytes = 192;
template <bool kWhole64>
struct BiasedAcc1 {
  static constexpr bool kBiased = true, kLoad64 = kWhole64;
  __m512 acc[1];
  const uint8_t* xq;

  // Chunk c of the unit at xq (a pair unit has one; the 256-units of the codebook i-quants four).
  __attribute__((always_inline)) void chunk_biased(int c, __m512i wb, __m512 wsc) {
    const uint8_t* q = xq + c * kBiasedChunkBytes;
    const __m512i dp = _mm512_dpbusd_epi32(_mm512_load_si512(q + 128), wb, _mm512_load_si512(q));
    acc[0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dp), _mm512_load_ps(reinterpret_cast<const float*>(q + 64))), wsc, acc[0]);
  }
  __attribute__((always_inline)) void chunk(int c, __m512i w, __m512 wsc) {
    chunk_biased(c, _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))), wsc);
  }
};

// Whether Acc takes the weights + 128 (BiasedAcc1: one token), and chunk c's weights into it either way: `wb` are the
// signed weights, or the weights + 128 (mod 256) where the accumulator is biased -- the unit's tables chose which.
template <class Acc>
constexpr bool kBiasedAcc = requires { Acc::kBiased; };
template <class Acc>
__attribute__((always_inline)) inline void add_chunk(Acc& a, int c, __m512i wb, __m512 wsc) {
  if constexpr (kBiasedAcc<Acc>)
    a.chunk_biased(c, wb, wsc);
  else
    a.chunk(c, wb, wsc);
}

// The token's chunks (q + 128, then the quads' d: the pair formats' layout, pair_tokens, or the 256-units', q8k_tokens,
// whose 16 sums after every 4 chunks BiasedAcc1 does not read) into BiasedAcc1's; nu units of `per_unit` chunks each.
void bias_token(const uint8_t* xq, int64_t nu, uint8_t* out, int per_unit = 1, int64_t unit_stride = kChunkBytes) {
  for (int64_t u = 0; u < nu; ++u)
    for (int c = 0; c < per_unit; ++c) {
      const uint8_t* x = xq + u * unit_stride + c * kChunkBytes;
      const __m512i q = _mm512_xor_si512(_mm512_loadu_si512(x), _mm512_set1_epi8(static_cast<char>(0x80)));
      const __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), q);
      uint8_t* o = out + (u * per_unit + c) * kBiasedChunkBytes;
      _mm512_store_si512(o, q);
      _mm512_store_si512(o + 64, _mm512_loadu_si512(x + 64));
      _mm512_store_si512(o + 128, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
    }
}

// Lane scales of a chunk from per-group scales: group g's scale in lanes [16 / k x g, ...) (k groups).
inline __m512 lanes_of(__m512 scales, int first, int per_lane_group) {
  // per_lane_group 8: lanes 0-7 scales[first], 8-15 scales[first + 1]; 4: four groups of 4 lanes.
  const __m512i idx = per_lane_group == 8
                          ? _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1))
                          : _mm512_add_epi32(_mm512_set1_epi32(first), _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
  return _mm512_permutexvar_ps(idx, scales);
}

inline __m256i nibbles_lo(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline __m256i bits_at(__m256i v, int s, int mask) {
  return _mm256_and_si256(_mm256_srli_epi16(v, s), _mm256_set1_epi8(static_cast<char>(mask)));
}
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// mul x each of the 8 bytes of v (as fp32), in lanes 0-7.
inline __m512 scaled_bytes8(uint64_t v, float mul) {
  return _mm512_castps256_ps512(
      _mm256_mul_ps(_mm256_set1_ps(mul), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(v))))));
}

// Q4_K / Q5_K: the 8 sub-scales d sc_j and sub-mins dmin m_j (the exact decoders' products, quant::k4_scale_min's
// fields: j < 4 from the low 6 bits of bytes j, j + 4; j >= 4 the nibbles of byte j + 4 and the top 2 bits of
// bytes j - 4, j), all 8 at once; the quants 0..15 (0..31) go unsigned into vpdpbusd.
template <WeightFormat F, class Acc>
__attribute__((always_inline)) inline void unit_q45k(const uint8_t* b, Acc& a) {
  uint32_t s[3];
  std::memcpy(s, b + 4, 12);
  const uint64_t sc = (s[0] & 0x3f3f3f3fu) | uint64_t((s[2] & 0x0f0f0f0fu) | (((s[0] >> 6) & 0x03030303u) << 4)) << 32;
  const uint64_t mn = (s[1] & 0x3f3f3f3fu) | uint64_t(((s[2] >> 4) & 0x0f0f0f0fu) | (((s[1] >> 6) & 0x03030303u) << 4)) << 32;
  const __m512 dl = scaled_bytes8(sc, qsimd::f16_at(b)), ml = scaled_bytes8(mn, qsimd::f16_at(b + 2));
  constexpr int kQs = F == WeightFormat::Q4_K ? 16 : 48;
  [[maybe_unused]] __m256i qh;
  if constexpr (F == WeightFormat::Q5_K) qh = qsimd::load32(b + 16);
  __m512i w[4];
  __m512 wsc[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m256i q = qsimd::load32(b + kQs + 32 * c);
    __m256i lo = nibbles_lo(q), hi = bits_at(q, 4, 0x0F);
    if constexpr (F == WeightFormat::Q5_K) {
      lo = _mm256_or_si256(lo, _mm256_slli_epi16(bits_at(qh, 2 * c, 1), 4));
      hi = _mm256_or_si256(hi, _mm256_slli_epi16(bits_at(qh, 2 * c + 1, 1), 4));
    }
    w[c] = join(lo, hi);
    wsc[c] = lanes_of(dl, 2 * c, 8);
  }
  a.template unit<true>(w, wsc, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), ml));
}

// Q4_K over the nibble-pair activation layout (kquant_group_src): one 64-byte load per two chunks, the low and
// high nibbles each a whole chunk (no half re-joining); chunk c's lanes 0-7 belong to sub-block {0, 1, 4, 5}[c],
// lanes 8-15 to that + 2. Same sub-scale / sub-min arithmetic as unit_q45k.
template <class Acc>
__attribute__((always_inline)) inline void unit_q4k(const uint8_t* b, Acc& a) {
  uint32_t s[3];
  std::memcpy(s, b + 4, 12);
  const uint64_t sc = (s[0] & 0x3f3f3f3fu) | uint64_t((s[2] & 0x0f0f0f0fu) | (((s[0] >> 6) & 0x03030303u) << 4)) << 32;
  const uint64_t mn = (s[1] & 0x3f3f3f3fu) | uint64_t(((s[2] >> 4) & 0x0f0f0f0fu) | (((s[1] >> 6) & 0x03030303u) << 4)) << 32;
  const __m512 dl = scaled_bytes8(sc, qsimd::f16_at(b)), ml = scaled_bytes8(mn, qsimd::f16_at(b + 2));
  const __m512i nib = _mm512_set1_epi8(0x0F);
  const __m512i q0 = _mm512_loadu_si512(b + 16), q1 = _mm512_loadu_si512(b + 80);
  const __m512i w[4] = {_mm512_and_si512(q0, nib), _mm512_and_si512(_mm512_srli_epi16(q0, 4), nib), _mm512_and_si512(q1, nib),
                        _mm512_and_si512(_mm512_srli_epi16(q1, 4), nib)};
  const __m512i lanes8 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512 wsc[4] = {_mm512_permutexvar_ps(lanes8, dl), _mm512_permutexvar_ps(_mm512_add_epi32(lanes8, _mm512_set1_epi32(1)), dl),
                         _mm512_permutexvar_ps(_mm512_add_epi32(lanes8, _mm512_set1_epi32(4)), dl),
                         _mm512_permutexvar_ps(_mm512_add_epi32(lanes8, _mm512_set1_epi32(5)), dl)};
  a.template unit<true>(w, wsc, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7), ml));
}

// Q2_K: 16 sub-scales (low nibbles) and sub-mins (high nibbles) of each 16 values; quants 0..3 unsigned.
template <class Acc>
__attribute__((always_inline)) inline void unit_q2k(const uint8_t* b, Acc& a) {
  const __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
  const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(qsimd::f16_at(b + 80)), _mm512_cvtepi32_ps(_mm512_and_si512(s, _mm512_set1_epi32(15))));
  const __m512 ml = _mm512_mul_ps(_mm512_set1_ps(qsimd::f16_at(b + 82)), _mm512_cvtepi32_ps(_mm512_srli_epi32(s, 4)));
  __m512i w[4];
  __m512 wsc[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {  // values 64 c ..: byte group h = c / 2, bit pairs 2k, 2k + 2 (k = 2 (c % 2))
    const __m256i q = qsimd::load32(b + 16 + 32 * (c / 2));
    const int k = 2 * (c % 2);
    w[c] = join(bits_at(q, 2 * k, 3), bits_at(q, 2 * k + 2, 3));
    wsc[c] = lanes_of(dl, 4 * c, 4);
  }
  a.template unit<true>(w, wsc, ml);
}

// Q6_K: 16 int8 sub-scales of each 16 values; quants - 32 signed. Half h (128 values) = ql bytes [64 h, 64 h + 64)
// (low 4 bits: values 128 h + [0, 64) in the low nibbles, + [64, 128) in the high ones) and qh bytes [32 h, 32 h + 32)
// (bit pairs 0, 1, 2, 3 of byte l: values l, l + 32, l + 64, l + 96). One 64-byte load of ql is a whole chunk's low
// bits per nibble; qh, broadcast to both 256-bit halves, is shifted per half (srlv) to its bit pair.
template <class Acc>
__attribute__((always_inline)) inline void unit_q6k(const uint8_t* b, Acc& a) {
  const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(qsimd::f16_at(b + 208)),
                                  _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)))));
  const __m512i nib = _mm512_set1_epi8(0x0F), pair = _mm512_set1_epi8(3), m32 = _mm512_set1_epi8(32);
  // per 16-bit lane: shift 0 in the low 256-bit half, 2 in the high (chunk 2 h); 4 / 6 (chunk 2 h + 1)
  const __m512i sh_lo = _mm512_setr_epi64(0, 0, 0, 0, 0x0002000200020002LL, 0x0002000200020002LL, 0x0002000200020002LL,
                                          0x0002000200020002LL);
  const __m512i sh_hi = _mm512_add_epi16(sh_lo, _mm512_set1_epi16(4));
  __m512i w[4];
  __m512 wsc[4];
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(b + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(qsimd::load32(b + 128 + 32 * h));
    const __m512i hl = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_lo), pair), 4);
    const __m512i hh = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh_hi), pair), 4);
    w[2 * h] = _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(ql, nib), hl), m32);
    w[2 * h + 1] = _mm512_sub_epi8(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nib), hh), m32);
    wsc[2 * h] = lanes_of(dl, 8 * h, 4), wsc[2 * h + 1] = lanes_of(dl, 8 * h + 4, 4);
  }
  a.template unit<false>(w, wsc, _mm512_setzero_ps());
}

// Q3_K: 16 6-bit sub-scales (quant::q3_k_scale: low 4 bits from the nibbles of bytes 0-7, high 2 bits from
// bit pair i / 4 of byte 8 + i % 4), minus 32, all 16 at once; quants (low 2 bits | 4 x hmask bit) - 4, signed.
template <class Acc>
__attribute__((always_inline)) inline void unit_q3k(const uint8_t* b, Acc& a) {
  uint64_t lo4;
  uint32_t hi2;
  std::memcpy(&lo4, b + 96, 8);
  std::memcpy(&hi2, b + 104, 4);
  constexpr uint64_t kNib = 0x0F0F0F0F0F0F0F0FULL;
  constexpr uint32_t kPair = 0x03030303u;
  const uint64_t h0 = (hi2 & kPair) | uint64_t((hi2 >> 2) & kPair) << 32, h1 = ((hi2 >> 4) & kPair) | uint64_t((hi2 >> 6) & kPair) << 32;
  const __m128i sc = _mm_set_epi64x(static_cast<long long>(((lo4 >> 4) & kNib) | (h1 << 4)), static_cast<long long>((lo4 & kNib) | (h0 << 4)));
  const __m512 dl = _mm512_mul_ps(_mm512_set1_ps(qsimd::f16_at(b + 108)),
                                  _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_cvtepu8_epi32(sc), _mm512_set1_epi32(32))));
  const __m256i hm = qsimd::load32(b);
  __m512i w[4];
  __m512 wsc[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {  // values 64 c ..: quant bytes h = c / 2, bit pairs k, k + 1 (k = 2 (c % 2))
    const int h = c / 2, k = 2 * (c % 2);
    const __m256i q = qsimd::load32(b + 32 + 32 * h);
    __m256i v[2];
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j)
      v[j] = _mm256_sub_epi8(_mm256_or_si256(bits_at(q, 2 * (k + j), 3), _mm256_slli_epi16(bits_at(hm, 4 * h + k + j, 1), 2)),
                             _mm256_set1_epi8(4));
    w[c] = join(v[0], v[1]);
    wsc[c] = lanes_of(dl, 4 * c, 4);
  }
  a.template unit<false>(w, wsc, _mm512_setzero_ps());
}

// IQ4_XS: 8 6-bit sub-scales (low 4 bits: nibble ib % 2 of byte 4 + ib / 2; high 2 bits: bit pair ib of the
// u16 at 2) minus 32, all 8 at once; quants: the IQ4_NL levels (signed) of the nibbles, one byte shuffle.
template <class Acc>
__attribute__((always_inline)) inline void unit_iq4xs(const uint8_t* b, Acc& a) {
  uint32_t lo;
  std::memcpy(&lo, b + 4, 4);
  const __m128i l = _mm_cvtsi32_si128(static_cast<int>(lo));
  const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(l, _mm_set1_epi8(0x0F)), _mm_and_si128(_mm_srli_epi16(l, 4), _mm_set1_epi8(0x0F)));
  const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(b[2] | (b[3] << 8)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                      _mm256_set1_epi32(3));
  const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(_mm256_cvtepu8_epi32(nib), _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
  const __m512 dl = _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(qsimd::f16_at(b)), _mm256_cvtepi32_ps(ls)));
  const __m512i levels = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues)));
  __m512i w[4];
  __m512 wsc[4];
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    // Sub-blocks 2c, 2c + 1: 16 bytes each, low nibbles their values 0-15, high nibbles 16-31.
    const __m512i q = _mm512_castsi256_si512(qsimd::load32(b + 8 + 32 * c));
    const __m512i src = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(1, 1, 0, 0));
    const __m512i n = _mm512_and_si512(_mm512_srlv_epi64(src, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0F));
    w[c] = _mm512_shuffle_epi8(levels, n);
    wsc[c] = lanes_of(dl, 2 * c, 8);
  }
  a.template unit<false>(w, wsc, _mm512_setzero_ps());
}

// ---- the codebook i-quants IQ2_XXS, IQ2_XS, IQ3_XXS, IQ3_S, decoded in registers ----
//
// Every byte of ggml's IQ2_XXS / IQ2_XS grids is one of 3 levels and every byte of IQ3_XXS's / IQ3_S's one of 8, so a
// grid row is a 16-bit word of level codes (8 x 2 bits; 4 x 3 bits) and 256 rows are 512 bytes: 8 zmm registers (512
// rows: 16). A unit looks up 32 rows at once (lookup32: 4 vpermt2w and 3 blends; 512 rows: 8 and 7) instead of 32
// scalar loads and inserts, and spreads each 8-value group's codes over its 8 bytes with one vpmultishiftqb and one
// vpermb (code -> level). The 7-bit sign codes go through one vpermi2b (their 128 sign bytes, ggml's parity rule) and become a byte mask per chunk
// (vptestmb); the 4-bit sub-scales are converted in one vector. The same int8 weights and lane scales go to the
// same chunk() calls in the same order as the decoders' path: the same bits (session 43; session 42's units took
// ~45 instructions and 16 scalar table loads per 64 values, 3.4 GB/s a thread for IQ2_XXS).
// Session 51 (one token 1.45-1.6x a thread, same bits): IQ2_XXS / IQ3_XXS look their rows up in chunk-interleaved order
// (no vpermw per chunk) and fold the sign into the level vpermb's index (iq_signed_chunk); one token takes BiasedAcc1
// (no per-chunk correction: all four formats); IQ3_XXS's 64 rows and two IQ2_XXS blocks' come from byte tables at once
// (lookup64). Tried and dropped (docs/perf/cpu.md, session 51): masks from memory (kmovq), scales by broadcast loads,
// two rows interleaved, vpshufbitqmb or a GFNI bit transpose for the signs (+4%: not worth a new CPU requirement).

inline __m512i load64(const void* p) { return _mm512_load_si512(p); }

// The 32 code words of the rows idx (32 words, each 0..255) of a 256-row code table.
__attribute__((always_inline)) inline __m512i lookup32(const uint16_t* table, __m512i idx) {
  const __m512i r0 = _mm512_permutex2var_epi16(load64(table), idx, load64(table + 32));
  const __m512i r1 = _mm512_permutex2var_epi16(load64(table + 64), idx, load64(table + 96));
  const __m512i r2 = _mm512_permutex2var_epi16(load64(table + 128), idx, load64(table + 160));
  const __m512i r3 = _mm512_permutex2var_epi16(load64(table + 192), idx, load64(table + 224));
  const __mmask32 b6 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(64)), b7 = _mm512_test_epi16_mask(idx, _mm512_set1_epi16(128));
  return _mm512_mask_blend_epi16(b7, _mm512_mask_blend_epi16(b6, r0, r1), _mm512_mask_blend_epi16(b6, r2, r3));
}

// The code words of the 64 rows idx (bytes) of a 256-row code table split into its low and high bytes (lo, hi): 4
// vpermi2b, 2 blends, 2 unpacks. Out: the words of rows idx[16 m + t] (w0) and idx[16 m + 8 + t] (w1) at word 8 m + t.
__attribute__((always_inline)) inline void lookup64(const uint8_t* lo, const uint8_t* hi, __m512i idx, __m512i& w0, __m512i& w1) {
  const __mmask64 high = _mm512_movepi8_mask(idx);  // rows 128..255
  const __m512i l = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(load64(lo), idx, load64(lo + 64)),
                                           _mm512_permutex2var_epi8(load64(lo + 128), idx, load64(lo + 192)));
  const __m512i h = _mm512_mask_blend_epi8(high, _mm512_permutex2var_epi8(load64(hi), idx, load64(hi + 64)),
                                           _mm512_permutex2var_epi8(load64(hi + 128), idx, load64(hi + 192)));
  w0 = _mm512_unpacklo_epi8(l, h), w1 = _mm512_unpackhi_epi8(l, h);
}

// The same for a 512-row table (idx 0..511): 8 vpermt2w, 7 blends.
__attribute__((always_inline)) inline __m512i lookup32_of512(const uint16_t* table, __m512i idx) {
  const __m512i lo = lookup32(table, idx), hi = lookup32(table + 256, idx);  // rows idx % 256 of each half
  return _mm512_mask_blend_epi16(_mm512_test_epi16_mask(idx, _mm512_set1_epi16(256)), lo, hi);
}

// The sign bytes of 8 sub-blocks: qword ib's bits [shift, shift + 28) hold sub-block ib's 4 sign codes
// (`ctl`: kIqCtl.aux_codes); qword ib's bytes 0..3 get the 4 groups' sign bytes.
__attribute__((always_inline)) inline __m512i sign_bytes(__m512i aux, const uint8_t* ctl) {
  return _mm512_permutex2var_epi8(load64(g_iq_codes.sign), _mm512_multishift_epi64_epi8(load64(ctl), aux), load64(g_iq_codes.sign + 64));
}

// Chunk c of IQ2_XXS / IQ3_XXS (kBits: 2, 3) into accumulator chunk ac: qword j of `codes` holds the level codes of
// the chunk's group j where code_ctl's vpmultishiftqb picks them (no vpermw per chunk), qword j of `signs` its sign byte
// at byte c. The sign bit goes to bit kBits of each byte's index (a second vpmultishiftqb, a vpternlogd select), and one
// vpermb through the signed levels makes the weights -- 4 instructions where the level vpermb, the sign-byte vpermb,
// vptestmb and the masked negation took 5 (and the vpermw 6). Biased accumulators (one token) get the levels + 128.
template <int kBits, class Acc>
__attribute__((always_inline)) inline void iq_signed_chunk(Acc& a, int ac, int c, __m512i codes, const uint8_t* code_ctl, __m512i signs,
                                                          __m512 scales, int step, int lane0 = 0) {
  constexpr bool kBiased = kBiasedAcc<Acc>;
  const int8_t* table = kBits == 2 ? (kBiased ? g_iq_codes.iq2_signed_b : g_iq_codes.iq2_signed)
                                   : (kBiased ? g_iq_codes.iq3_signed_b : g_iq_codes.iq3_signed);
  const __m512i code = _mm512_multishift_epi64_epi8(load64(code_ctl), codes);
  const __m512i sign = _mm512_multishift_epi64_epi8(load64(kBits == 2 ? kIqCtl.sign_shift2[c] : kIqCtl.sign_shift3[c]), signs);
  const __m512i idx = _mm512_ternarylogic_epi32(code, sign, _mm512_set1_epi8(1 << kBits), 0xD8);  // c ? sign : code
  const __m512i w = _mm512_permutexvar_epi8(idx, load64(table));
  // sub-block ib's scale in lane lane0 + step x ib of `scales`; lanes 0-7 of the chunk take sub-block 2c's, 8-15 2c + 1's
  const __m512 wsc = _mm512_permutexvar_ps(_mm512_add_epi32(_mm512_set1_epi32(lane0 + 2 * c * step), _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, step, step, step, step, step, step, step, step)), scales);
  add_chunk(a, ac, w, wsc);
}

// IQ2_XXS, one block: 2 bytes d, then per sub-block ib of 32 values 4 grid bytes (8-value rows) and an aux word
// (4 x 7-bit sign codes, 4-bit scale in bits 28-31); value = d (0.5 + s) / 4 x level x sign. The 32 rows are looked up
// in chunk-interleaved order (word 4 j + c: group j of chunk c; `codes`) and the sign bytes transposed likewise (byte
// 8 j + c). kC0: the block's first chunk in the accumulators' unit (4: the second block of unit2_iq2xxs); sub-block
// ib's scale in lane kLane0 + 2 ib of `scales`.
template <int kC0, int kLane0, class Acc>
__attribute__((always_inline)) inline void iq2xxs_chunks(__m512i v, __m512i codes, __m512 scales, Acc& a) {
  const __m512i signs = _mm512_permutexvar_epi8(load64(kIqCtl.sign_t2), sign_bytes(v, kIqCtl.aux_codes));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) iq_signed_chunk<2>(a, kC0 + c, c, codes, kIqCtl.code_shift2[c], signs, scales, 2, kLane0);
}

// The sub-scales d (0.5 + s) / 4 of the 4-bit s in each dword (unit_iq2xxs: the aux words' top bits shifted down
// their qwords, in lane 2 ib: no vpmovqd to narrow them).
__attribute__((always_inline)) inline __m512 iq2xxs_scales(__m512i s4, __m512 d) {
  const __m512 s = _mm512_cvtepi32_ps(s4);
  return _mm512_mul_ps(_mm512_mul_ps(d, _mm512_add_ps(_mm512_set1_ps(0.5f), s)), _mm512_set1_ps(0.25f));
}

template <class Acc>
__attribute__((always_inline)) inline void unit_iq2xxs(const uint8_t* b, Acc& a) {
  const __m512i v = _mm512_loadu_si512(b + 2);  // qword ib: grid bytes (low half), aux word (high half)
  iq2xxs_chunks<0, 0>(v, lookup32(g_iq_codes.iq2, _mm512_maskz_permutexvar_epi8(0x5555555555555555ULL, load64(kIqCtl.iq2_rows_t), v)),
                      iq2xxs_scales(_mm512_srli_epi64(v, 60), _mm512_set1_ps(qsimd::f16_at(b))), a);
}

// Two consecutive IQ2_XXS blocks of a row (one token: BiasedAcc1, whose chunks 4..7 are the second block's): their 64
// rows looked up at once in byte tables -- 4 vpermi2b, 2 blends and 2 unpacks for both, where lookup32 takes 4
// vpermt2w, 3 blends and 2 tests (and 4 register copies) per block. The same codes, so the same chunks as unit_iq2xxs.
template <class Acc>
__attribute__((always_inline)) inline void unit2_iq2xxs(const uint8_t* b, Acc& a) {
  constexpr int64_t BB = weight_layout(WeightFormat::IQ2_XXS).block_bytes;
  const __m512i v0 = _mm512_loadu_si512(b + 2), v1 = _mm512_loadu_si512(b + BB + 2);
  __m512i c0, c1;
  lookup64(g_iq_codes.iq2_lo, g_iq_codes.iq2_hi, _mm512_permutex2var_epi8(v0, load64(kIqCtl.iq2_rows_2), v1), c0, c1);
  // Both blocks' scales in one vector: the first's in the even lanes, the second's (its aux words moved up 32 bits) in
  // the odd ones, against d0, d1 alternating (the same products lane by lane).
  uint16_t d0, d1;
  std::memcpy(&d0, b, 2);
  std::memcpy(&d1, b + BB, 2);
  const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi32(static_cast<int>(d0 | uint32_t{d1} << 16)));
  const __m512i both = _mm512_ternarylogic_epi64(_mm512_srli_epi64(v0, 60), _mm512_srli_epi64(v1, 28), _mm512_set1_epi64(int64_t{15} << 32), 0xF8);
  const __m512 scales = iq2xxs_scales(both, d);
  iq2xxs_chunks<0, 0>(v0, c0, scales, a);
  iq2xxs_chunks<4, 1>(v1, c1, scales, a);
}

// IQ2_XS, one block: 2 bytes d, 32 u16 (an 8-value group's grid row in bits 0-8, its 7-bit sign code in 9-15), then
// 8 scale bytes (4 bits per 16 values, low nibble first); value = d (0.5 + s) / 4 x level x sign.
template <class Acc>
__attribute__((always_inline)) inline void unit_iq2xs(const uint8_t* b, Acc& a) {
  constexpr bool kBiased = kBiasedAcc<Acc>;  // one token: the levels + 128 (BiasedAcc1)
  const __m512i q = _mm512_loadu_si512(b + 2);
  const __m512i codes = lookup32_of512(g_iq_codes.iq2xs, _mm512_and_si512(q, _mm512_set1_epi16(511)));
  const __m512i signs = _mm512_permutex2var_epi8(load64(g_iq_codes.sign), _mm512_srli_epi16(q, 9), load64(g_iq_codes.sign + 64));
  const __m128i sb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 66));
  const __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(sb, _mm_set1_epi8(0x0F)), _mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(0x0F)));
  const __m512 s = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(nib));
  const __m512 dl = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(qsimd::f16_at(b)), _mm512_add_ps(_mm512_set1_ps(0.5f), s)), _mm512_set1_ps(0.25f));
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i rows = _mm512_permutexvar_epi16(load64(kIqCtl.iq2_pick[c]), codes);
    const __m512i mag = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(load64(kIqCtl.shift2), rows), load64(kBiased ? g_iq_codes.iq2xs_level_b : g_iq_codes.iq2xs_level));
    const __mmask64 neg = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(load64(kIqCtl.sign_spread_w[c]), signs), load64(kIqCtl.bit_of));
    // biased: 0 - (128 + l) = 128 - l
    add_chunk(a, c, _mm512_mask_sub_epi8(mag, neg, _mm512_setzero_si512(), mag), lanes_of(dl, 4 * c, 4));
  }
}

// IQ3_XXS, one block: 2 bytes d, 64 grid bytes (4-value rows; sub-block ib's 8 at 8 ib), then 8 aux words as
// IQ2_XXS's (value = d (0.5 + s) / 2 x level x sign). The aux words as they lie: qword c holds chunk c's two, so one
// vpmultishiftqb makes its 8 sign codes (byte 8 c + j), transposed after the sign lookup to byte 8 j + c; each half's
// 32 rows are looked up chunk-interleaved (word 4 j + 2 k + e: row 2 j + e of chunk k of the half).
template <class Acc>
__attribute__((always_inline)) inline void unit_iq3xxs(const uint8_t* b, Acc& a) {
  const __m256i aux = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 66));
  const __m512i sidx = _mm512_multishift_epi64_epi8(load64(kIqCtl.aux3_codes), _mm512_castsi256_si512(aux));
  const __m512i signs = _mm512_permutexvar_epi8(load64(kIqCtl.sign_t3), _mm512_permutex2var_epi8(load64(g_iq_codes.sign), sidx, load64(g_iq_codes.sign + 64)));
  const __m256 s = _mm256_cvtepi32_ps(_mm256_srli_epi32(aux, 28));
  const __m256 scales = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(qsimd::f16_at(b)), _mm256_add_ps(_mm256_set1_ps(0.5f), s)), _mm256_set1_ps(0.5f));
  __m512i codes2[2];  // half h: the rows of chunks 2h, 2h + 1
  lookup64(g_iq_codes.iq3_lo, g_iq_codes.iq3_hi, _mm512_permutexvar_epi8(load64(kIqCtl.iq3_rows_2), _mm512_loadu_si512(b + 2)), codes2[0], codes2[1]);
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const __m512i codes = codes2[h];
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) iq_signed_chunk<3>(a, 2 * h + k, 2 * h + k, codes, kIqCtl.code_shift3[k], signs, _mm512_castps256_ps512(scales), 1);
  }
}

// IQ3_S, one block: 2 bytes d, 64 grid bytes (4-value rows, as IQ3_XXS's), 8 bytes of the rows' 9th index bits
// (bit k of byte ib: row 8 ib + k), 32 sign bytes (one per 8 values, bit i negating value i: chunk c's 8 are its
// 64-bit mask as they stand), 4 bytes of 4-bit sub-scales (value = d (1 + 2 s) x level x sign).
template <class Acc>
__attribute__((always_inline)) inline void unit_iq3s(const uint8_t* b, Acc& a) {
  constexpr bool kBiased = kBiasedAcc<Acc>;  // one token: the levels + 128 (BiasedAcc1)
  uint32_t sc;
  std::memcpy(&sc, b + 106, 4);
  const __m256i s = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(sc)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                     _mm256_set1_epi32(15));
  const __m256 scales = _mm256_mul_ps(_mm256_set1_ps(qsimd::f16_at(b)),
                                      _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(s, 1), _mm256_set1_epi32(1))));
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {  // rows 32 h .. 32 h + 31: chunks 2h, 2h + 1
    uint32_t hi;
    std::memcpy(&hi, b + 66 + 4 * h, 4);
    const __m512i lo = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2 + 32 * h)));
    const __m512i codes = lookup32_of512(g_iq_codes.iq3s, _mm512_mask_add_epi16(lo, static_cast<__mmask32>(hi), lo, _mm512_set1_epi16(256)));
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k) {
      const int c = 2 * h + k;
      const __m512i rows = _mm512_permutexvar_epi16(load64(kIqCtl.iq3_pick[k]), codes);
      const __m512i mag = _mm512_permutexvar_epi8(_mm512_multishift_epi64_epi8(load64(kIqCtl.shift3), rows), load64(kBiased ? g_iq_codes.iq3s_level_b : g_iq_codes.iq3s_level));
      uint64_t neg;
      std::memcpy(&neg, b + 74 + 8 * c, 8);
      add_chunk(a, c, _mm512_mask_sub_epi8(mag, _cvtu64_mask64(neg), _mm512_setzero_si512(), mag),
                lanes_of(_mm512_castps256_ps512(scales), 2 * c, 8));
    }
  }
}

// Q8_0, a pair of blocks (34 bytes each: f16 d, 32 int8 quants): the quants are the chunk as they stand, lanes 0-7
// scaled by the first d, 8-15 by the second -- what the Q8Sink path hands the same chunk() call (same bits) without
// its half-chunk hand-over and 4-float scale build (one thread in L2: see docs/perf/cpu.md, session 43).
template <class Acc>
__attribute__((always_inline)) inline void unit_q8_0_pair(const uint8_t* b, Acc& a) {
  const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(qsimd::load32(b + 2)), qsimd::load32(b + 36), 1);
  const __m128i dd = _mm_insert_epi16(_mm_cvtsi32_si128(b[0] | b[1] << 8), b[34] | b[35] << 8, 1);
  const __m512 d2 = _mm512_castps128_ps512(_mm_cvtph_ps(dd));
  a.chunk(0, w, _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), d2));
}

// Q5_0 / Q4_0 / IQ4_NL, a pair of blocks (f16 d, Q5_0's 32 fifth bits, 16 bytes of nibbles: values 0-15 low, 16-31
// high), in one 512-bit pass: one load of both blocks (masked: no read past the pair, unless Acc::kLoad64), one
// vpermb for the quant bytes of each 16 values, one vpmultishiftqb for their nibbles, one vpermb through the format's
// table (q - 8, q - 16, the IQ4_NL levels; + 128 for BiasedAcc1), Q5_0's fifth bits as a byte mask (vpermb, vptestmb)
// adding 16, both d by one vpermw. The exact decoders hand the same int8 quants and the same d per 8 lanes to the
// same chunk() arithmetic (same bits); through them (Q8Sink: per block nibbles, fifth bits by shuffle and compare, the
// half-chunk hand-over and a 4-float scale build) a pair took ~40 instructions, and the 128-wide rows of these
// formats (the KDA gates' f_b / g_b) ran at ~8 GB/s a thread.
template <WeightFormat F, class Acc>
__attribute__((always_inline)) inline void unit_nibble_pair(const uint8_t* b, Acc& a) {
  constexpr bool kFive = F == WeightFormat::Q5_0, kBiased = kBiasedAcc<Acc>;
  constexpr const NibblePairControls& ctl = kFive ? kQ5_0Pair : kQ4Pair;
  constexpr int64_t BB = weight_layout(F).block_bytes;
  __m512i z;
  if constexpr (requires { requires Acc::kLoad64; })
    z = _mm512_loadu_si512(b);  // ~4% faster at 128 wide than the masked load
  else
    z = _mm512_maskz_loadu_epi8(_cvtu64_mask64((uint64_t{1} << (2 * BB)) - 1), b);
  const __m512i nib = _mm512_multishift_epi64_epi8(load64(ctl.shift), _mm512_permutexvar_epi8(load64(ctl.quants), z));
  __m512i table;
  if constexpr (F == WeightFormat::IQ4_NL) {
    table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(quant::kIq4nlValues)));
    if constexpr (kBiased) table = _mm512_xor_si512(table, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else if constexpr (kBiased) {
    table = load64(kFive ? ctl.q5_0b : ctl.q4_0b);
  } else {
    table = load64(kFive ? ctl.q5_0 : ctl.q4_0);
  }
  __m512i w = _mm512_permutexvar_epi8(nib, table);  // the table repeats every 16 bytes: only the nibble counts
  if constexpr (kFive) {
    const __mmask64 bit = _mm512_test_epi8_mask(_mm512_permutexvar_epi8(load64(ctl.fifth), z), load64(kIqCtl.bit_of));
    w = _mm512_mask_add_epi8(w, bit, w, _mm512_set1_epi8(16));
  }
  const __m256i d16 = _mm256_permutexvar_epi16(_mm256_load_si256(reinterpret_cast<const __m256i*>(ctl.d)), _mm512_castsi512_si256(z));
  add_chunk(a, 0, w, _mm512_cvtph_ps(d16));
}

// Every other format (Q8_0, the codebook i-quants): its exact decoder (quant_decode_simd.h) as the Sink; it
// hands 32 int8 quants with the sub-scales of each 16 (no sub-mins: the formats with mins have their own
// unit decoders above); two such halves make a chunk, which goes into the accumulators at once (one fma per
// chunk: these decoders' scalar table lookups, not the accumulator chain, bound their speed). base: where
// the decoder's element 0 sits in the unit (Q8_0's second block: 32).
template <class Acc>
struct Q8Sink {
  Acc& a;
  int base = 0;
  __m256i half = _mm256_setzero_si256();  // the chunk's first 32 quants, waiting for the second
  float hd0 = 0, hd1 = 0;                 // their sub-scales (values 0-15, 16-31)
  explicit Q8Sink(Acc& acc) : a(acc) {}

  template <bool kMin>
  __attribute__((always_inline)) void put32q(int i, __m256i v, float d0, float, float d1, float) {
    static_assert(!kMin, "formats with sub-mins have their own unit decoder");
    i += base;
    if ((i & 32) == 0) {
      half = v, hd0 = d0, hd1 = d1;
      return;
    }
    a.chunk(i / 64, join(half, v), lanes_of(_mm512_castps128_ps512(_mm_setr_ps(hd0, hd1, d0, d1)), 0, 4));
  }
};

// One unit of a row (the pair formats: blocks 2u, 2u + 1 of `blocks`) into the accumulators.
template <WeightFormat F, class Acc>
__attribute__((always_inline)) inline void unit(const uint8_t* row, int64_t u, int64_t blocks, Acc& a) {
  constexpr int64_t BB = weight_layout(F).block_bytes;
  if constexpr (F == WeightFormat::Q4_K) {
    unit_q4k(row + u * BB, a);
  } else if constexpr (F == WeightFormat::Q5_K) {
    unit_q45k<F>(row + u * BB, a);
  } else if constexpr (F == WeightFormat::Q2_K) {
    unit_q2k(row + u * BB, a);
  } else if constexpr (F == WeightFormat::Q6_K) {
    unit_q6k(row + u * BB, a);
  } else if constexpr (F == WeightFormat::Q3_K) {
    unit_q3k(row + u * BB, a);
  } else if constexpr (F == WeightFormat::IQ4_XS) {
    unit_iq4xs(row + u * BB, a);
  } else if constexpr (F == WeightFormat::IQ2_XXS) {
    unit_iq2xxs(row + u * BB, a);
  } else if constexpr (F == WeightFormat::IQ3_XXS) {
    unit_iq3xxs(row + u * BB, a);
  } else if constexpr (F == WeightFormat::IQ2_XS) {
    unit_iq2xs(row + u * BB, a);
  } else if constexpr (F == WeightFormat::IQ3_S) {
    unit_iq3s(row + u * BB, a);
  } else if constexpr (is_pair_format(F)) {
    if constexpr (F == WeightFormat::Q8_0)
      if (2 * u + 1 < blocks) return unit_q8_0_pair(row + 2 * u * BB, a);  // a whole pair; a lone last block below
    if constexpr (F == WeightFormat::Q5_0 || F == WeightFormat::Q4_0 || F == WeightFormat::IQ4_NL)
      if (2 * u + 1 < blocks) return unit_nibble_pair<F>(row + 2 * u * BB, a);
    Q8Sink<Acc> s(a);
    qsimd::decode_into<F>(row + 2 * u * BB, s);
    if (2 * u + 1 < blocks) {
      s.base = 32;
      qsimd::decode_into<F>(row + (2 * u + 1) * BB, s);
    } else {  // the row's last block has no partner: zero weights (and its activations are q = 0, d = 0)
      s.template put32q<false>(32, _mm256_setzero_si256(), 0.f, 0.f, 0.f, 0.f);
    }
  } else {
    Q8Sink<Acc> s(a);
    qsimd::decode_into<F>(row + u * BB, s);
  }
}

// A tile's share of the units: [u0, u1); between blocks the accumulators wait in `state` (exactly).
struct UnitSpan {
  int64_t u0, u1;
  bool first, last;
  __m512* state;  // T accumulators between blocks
  // Several tokens: the same units of the next row block's rows (row r's at pf + r * row bytes, r < pf_rows) are
  // requested into L2 while this block computes (q8_tile_rows).
  const uint8_t* pf = nullptr;
  int64_t pf_rows = 0;
};

// One token: the weights K3_QUANT_PREFETCH bytes past the unit being decoded are requested now (0 = none). The rows
// of a block are one contiguous stream, but one core's hardware prefetcher kept too few lines in flight from DRAM
// (2-thread Q4_K_M decode +16-18%, docs/perf/cpu.md session 29; the MXFP4 one-token rows gained 39% the same way in
// session 25). K3_QUANT_PREFETCH_HINT=t0 | t1 | t2: the cache level asked for (session 30: t1, into L2 -- an L1 request
// holds one of the core's few L1 fill buffers until DRAM answers; same bits whatever the level).
int64_t read_quant_prefetch() {
  const char* e = std::getenv("K3_QUANT_PREFETCH");
  return e == nullptr || e[0] == 0 ? kQuantPrefetchBytes : std::clamp<int64_t>(std::strtoll(e, nullptr, 10), 0, 1 << 20);
}
const int64_t g_quant_prefetch = read_quant_prefetch();
int read_quant_prefetch_hint() {
  const char* e = std::getenv("K3_QUANT_PREFETCH_HINT");
  if (e != nullptr && std::strcmp(e, "t0") == 0) return 0;
  if (e != nullptr && std::strcmp(e, "t2") == 0) return 2;
  return kQuantPrefetchHint;
}
const int g_quant_prefetch_hint = read_quant_prefetch_hint();

// One row x T tokens over units [u0, u1) of a token tile packed unit by unit (unit u of token t at
// xq + (u - u0) * T * UB + t * UB; with one token that is the plain converted row).
// kHint >= 0 (one token): pf requests the weights g_quant_prefetch bytes past each unit.
template <WeightFormat F, int T, int kHint = -1>
__attribute__((always_inline)) inline void q8_tile(const uint8_t* row, int64_t blocks, const uint8_t* xq, float* y, int64_t ldy, UnitSpan us,
                                                   PrefetchCursor<kHint>* pf = nullptr) {
  constexpr int64_t UB = unit_bytes(F), BB = unit_weight_bytes(F);
  Q8Acc<T, UB, !unsigned_quants(F)> a;
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a.acc[t] = us.first ? _mm512_setzero_ps() : us.state[t];
  for (int64_t u = us.u0; u < us.u1; ++u, xq += T * UB) {
    if constexpr (kHint >= 0) pf->upto(reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>((u + 1) * BB + g_quant_prefetch));
    a.xq = xq;
    unit<F>(row, u, blocks, a);
  }
  if (!us.last) {
    for (int t = 0; t < T; ++t) us.state[t] = a.acc[t];
    return;
  }
  for (int t = 0; t < T; ++t) y[t * ldy] = _mm512_reduce_add_ps(a.acc[t]);
}

// q8_tile over rows [r0, r1) of W (row r's outputs at y + (r - r0), its parked accumulators at
// us.state + (r - r0) * T): one call per row block, not one indirect call per row (the MXFP4 tile of
// weight_kernels_avx512bf16.cpp ran 1.4-1.6x faster so).
template <WeightFormat F, int T>
void q8_tile_rows(const WeightMatrix& W, int64_t r0, int64_t r1, int64_t blocks, const uint8_t* xq, float* y,
                  int64_t ldy, UnitSpan us) {
  __m512* const state = us.state;
  const int64_t row_bytes = row_data_bytes(F, W.cols);
  const uint8_t* data = W.row_data(r0);
  constexpr int64_t BB = unit_weight_bytes(F);
  for (int64_t r = 0; r < r1 - r0; ++r) {
    if (r < us.pf_rows) prefetch_lines<1>(us.pf + r * row_bytes + us.u0 * BB, (us.u1 - us.u0) * BB);
    us.state = state ? state + r * T : nullptr;
    q8_tile<F, T>(data + r * row_bytes, blocks, xq, y + r, ldy, us);
  }
}

// One token over rows [r0, r1): q8_tile<F, 1> per row, the rows' one stream prefetched through one cursor (it
// starts at the block's first line: the first g_quant_prefetch bytes are requested at once). The rows' accumulators
// are parked 16 at a time and summed together (tree512::reduce16: ~3 instructions an output, the bits of
// _mm512_reduce_add_ps): a lone reduction is ~9 dependent shuffles and adds, and on a short row -- the KDA gates'
// f_b / g_b, 128 columns of Q5_0, two units -- it was most of the row's time (one token 11 GB/s at 2 threads while
// the long rows stream at ~30).
template <WeightFormat F, int kHint>
void q8_one_token_rows(const WeightMatrix& W, int64_t r0, int64_t r1, int64_t blocks, const uint8_t* xq, float* y, UnitSpan us) {
  const int64_t row_bytes = row_data_bytes(F, W.cols);
  const uint8_t* data = W.row_data(r0);
  PrefetchCursor<kHint> pf{reinterpret_cast<uintptr_t>(data) & ~uintptr_t{63}};
  __m512 fin[16];
  us.last = false;  // q8_tile parks each row's accumulator in fin instead of reducing it
  for (int64_t g0 = 0; g0 < r1 - r0; g0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, r1 - r0 - g0));
    for (int i = 0; i < nr; ++i) {
      us.state = fin + i;
      q8_tile<F, 1, kHint>(data + (g0 + i) * row_bytes, blocks, xq, nullptr, 1, us, &pf);
    }
    tree512::reduce_store<1>(fin, nr, y + g0, 1);
  }
}

// One row of a pair format x the biased token (BiasedAcc1). NB > 0: a row of NB blocks, its units unrolled (and the
// lone last block of an odd NB known at compile time) and its lines requested once per row; a short row's loop and
// per-unit prefetch checks cost ~15% of its time at 128 columns (two units). NB = 0: nu units, prefetched unit by
// unit as q8_tile does.
template <WeightFormat F, int NB, bool kLoad64, int kHint>
__attribute__((always_inline)) inline __m512 pair_row(const uint8_t* row, int64_t row_bytes, int64_t nu, int64_t blocks,
                                                      const uint8_t* biased, PrefetchCursor<kHint>& pf) {
  BiasedAcc1<kLoad64> a{{_mm512_setzero_ps()}, biased};
  constexpr int64_t kUnitBytes = unit_elems(F) / 64 * kBiasedChunkBytes;  // a pair: one chunk; a 256-unit: four
  if constexpr (NB > 0) {
    static_assert(is_pair_format(F), "the unrolled short rows are the pair formats'");
    if constexpr (kHint >= 0) pf.upto(reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(row_bytes + g_quant_prefetch));
#pragma GCC unroll 4
    for (int u = 0; u < (NB + 1) / 2; ++u, a.xq += kBiasedChunkBytes) unit<F>(row, u, NB, a);
  } else {
    int64_t u = 0;
    if constexpr (F == WeightFormat::IQ2_XXS)  // two blocks at a time (unit2_iq2xxs), an odd last one below
      for (; u + 1 < nu; u += 2, a.xq += 2 * kUnitBytes) {
        if constexpr (kHint >= 0) pf.upto(reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>((u + 2) * unit_weight_bytes(F) + g_quant_prefetch));
        unit2_iq2xxs(row + u * unit_weight_bytes(F), a);
      }
    for (; u < nu; ++u, a.xq += kUnitBytes) {
      if constexpr (kHint >= 0) pf.upto(reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>((u + 1) * unit_weight_bytes(F) + g_quant_prefetch));
      unit<F>(row, u, blocks, a);
    }
  }
  return a.acc[0];
}

// One token of a pair format (Q8_0, Q5_0, Q4_0, IQ4_NL; and, NB = 0, of IQ2_XXS / IQ3_XXS: is_biased_iq) over rows
// [r0, r1): pair_row per row on the token rewritten once per call (bias_token), the rows' one stream prefetched
// through one cursor, their sums 16 at a time as q8_one_token_rows. The 64-byte loads of a pair (44 or 36 bytes) read up to 28 bytes past it, which is inside the
// matrix but for the last row of the matrix: that row loads masked.
template <WeightFormat F, int NB, int kHint>
void pair_one_token_rows(const WeightMatrix& W, int64_t r0, int64_t r1, int64_t blocks, const uint8_t* biased, float* y) {
  const int64_t row_bytes = row_data_bytes(F, W.cols), nu = units(F, W.cols);
  const uint8_t* data = W.row_data(r0);
  PrefetchCursor<kHint> pf{reinterpret_cast<uintptr_t>(data) & ~uintptr_t{63}};
  __m512 fin[16];
  for (int64_t g0 = 0; g0 < r1 - r0; g0 += 16) {
    const int nr = static_cast<int>(std::min<int64_t>(16, r1 - r0 - g0));
    const int last = r0 + g0 + nr == W.rows ? nr - 1 : nr;  // the rows before the matrix's last one
    for (int i = 0; i < last; ++i) fin[i] = pair_row<F, NB, true, kHint>(data + (g0 + i) * row_bytes, row_bytes, nu, blocks, biased, pf);
    if (last < nr) fin[last] = pair_row<F, NB, false, kHint>(data + (g0 + last) * row_bytes, row_bytes, nu, blocks, biased, pf);
    tree512::reduce_store<1>(fin, nr, y + g0, 1);
  }
}

template <WeightFormat F, int kHint>
void pair_one_token_rows_of(const WeightMatrix& W, int64_t r0, int64_t r1, int64_t blocks, const uint8_t* biased, float* y) {
  switch (blocks) {  // rows of up to 128 values unrolled (the KDA gates' f_b / g_b, MLA's k_b)
    case 1: return pair_one_token_rows<F, 1, kHint>(W, r0, r1, blocks, biased, y);
    case 2: return pair_one_token_rows<F, 2, kHint>(W, r0, r1, blocks, biased, y);
    case 3: return pair_one_token_rows<F, 3, kHint>(W, r0, r1, blocks, biased, y);
    case 4: return pair_one_token_rows<F, 4, kHint>(W, r0, r1, blocks, biased, y);
    default: return pair_one_token_rows<F, 0, kHint>(W, r0, r1, blocks, biased, y);
  }
}

// run(std::integral_constant<int, kHint>{}) with the one-token rows' prefetch as a compile-time hint: -1 none
// (K3_QUANT_PREFETCH=0: no cursor), else the hint K3_QUANT_PREFETCH_HINT picked (0, 1 or 2).
template <class Run>
void with_prefetch_hint(Run&& run) {
  if (g_quant_prefetch == 0) return run(std::integral_constant<int, -1>{});
  switch (g_quant_prefetch_hint) {
    case 0: return run(std::integral_constant<int, 0>{});
    case 2: return run(std::integral_constant<int, 2>{});
    default: return run(std::integral_constant<int, 1>{});
  }
}

template <WeightFormat F, size_t... T>
constexpr auto q8_tiles(std::index_sequence<T...>) {
  using Tile = void (*)(const WeightMatrix&, int64_t, int64_t, int64_t, const uint8_t*, float*, int64_t, UnitSpan);
  return std::array<Tile, sizeof...(T)>{q8_tile_rows<F, static_cast<int>(T) + 1>...};
}

constexpr int64_t kQ8T = 12;             // 12 accumulators + weights, correction, scales, temporaries
constexpr int64_t kTileActBytes = 24 << 10;  // packed activations of a token tile per column block: half of L1
constexpr int64_t kQ8StateRows = 64;     // rows whose accumulators wait between column blocks: 48 KiB

// Rows [r0, r1) x n converted tokens: y[t * ldy + (r - r0)]. Blocks of rows (~256 KiB of weights) stay in
// L2 while every token tile passes over them, one column block of units at a time (packed, fresh in L1).
template <WeightFormat F>
void q8_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* xq, int64_t n, float* y, int64_t ldy) {
  static constexpr auto tiles = q8_tiles<F>(std::make_index_sequence<kQ8T>());
  constexpr int64_t UB = unit_bytes(F);
  constexpr int64_t kUnitWeightBytes = unit_weight_bytes(F);
  const int64_t cols = W.cols, nu = units(F, cols), ldq = nu * UB, blocks = cols / weight_layout(F).block_elems;
  // Q8_0's pair decodes in two loads: over its long rows BiasedAcc1's third load a chunk cost more than the correction
  // it saves (4096 wide, one thread: 4% slower than Q8Acc), so Q8_0 takes it for its unrolled short rows only.
  if constexpr (is_pair_format(F))
    if (n == 1 && (F != WeightFormat::Q8_0 || blocks <= 4)) {
      uint8_t* biased = biased_token_scratch(nu * kBiasedChunkBytes);
      bias_token(xq, nu, biased);
      return with_prefetch_hint([&](auto hint) { pair_one_token_rows_of<F, hint()>(W, r0, r1, blocks, biased, y); });
    }
  // The codebook i-quants' units make their weights through tables (the signed levels, or + 128): one token takes the
  // biased layout as the pair formats do, which saves each chunk Q8Acc's correction (a vpdpbusd and a subtraction).
  if constexpr (is_biased_iq(F))
    if (n == 1) {
      uint8_t* biased = biased_token_scratch(nu * 4 * kBiasedChunkBytes);
      bias_token(xq, nu, biased, 4, UB);
      return with_prefetch_hint([&](auto hint) { pair_one_token_rows<F, 0, hint()>(W, r0, r1, blocks, biased, y); });
    }
  if (n == 1) {  // one token (decode): its converted row is the packed layout, nothing to block or copy
    const UnitSpan us{0, nu, true, true, nullptr};
    return with_prefetch_hint([&](auto hint) { q8_one_token_rows<F, hint()>(W, r0, r1, blocks, xq, y, us); });
  }
  constexpr int64_t kBlockUnits = std::max<int64_t>(1, kTileActBytes / (kQ8T * UB));
  const int64_t block = std::clamp<int64_t>((256 << 10) / std::max<int64_t>(1, row_data_bytes(F, cols)), 1, kQ8StateRows);
  const int64_t kblocks = (nu + kBlockUnits - 1) / kBlockUnits;
  __m512 state[kQ8StateRows * kQ8T];
  alignas(64) uint8_t xp[kQ8T * kBlockUnits * UB];
  for (int64_t b0 = r0; b0 < r1; b0 += block) {
    const int64_t b1 = std::min(r1, b0 + block);
    for (int64_t t0 = 0; t0 < n; t0 += kQ8T) {
      const int64_t m = std::min(kQ8T, n - t0);
      const auto tile = tiles[m - 1];
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t u0 = kb * kBlockUnits, u1 = std::min(nu, u0 + kBlockUnits);
        const uint8_t* xt = m == 1 ? xq + t0 * ldq + u0 * UB : xp;  // one token: its row is the packed layout
        uint8_t* o = xp;
        for (int64_t u = u0; u < u1 && m > 1; ++u)
          for (int64_t t = 0; t < m; ++t, o += UB) std::memcpy(o, xq + (t0 + t) * ldq + u * UB, UB);
        // The first token tile requests the next row block's units as it goes: from DRAM the tiles' strided
        // reads (a block's rows a column block at a time) kept too few lines in flight (K3_TILE_PREFETCH=0: off).
        const bool pf = t0 == 0 && b1 < r1 && g_tile_prefetch;
        if (t0 == 0 && b0 == r0 && g_tile_prefetch)  // the first block: no block before it asked for its rows
          for (int64_t r = b0; r < b1; ++r) prefetch_lines<1>(W.row_data(r) + u0 * kUnitWeightBytes, (u1 - u0) * kUnitWeightBytes);
        tile(W, b0, b1, blocks, xt, y + t0 * ldy + (b0 - r0), ldy,
             {u0, u1, kb == 0, kb + 1 == kblocks, state, pf ? W.row_data(b1) : nullptr, pf ? std::min(block, r1 - b1) : 0});
      }
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
struct QuantPath {
  static int64_t stride_bytes(int64_t cols) { return units(F, cols) * unit_bytes(F); }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) {
    if constexpr (is_pair_format(F))
      pair_tokens(x, n, cols, out);
    else
      q8k_tokens<!unsigned_quants(F), F == WeightFormat::Q4_K>(x, n, cols, out);
  }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    q8_rows<F>(W, r0, r1, act, n, y, ldy);
  }
};

template <WeightFormat F>
const RowKernels* quant_kernels() {
  static const RowKernels k = act_path::kernels<QuantPath<F>>(*avx512_quant_row_kernels(F));
  return &k;
}

}  // namespace

int64_t avx512bf16_quant_prefetch_bytes() { return g_quant_prefetch; }

// K3_CPU_KQUANT_ACT=quads: Q4_K, Q5_K and Q6_K on this file's quad activations instead of the per-block path of
// weight_kernels_vnni_k.cpp (the A/B of session 35).
bool kquant_quads() {
  const char* e = std::getenv("K3_CPU_KQUANT_ACT");
  return e != nullptr && std::strcmp(e, "quads") == 0;
}

const RowKernels* avx512bf16_quant_row_kernels(WeightFormat f) {
  if (const RowKernels* k = avx512bf16_k_row_kernels(f); k != nullptr && !kquant_quads()) return k;
  // The 32-element formats with a min (Q5_1, Q4_1) keep fp32 activations: the avx512 tier's kernels. Q5_0 / Q4_0 /
  // IQ4_NL (llama-quantize's fallback for 128-wide rows: the KDA gates' f_b / g_b, MLA's attn_k_b) take the int8 path
  // as Q8_0 does since session 30: on fp32 activations their one-token rows ran at ~5 GB/s, an instruction-bound
  // decode per 88-byte row (2% of a 2-thread kl-1b Q4_K_M step).
  return with_gguf_block_format(
      f,
      [](auto c) -> const RowKernels* {
        constexpr WeightFormat F = decltype(c)::value;
        if constexpr (is_ggml_32_format(F) && !is_pair_format(F))
          return avx512_quant_row_kernels(F);
        else
          return quant_kernels<F>();
      },
      avx512_quant_row_kernels(f));
}

}  // namespace k3::cpu
