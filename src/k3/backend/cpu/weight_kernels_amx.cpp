// The amx tier: BF16 weights on Intel AMX tiles (TDPBF16PS), activations rounded to bf16 as the avx512bf16
// tier rounds them (its prepare: round to nearest even, rows zero-padded to 32 values).
//
// Tiles (palette 1, every tile 16 rows x 64 bytes): C0..C3 = tmm0..3 hold 32 weight rows x 32 tokens of fp32
// sums (2 row tiles x 2 token tiles), A0, A1 = tmm4, 5 are 16 weight rows x 32 columns each, loaded straight
// from the stored row-major matrix with its row stride (no repacking of the weights, no extra RAM), B0, B1 =
// tmm6, 7 are 32 columns x 16 tokens in AMX's pair layout (row kk: token t's values 2kk, 2kk + 1), packed
// per call from the converted tokens. One 32-column step: 2 A loads, 2 B loads, 4 TDPBF16PS = 32 x 32 x 32
// products.
//
// Batch invariance (the tier contract: a token's outputs have the same bits whatever n, the row split or the
// tile it lands in): TDPBF16PS updates every C element from its own row of A and column of B only, so an
// output is the same sequence zero -> + step 0 -> + step 1 ... whether its row and token share the tile with
// others or not. Rows past the matrix, columns past `cols` and tokens past n come from zero-filled copies, so
// they neither fault nor change the sum (+0). dot and the one-token path run this same code (a 16-row tile of
// which one row is kept), never an emulation: AMX's rounding of a pair of products is its own.
//
// Only the functions between the target pragmas are compiled for AMX + AVX-512; the Path below is plain code.
#include "k3/backend/cpu/weight_kernels_amx.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "k3/backend/cpu/act_convert_path.h"
#include "k3/core/thread_pool.h"
#include "k3/backend/cpu/weight_kernels_avx512bf16.h"

#if defined(__clang__)
#define K3_AMX_BEGIN                                                                                               \
  _Pragma(                                                                                                         \
      "clang attribute push(__attribute__((target(\"amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16\"))), apply_to = function)")
#define K3_AMX_END _Pragma("clang attribute pop")
#else
#define K3_AMX_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16\")")
#define K3_AMX_END _Pragma("GCC pop_options")
#endif

namespace k3::cpu {
namespace {

constexpr int64_t kK = 32;    // bf16 columns per tile step (64 bytes)
constexpr int64_t kTile = 16;  // rows of a tile; tokens of a B tile

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Per thread: the packed B tiles of the current call and the zero-filled copies of edge weight tiles.
struct AmxScratch {
  std::vector<uint16_t> b;  // [token group][step][16 pair rows][16 tokens][2]; grows, never shrinks
  alignas(64) uint16_t a[2][kTile * kK];
};
AmxScratch& scratch() {
  thread_local AmxScratch s;
  return s;
}

}  // namespace
}  // namespace k3::cpu

K3_AMX_BEGIN
// GCC 12 reports the unpack intrinsics' internal _mm512_undefined operand as maybe-uninitialized (a known
// false positive of its headers); nothing of ours is uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace k3::cpu {
namespace {

// Tile configuration of every call (the state is per thread, and a worker may have run another tier's code
// or none: loading it each call costs ~tens of cycles next to a matmul's thousands).
void configure_tiles() {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.colsb[t] = 64;
    c.rows[t] = kTile;
  }
  // GCC 12 has been seen (a stand-alone test, scripts/perf/amx_stream_bench.cpp's first version) to drop the
  // stores to a local config before LDTILECFG, whose read of it the builtin does not declare: a compiler barrier.
  asm volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}

// 16 x 16 dwords: out[j] = column j of the rows r[0..15] (unpack within 128-bit lanes, then across lanes).
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16], u[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // u[4 g + c], lane L: rows 4g .. 4g + 3 of column 4 L + c
    u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
    u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
    u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i w0 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), w1 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, w0, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, w0, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, w1, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, w1, 0xDD);
  }
}

// Tokens [0, n) of act (bf16, stride ld values) into B tiles: group g (tokens 16 g ..), step s: 16 rows of 16
// (pair) dwords, row kk = token t's values 32 s + 2 kk, + 1 at dword t; tokens past n are zeros. One 16 x 16
// dword transpose per (group, step). `out` holds groups * steps * 512 values (sized by the caller).
void pack_b(const uint16_t* act, int64_t ld, int64_t n, int64_t steps, uint16_t* out) {
  for (int64_t g = 0; g * kTile < n; ++g) {
    const int64_t m = std::min<int64_t>(kTile, n - g * kTile);
    for (int64_t s = 0; s < steps; ++s) {
      __m512i r[16];
      for (int64_t t = 0; t < kTile; ++t)
        r[t] = t < m ? _mm512_loadu_si512(act + (g * kTile + t) * ld + s * kK) : _mm512_setzero_si512();
      transpose16(r);
      uint16_t* o = out + (g * steps + s) * kTile * kK;
      for (int kk = 0; kk < kTile; ++kk) _mm512_storeu_si512(o + kk * kK, r[kk]);
    }
  }
}

// Where row tile [r, r + 16) of step s comes from: the matrix itself when the 16 rows and the 32 columns are
// inside it, else a zero-filled copy of what is (rows past W.rows, columns past cols).
const uint16_t* a_tile(const WeightMatrix& W, int64_t r, int64_t s, uint16_t* copy, int64_t& stride_bytes) {
  const auto* w = static_cast<const uint16_t*>(W.data);
  const int64_t cols = W.cols, c0 = s * kK;
  if (r + kTile <= W.rows && c0 + kK <= cols) {
    stride_bytes = cols * 2;
    return w + r * cols + c0;
  }
  std::memset(copy, 0, kTile * kK * sizeof(uint16_t));
  const int64_t nr = std::min<int64_t>(kTile, W.rows - r), nc = std::min<int64_t>(kK, cols - c0);
  for (int64_t i = 0; i < nr; ++i) std::memcpy(copy + i * kK, w + (r + i) * cols + c0, static_cast<size_t>(nc) * 2);
  stride_bytes = kK * 2;
  return copy;
}

// Rows [r, r + 16 nr) x tokens of groups [g, g + ng) (nr, ng in {1, 2}) over all steps, into y (rows < r1,
// tokens < n only).
void block(const WeightMatrix& W, int64_t r, int nr, int64_t g, int ng, int64_t steps, const uint16_t* b, int64_t r0,
           int64_t r1, int64_t n, float* y, int64_t ldy, AmxScratch& sc) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t bstep = kTile * kK, bgroup = steps * bstep;
  for (int64_t s = 0; s < steps; ++s) {
    int64_t st0 = 0, st1 = 0;
    const uint16_t* a0 = a_tile(W, r, s, sc.a[0], st0);
    _tile_loadd(4, a0, st0);
    _tile_loadd(6, b + g * bgroup + s * bstep, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (ng == 2) {
      _tile_loadd(7, b + (g + 1) * bgroup + s * bstep, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (nr == 2) {
      const uint16_t* a1 = a_tile(W, r + kTile, s, sc.a[1], st1);
      _tile_loadd(5, a1, st1);
      _tile_dpbf16ps(2, 5, 6);
      if (ng == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float c[kTile * kTile];
  for (int i = 0; i < nr; ++i)
    for (int j = 0; j < ng; ++j) {
      switch (2 * i + j) {  // the tile number is an immediate
        case 0: _tile_stored(0, c, 64); break;
        case 1: _tile_stored(1, c, 64); break;
        case 2: _tile_stored(2, c, 64); break;
        default: _tile_stored(3, c, 64); break;
      }
      const int64_t rr = r + i * kTile, tt = (g + j) * kTile;
      const int64_t mr = std::min<int64_t>(kTile, r1 - rr), mt = std::min<int64_t>(kTile, n - tt);
      for (int64_t t = 0; t < mt; ++t)
        for (int64_t q = 0; q < mr; ++q) y[(tt + t) * ldy + (rr + q - r0)] = c[q * kTile + t];
    }
}

// Rows [r0, r1) x n tokens whose B tiles are packed already (pack_b): y[t * ldy + (r - r0)]. Row blocks of 32
// outer (their 32 x cols weights stay in L2 while every token pair passes), token-group pairs inner.
// ld: the converted tokens' stride in values (avx512bf16's: cols rounded up to 32, zero-padded).
void amx_bf16_rows_packed(const WeightMatrix& W, int64_t r0, int64_t r1, const uint16_t* b, int64_t ld, int64_t n,
                          float* y, int64_t ldy, AmxScratch& sc) {
  const int64_t steps = ld / kK, groups = (n + kTile - 1) / kTile;
  configure_tiles();
  for (int64_t r = r0; r < r1; r += 2 * kTile) {
    const int nr = r + kTile < r1 ? 2 : 1;
    for (int64_t g = 0; g < groups; g += 2) block(W, r, nr, g, g + 1 < groups ? 2 : 1, steps, b, r0, r1, n, y, ldy, sc);
  }
  // Tiles back to their init state: a pool worker that sleeps between matmuls would otherwise have its 8 KB of
  // tile data saved and restored at every context switch (XSAVE skips state in its init configuration).
  // Measured (call s24-4, 16 threads): decode +2-4% on kl-1b, within noise on k3-1b-fr.
  _tile_release();
}

// The same from converted tokens (RowKernels::rows, as matmul_batch calls it): this thread packs B itself.
void amx_bf16_rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint16_t* act, int64_t ld, int64_t n, float* y,
                   int64_t ldy, AmxScratch& sc) {
  pack_b(act, ld, n, ld / kK, sc.b.data());
  amx_bf16_rows_packed(W, r0, r1, sc.b.data(), ld, n, y, ldy, sc);
}

// Token groups [g0, g1) of n converted tokens packed into b (the whole call's B tiles).
void amx_pack_groups(const uint16_t* act, int64_t ld, int64_t n, int64_t g0, int64_t g1, uint16_t* b) {
  const int64_t steps = ld / kK;
  const int64_t t0 = g0 * kTile, t1 = std::min(n, g1 * kTile);
  pack_b(act + t0 * ld, ld, t1 - t0, steps, b + g0 * steps * kTile * kK);
}

}  // namespace
}  // namespace k3::cpu

#pragma GCC diagnostic pop
K3_AMX_END

// ---- plain code: the Path (act_convert_path.h builds the RowKernels entries) ----

namespace k3::cpu {
namespace {

// The avx512bf16 tier's BF16 conversion (the same bf16 tokens), AMX rows over them.
const RowKernels& avx512bf16_bf16() { return *avx512bf16_row_kernels(WeightFormat::BF16); }

struct AmxBf16Path {
  static int64_t stride_bytes(int64_t cols) { return avx512bf16_bf16().act_bytes(cols, 1); }
  static void prepare(const float* x, int64_t n, int64_t cols, uint8_t* out) { avx512bf16_bf16().prepare(x, n, cols, out); }
  static void rows(const WeightMatrix& W, int64_t r0, int64_t r1, const uint8_t* act, int64_t n, float* y, int64_t ldy) {
    if (r1 <= r0 || n <= 0) return;
    AmxScratch& sc = scratch();  // sized here, in plain code: no vector code instantiated for the AMX target
    const int64_t ld = stride_bytes(W.cols) / 2;  // a multiple of 32 values: whole 32-column steps
    const size_t need = static_cast<size_t>((n + kTile - 1) / kTile * ld * kTile);
    if (sc.b.size() < need) sc.b.resize(need);
    amx_bf16_rows(W, r0, r1, reinterpret_cast<const uint16_t*>(act), ld, n, y, ldy, sc);
  }
};

}  // namespace

// The whole matmul: tokens converted once (avx512bf16's conversion), their B tiles packed ONCE for all threads
// (act_path::matmul's rows() would pack them in every thread: at 16 threads that was most of the time), then
// the rows over the pool with act_path::matmul's thresholds. The same tile arithmetic, so the same bits.
void amx_matmul(const WeightMatrix& W, const float* x, int64_t n, float* y) {
  if (n <= 0 || W.rows <= 0) return;
  const RowKernels& conv = avx512bf16_bf16();
  const int64_t rows = W.rows, cols = W.cols, ld = conv.act_bytes(cols, 1) / 2, groups = (n + kTile - 1) / kTile;
  uint8_t* const a8 = act_path::scratch(static_cast<size_t>(n * ld * 2));
  thread_local std::vector<uint16_t> b;
  if (b.size() < static_cast<size_t>(groups * kTile * ld)) b.resize(static_cast<size_t>(groups * kTile * ld));
  // Plain pointers into this thread's buffers: a lambda running on a worker would name the worker's thread_locals.
  const auto* ap = reinterpret_cast<const uint16_t*>(a8);
  uint16_t* const bp = b.data();
  auto convert_and_pack = [&](int64_t g0, int64_t g1, int) {
    const int64_t t0 = g0 * kTile, t1 = std::min(n, g1 * kTile);
    conv.prepare(x + t0 * cols, t1 - t0, cols, a8 + t0 * ld * 2);
    amx_pack_groups(ap, ld, n, g0, g1, bp);
  };
  if (act_path::convert_over_pool(n, cols))
    ThreadPool::global().parallel_for(groups, 0, convert_and_pack);
  else
    convert_and_pack(0, groups, 0);
  auto rows_range = [&](int64_t r0, int64_t r1, int) { amx_bf16_rows_packed(W, r0, r1, bp, ld, n, y + r0, rows, scratch()); };
  if (act_path::rows_over_pool(rows, cols, n))
    act_path::rows_over_pool_chunked(rows, W.bytes() / rows * n, rows_range);
  else
    rows_range(0, rows, 0);
}

const RowKernels* amx_row_kernels(WeightFormat f) {
  static const RowKernels bf16 = [] {
    RowKernels k = act_path::kernels<AmxBf16Path>(avx512bf16_bf16());
    k.matmul = amx_matmul;
    return k;
  }();
  return f == WeightFormat::BF16 ? &bf16 : nullptr;
}

}  // namespace k3::cpu
