// quant_gemv_mma (quant_mma.h): GGUF K-quant blocks on the tensor cores for decode batches.
//
// mma.sync m16n8k16 bf16 -> fp32, weights as A (16 output rows), the batch's tokens as B (8 per n8 tile, NT
// tiles). The MMA sums over k, so any permutation of k applied to A and B alike gives the same sum; we pick,
// per k16 step, the columns that lane (g, tq) can decode from the bytes it loaded, and load x at the same
// columns. Lane (g, tq) holds A rows g and g + 8 and k-slots {2tq, 2tq+1, 2tq+8, 2tq+9}; a step must lie in
// ONE sub-block of the format (one scale per row), because the sub-block's scale multiplies the step's sum:
//   Q4_K / Q5_K (sub-blocks of 32, scale + min): a unit is a 64-column chunk j of a super-block, whose qs bytes
//     32j .. 32j + 31 hold sub-block 2j in the low nibbles and 2j + 1 in the high ones. Lane tq loads bytes
//     8tq .. 8tq + 7 of each of its rows (8 bytes); step s of a sub-block takes stored columns 8tq + 4s + {0..3}
//     (the linear_skinny.cu mapping), so x's B fragment of both steps is one 16-byte load of 8 columns.
//   Q6_K (sub-blocks of 16, one int8 scale): a unit is half a super-block (128 columns); sub-block (a, h) =
//     columns 32a + 16h .. + 15 of the half, lane tq takes 4tq .. 4tq + 3 of it: ql bytes (a odd: 32 +) 16h + 4tq
//     (low nibbles for a < 2, high for a >= 2), qh bytes 16h + 4tq (bits 2a, 2a + 1). Blocks are 210 bytes, only
//     2-byte aligned: each 4-byte field is two aligned loads and a funnel shift.
// Quants become bf16 without a conversion instruction: byte q (< 128) under 0x43 is the bf16 128 + q (one PRMT
// per pair), and one HSUB2 of 128 (Q6_K: 160) leaves q (q - 32) exactly.
//
// Per sub-block and n8 tile: t = sum over the sub-block of q x (two or four MMAs, hi then lo, into a zeroed
// fragment), then acc = fma(-min, xsum, fma(scale, t, acc)) with the CPU's fp32 scale products d * sc and
// dmin * m. Error against the CPU's fp32 weights, in units of 2^-24 of sum(|d sc q| + |dmin m|) |x|: x' vs x
// 2^-17 relative (64 units), the MMA's fp32 sums of exact products (~8 per step), one rounding per sub-block and
// accumulation step (cols / 16), the 3-level block reduction, and the CPU's own rounding of each weight (1-2):
// ~80 + cols / 16 (tests: CudaQuantMma.*). Without lo, x is bf16-rounded (2^-9 relative: 32768 units).
//
// KSplit block: 8 warps on the same 16 MT rows (MT m16 tiles per warp), warp w over units w, w + 8, ... (two units'
// weights loaded before either is used); the 8 warps' sums meet in shared memory in a fixed tree, so the
// result does not depend on timing. Rows block (quant_mma_rows.cuh, larger batches): 8 warps on 128 rows, x staged
// in shared memory; k slices summed in slice order. Rows past the end are read (clamped to the last row), never written.
// Tokens past n read token n - 1's activations; their columns of the MMA are discarded.
#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/quant_mma.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "k3/backend/cuda/quant_mma.cuh"
#include "k3/backend/cuda/quant_mma_rows.cuh"
#include "k3/backend/cuda/quant_mma_staged.cuh"
#include "k3/backend/cuda/quant_mma_tiled.cuh"

namespace k3::cuda {
namespace {

using qmma::tiles_for;

// The m16 tiles per warp when the caller leaves it open (0): two where they won in CudaQuantMma.TimingAtK3Width
// (H200, call s29-1, x split): 32 tokens for every format (4096 x 7168 Q4_K 90.5 -> 57.5 us, Q6_K 92.9 -> 57.9, the
// 163840 x 2304 Q6_K head 980 -> 628), 16 tokens for Q4_K / Q5_K (40.1 -> 28.9, 49.5 -> 36.4; Q6_K lost: 41.6 vs
// 44.3, head 436 vs 462); one at <= 8 tokens (the second tile's registers cost more than the shared x loads save:
// Q6_K 28.1 vs 38.7 at one token).
int default_mt(WeightFormat f, int n) {
  const int nt = tiles_for(n);
  return nt == 4 || (nt == 2 && f != WeightFormat::Q6_K) ? 2 : 1;
}

// fn(nt, mt) with std::integral_constant arguments: n's n8 tiles and mt m16 tiles a warp (two only up to 4 n8 tiles:
// two at 8 would hold 256 accumulators).
template <class Fn>
cudaError_t with_tiles(int n, int mt, const Fn& fn) {
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  switch (tiles_for(n)) {
    case 1: return mt == 2 ? fn(I1{}, I2{}) : fn(I1{}, I1{});
    case 2: return mt == 2 ? fn(I2{}, I2{}) : fn(I2{}, I1{});
    case 4: return mt == 2 ? fn(std::integral_constant<int, 4>{}, I2{}) : fn(std::integral_constant<int, 4>{}, I1{});
    default: return fn(std::integral_constant<int, 8>{}, I1{});
  }
}

template <class P, bool SPLIT>
cudaError_t launch_nt(const qmma::Job& j, int mt, cudaStream_t s) {
  return with_tiles(j.a.n, mt, [&](auto nt, auto m) {
    return qmma::launch<P, decltype(nt)::value, decltype(m)::value, SPLIT, false, false>(j, 1, s);
  });
}

// The KSplit kernel over a group's matrices (quant_gemv_mma_group): the same tiles as launch_nt.
template <class P, bool SPLIT>
cudaError_t launch_group_nt(const qmma::Job& j, const qmma::DenseGroup& g, int mt, cudaStream_t s) {
  return with_tiles(j.a.n, mt, [&](auto nt, auto m) {
    return qmma::launch_group<P, decltype(nt)::value, decltype(m)::value, SPLIT>(j, g, s);
  });
}

// The Tiled form's m16 tiles per block when the caller leaves it open (call s36-1, H100, scripts/perf/q6k_tiled_bench.cu,
// docs/perf/cuda/s36-1-stdout-tail.txt): one for every matrix but the tall ones -- Q6_K 4096 x 7168 24.0 us at one tile
// against 36.4 at two, Q4_K 2304 x 4096 13.4 vs 20.0: more tiles a block mean fewer blocks than a small matrix needs
// to fill the SMs -- and two for the vocabulary heads (163840 x 2304 Q6_K at 8 tokens 157.5 vs 167.4, 16: 268.8 vs
// 329.7; at one token 132.0 vs 139.3).
int tiled_default_tpb(int64_t rows) { return rows >= kQuantMmaTallMatrixRows ? 2 : 1; }

// fn(nt, tpb) with std::integral_constant arguments for the Tiled form (1 or 2 n8 tiles; 1, 2, 4 or 8 tiles per block).
template <class Fn>
cudaError_t with_tiled(int n, int tpb, const Fn& fn) {
  return with_tiles(n, 1, [&](auto nt, auto) -> cudaError_t {
    if constexpr (decltype(nt)::value > 2) {
      return cudaErrorInvalidValue;
    } else {
      switch (tpb) {
        case 1: return fn(nt, std::integral_constant<int, 1>{});
        case 2: return fn(nt, std::integral_constant<int, 2>{});
        case 4: return fn(nt, std::integral_constant<int, 4>{});
        case 8: return fn(nt, std::integral_constant<int, 8>{});
        default: return cudaErrorInvalidValue;
      }
    }
  });
}

template <class P, bool SPLIT>
cudaError_t launch_tiled_nt(const uint8_t* tw, const qmma::Job& j, int tpb, cudaStream_t s) {
  return with_tiled(j.a.n, tpb, [&](auto nt, auto t) {
    return qmma::launch_tiled<typename qmma::TiledOf<P>::type, decltype(nt)::value, SPLIT, decltype(t)::value>(tw, j.rows, j.a.cols,
                                                                                                         j.a, j.ldx, j.y, s);
  });
}

template <class P, bool SPLIT>
cudaError_t launch_tiled_group_nt(const qmma::Job& j, const qmma::DenseGroup& g, int tpb, cudaStream_t s) {
  return with_tiled(j.a.n, tpb, [&](auto nt, auto t) {
    return qmma::launch_tiled_group<typename qmma::TiledOf<P>::type, decltype(nt)::value, SPLIT, decltype(t)::value>(g, j.a.cols, j.a,
                                                                                                               j.ldx, s);
  });
}

template <class P, bool SPLIT>
cudaError_t launch_rows_nt(const qmma::Job& j, int slices, float* partials, cudaStream_t s) {
  switch (tiles_for(j.a.n)) {
    case 1: return qmma::launch_rows<P, 1, SPLIT>(j, slices, partials, s);
    case 2: return qmma::launch_rows<P, 2, SPLIT>(j, slices, partials, s);
    case 4: return qmma::launch_rows<P, 4, SPLIT>(j, slices, partials, s);
    default: return qmma::launch_rows<P, 8, SPLIT>(j, slices, partials, s);
  }
}

// The Rows form's k slices: enough 128-row blocks for two waves of the GPU's SMs, at least 4 units per slice, no more
// than the scratch holds.
int64_t rows_slices_wanted(int64_t rows, int64_t units) {
  const int sms = device_sm_count();
  const int64_t blocks = (rows + qmma::kRowsPerBlock - 1) / qmma::kRowsPerBlock;
  return std::clamp<int64_t>(std::min<int64_t>((2 * sms + blocks - 1) / blocks, units / 4), 1, 64);
}
int rows_slices(int64_t rows, int64_t units, int n, const QuantMmaWork& work) {
  if (work.partials == nullptr) return 1;
  const int64_t fit = static_cast<int64_t>(work.floats) / (static_cast<int64_t>(n) * rows);
  return static_cast<int>(std::max<int64_t>(1, std::min(rows_slices_wanted(rows, units), fit)));
}

// Which form when the caller leaves it open (CudaQuantMma.TimingAtK3Width, H200, call s30-2, x split, us, KSplit's
// better width -> Rows): Q6_K from 8 tokens (the 163840 x 2304 head 317 -> 269 at 8, 437 -> 293 at 16, 1707 -> 817 at
// 64; 4096 x 7168 a tie at 8, 31.3 / 31.4, then 40.6 -> 34.4 at 16, 153 -> 78 at 64); Q4_K from 17 (4096 x 7168 59.5 ->
// 51.6 at 32, 126 -> 93 at 64, 2304 x 4096 34.5 -> 21.1 at 32; at 16 the two-tile KSplit still wins, 27.9 vs 39.3);
// Q5_K never (Rows lost at every n: 38.3 vs 65.9 at 32, 80.9 vs 93.7 at 64 -- its qh loads and 191 registers at 8
// tiles). End to end (call s30-2/3) the rule was measured with Q6_K from 9; the step to 8 is the head's kernel figure.
// Staged (session 31) is not in the rule: on its own it wins only on 4096 x 7168 Q6_K (hi alone 29.0 -> 22.4 us at one
// token, 32.2 -> 23.9 at 8; with lo 28.0 -> 27.6, 33.4 vs Rows 31.3) and loses elsewhere (Q4_K 4096 x 7168 22.1 -> 27.0
// at one token, the head 208 -> 222), and end to end, Staged for 2..8 tokens below 65536 rows against this rule
// alternating (call s31-4, llama.cpp's Q4_K_M of the Kimi-Linear-dims slice): batch 2 2063 / 2042 vs 2025 / 2036, 8
// 5051 / 5014 vs 4960 / 4980 tok/s -- about 1%, the spread of identical runs (batch 1 1223-1247).
QuantMmaForm default_form(WeightFormat f, int n, QuantMmaForm asked, bool tiled = false) {
  if (asked != QuantMmaForm::Auto) return asked;
  if (tiled && n <= kQuantMmaTiledMaxTokens) return QuantMmaForm::Tiled;
  const bool use_rows = (f == WeightFormat::Q6_K && n >= 8) || (f == WeightFormat::Q4_K && n > 16);
  return use_rows ? QuantMmaForm::Rows : QuantMmaForm::KSplit;
}

struct DenseLaunch {
  const qmma::Job& j;
  int mt;
  QuantMmaForm form;
  QuantMmaWork work;
  cudaStream_t s;
  const void* tiled = nullptr;
  template <class P>
  cudaError_t run() const {
    if (form == QuantMmaForm::Tiled) {
      const auto* tw = static_cast<const uint8_t*>(tiled);
      const int tpb = mt == 0 ? tiled_default_tpb(j.rows) : mt;
      return j.a.lo ? launch_tiled_nt<P, true>(tw, j, tpb, s) : launch_tiled_nt<P, false>(tw, j, tpb, s);
    }
    if (form == QuantMmaForm::Staged) {
      if (j.a.n <= 8) return j.a.lo ? qmma::launch_staged<P, 1, true>(j, s) : qmma::launch_staged<P, 1, false>(j, s);
      return j.a.lo ? qmma::launch_staged<P, 2, true>(j, s) : qmma::launch_staged<P, 2, false>(j, s);
    }
    if (form == QuantMmaForm::Rows) {
      const int slices = rows_slices(j.rows, j.a.cols / P::kUnitCols, j.a.n, work);
      return j.a.lo ? launch_rows_nt<P, true>(j, slices, work.partials, s) : launch_rows_nt<P, false>(j, slices, work.partials, s);
    }
    return j.a.lo ? launch_nt<P, true>(j, mt, s) : launch_nt<P, false>(j, mt, s);
  }
};

struct GroupLaunch {
  const qmma::Job& j;
  const qmma::DenseGroup& g;
  int mt;
  cudaStream_t s;
  bool tiled = false;
  int tpb = 1;  // Tiled: tiles per block (tiled_default_tpb of the tallest member)
  template <class P>
  cudaError_t run() const {
    if (tiled) return j.a.lo ? launch_tiled_group_nt<P, true>(j, g, tpb, s) : launch_tiled_group_nt<P, false>(j, g, tpb, s);
    return j.a.lo ? launch_group_nt<P, true>(j, g, mt, s) : launch_group_nt<P, false>(j, g, mt, s);
  }
};

// The activations' checks of quant_gemv_mma and quant_gemv_mma_groupable.
bool acts_ok(const QuantMmaActs& a, int64_t cols) {
  return a.n > 0 && a.n <= kQuantMmaMaxTokens && a.cols == cols && a.hi != nullptr && a.xsum != nullptr &&
         reinterpret_cast<uintptr_t>(a.hi) % 16 == 0 && reinterpret_cast<uintptr_t>(a.lo) % 16 == 0;
}

}  // namespace

static_assert(kQuantMmaGroupMax == qmma::kMaxGroup, "one group bound");

bool quant_gemv_mma_groupable(const WeightMatrix* const* W, int count, const QuantMmaActs& a) {
  if (count < 1 || count > kQuantMmaGroupMax) return false;
  const bool tiled = W[0]->tiled != nullptr;  // all members tiled (one Tiled launch) or none (one KSplit launch)
  for (int m = 0; m < count; ++m)
    if (!quant_mma_supported(*W[m]) || W[m]->format != W[0]->format || W[m]->cols != W[0]->cols || (W[m]->tiled != nullptr) != tiled)
      return false;
  const QuantMmaForm f = default_form(W[0]->format, a.n, QuantMmaForm::Auto, tiled);
  return acts_ok(a, W[0]->cols) && (f == QuantMmaForm::KSplit || f == QuantMmaForm::Tiled);
}

cudaError_t quant_gemv_mma_group(const WeightMatrix* const* W, float* const* y, int count, const QuantMmaActs& a, cudaStream_t s) {
  if (!quant_gemv_mma_groupable(W, count, a)) return cudaErrorInvalidValue;
  qmma::DenseGroup g{};
  const bool tiled = default_form(W[0]->format, a.n, QuantMmaForm::Auto, W[0]->tiled != nullptr) == QuantMmaForm::Tiled;
  int64_t tallest = 0;
  for (int m = 0; m < count; ++m) {
    g.w[m] = static_cast<const uint8_t*>(tiled ? W[m]->tiled : W[m]->data);
    g.y[m] = y[m];
    g.rows[m] = W[m]->rows;
    tallest = std::max(tallest, W[m]->rows);
  }
  g.count = count;
  qmma::Job j;
  j.row_bytes = row_data_bytes(W[0]->format, W[0]->cols);
  j.a = a;
  j.ldx = quant_mma_ldx(a.n);
  return qmma::with_mma_format(W[0]->format, GroupLaunch{j, g, default_mt(W[0]->format, a.n), s, tiled, tiled_default_tpb(tallest)});
}

bool quant_mma_supported(const WeightMatrix& W) {
  return W.rows > 0 && qmma::rows_ok(W.format, W.data, row_data_bytes(W.format, W.cols), W.cols);
}

cudaError_t quant_mma_prep(const float* x, int n, int64_t cols, uint16_t* hi, uint16_t* lo, float* xsum, cudaStream_t s) {
  if (n <= 0 || n > kQuantMmaMaxTokens || cols <= 0 || cols % 256 != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(hi) % 16 != 0 || reinterpret_cast<uintptr_t>(lo) % 16 != 0 || xsum == nullptr)
    return cudaErrorInvalidValue;
  return qmma::prep(x, n, quant_mma_ldx(n), cols, hi, lo, xsum, s);
}

size_t quant_mma_work_floats(const WeightMatrix& W, int n, QuantMmaForm form) {
  if (W.rows <= 0 || n <= 0 || n > kQuantMmaMaxTokens) return 0;
  form = default_form(W.format, n, form, W.tiled != nullptr);
  if (form != QuantMmaForm::Rows) return 0;  // KSplit / Tiled sum their k split in shared memory
  const int64_t unit_cols = W.format == WeightFormat::Q6_K ? qmma::MmaQ6K::kUnitCols : qmma::MmaQ45<false>::kUnitCols;
  const int64_t slices = rows_slices_wanted(W.rows, W.cols / unit_cols);
  return slices > 1 ? static_cast<size_t>(slices * n * W.rows) : 0;
}

namespace {
std::atomic<int> g_tiled_mode_override{-1};  // quant_mma_set_tiled_mode; -1 = K3_QUANT_MMA_TILED or the default
}  // namespace

void quant_mma_set_tiled_mode(int mode) { g_tiled_mode_override.store(mode < 0 || mode > 2 ? -1 : mode); }

bool quant_mma_tiled_wanted(const WeightMatrix& W) {
  // K3_QUANT_MMA_TILED: 1 = the Q6_K vocabulary heads; all = every Q4_K / Q5_K / Q6_K dense matrix (A/B); 0 = none;
  // unset = kQuantMmaTiledByDefault's choice
  static const int env_mode = [] {
    const char* e = std::getenv("K3_QUANT_MMA_TILED");
    if (e == nullptr) return kQuantMmaTiledByDefault ? 1 : 0;
    return std::strcmp(e, "0") == 0 ? 0 : std::strcmp(e, "all") == 0 ? 2 : 1;
  }();
  const int forced = g_tiled_mode_override.load();
  const int mode = forced >= 0 ? forced : env_mode;
  if (mode == 0 || !quant_mma_supported(W)) return false;
  return mode == 2 || (W.format == WeightFormat::Q6_K && W.rows >= kQuantMmaTallMatrixRows);
}

namespace {
struct TiledBytes {
  const WeightMatrix& W;
  template <class P>
  int64_t run() const { return qmma::tiled_bytes<typename qmma::TiledOf<P>::type>(W.rows, W.cols); }
};
struct MakeTiled {
  const WeightMatrix& W;
  uint8_t* out;
  cudaStream_t s;
  template <class P>
  cudaError_t run() const {
    return qmma::make_tiled<typename qmma::TiledOf<P>::type>(static_cast<const uint8_t*>(W.data), W.rows, W.cols,
                                                            row_data_bytes(W.format, W.cols), out, s);
  }
};
}  // namespace

int64_t quant_mma_tiled_bytes(const WeightMatrix& W) {
  if (!quant_mma_supported(W)) return 0;
  switch (W.format) {
    case WeightFormat::Q4_K: return TiledBytes{W}.run<qmma::MmaQ45<false>>();
    case WeightFormat::Q5_K: return TiledBytes{W}.run<qmma::MmaQ45<true>>();
    default: return TiledBytes{W}.run<qmma::MmaQ6K>();
  }
}

cudaError_t quant_mma_make_tiled(const WeightMatrix& W, void* out, cudaStream_t s) {
  if (!quant_mma_supported(W) || reinterpret_cast<uintptr_t>(out) % 16 != 0) return cudaErrorInvalidValue;
  return qmma::with_mma_format(W.format, MakeTiled{W, static_cast<uint8_t*>(out), s});
}

cudaError_t quant_gemv_mma(const WeightMatrix& W, const QuantMmaActs& a, float* y, cudaStream_t s, int mt, QuantMmaForm form,
                           QuantMmaWork work) {
  const bool tiled_asked = form == QuantMmaForm::Tiled;
  if (!quant_mma_supported(W) || !acts_ok(a, W.cols) || mt < 0 || mt > (tiled_asked ? 8 : 2) ||
      (form == QuantMmaForm::Staged && a.n > kQuantMmaStagedMaxTokens) ||
      (tiled_asked && (W.tiled == nullptr || a.n > kQuantMmaTiledMaxTokens)))
    return cudaErrorInvalidValue;
  form = default_form(W.format, a.n, form, W.tiled != nullptr);
  if (mt == 0 && form != QuantMmaForm::Tiled) mt = default_mt(W.format, a.n);
  qmma::Job j;
  j.w0 = static_cast<const uint8_t*>(W.data);
  j.rows = W.rows;
  j.row_bytes = row_data_bytes(W.format, W.cols);
  j.a = a;
  j.ldx = quant_mma_ldx(a.n);
  j.y = y;
  return qmma::with_mma_format(W.format, DenseLaunch{j, mt, form, work, s, W.tiled});
}

}  // namespace k3::cuda
