// quant_gemv (quant_kernels.h): the decode GEMV over GGUF blocks. Three kernels, one numerics contract:
// every weight decoded to the CPU's exact fp32 value (quant_decode.cuh / quant_part.cuh), fp32 activations,
// fp32 fma products and accumulation. Error: each output is a tree of fp32 additions of depth D, so
// |y - exact| <= D * 2^-24 * sum |w x| to first order; both kernels have D <= cols / 32 + 13 (below), the
// bound the tests check with a factor 2 of margin. v3 (below, session 19): v2's decoders with one warp per row, for
// rows up to kNarrowCols wide at one token.
//
// v1 (the formats without a quant_part.cuh decoder; all formats with K3_QUANT_GEMV=v1, for A/B timing;
// n > N with K3_QUANT_GEMV=N):
// one warp per output row, 8 warps per block: lane l takes the groups of 8 weights gi = l, l + 32, ... of
// the row (qdev::decode8), applies them to all n tokens, lane sums reduced by shuffles. D = cols / 32 + 5
// (cols / 32 fmas in sequence per lane for cols a multiple of 256, 5 shuffle adds).
//
// v2 (Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS with x 16-byte aligned and the blocks at their format's alignment):
// v1 was latency bound (one 8-byte weight load and the block's scales per lane and step, and per lane as
// many activation bytes from L1 as weight bytes). Here a block of 8 warps takes 4 rows; a warp's lanes form
// 4 row groups of 8 (one row each), and the 8 warps split the row's 256-column units (warp w: units w,
// w + 8, ...). Lane i of a group owns part i of a unit (32 weights: quant_part.cuh) and loads it with
// 16-byte loads, two units ahead, the unit's scales once per unit; the 4 row groups of a warp read the same
// activation addresses at the same instruction (one L1 access serves the warp's 4 rows). 4 accumulators per
// token and lane (8 fmas each per part), then 3 shuffle levels in the group, then a fixed tree over the 8
// warps in shared memory: D = 8 ceil(units / 8) + 2 + 3 + 3 <= cols / 32 + 13 for every cols (a Q8_0 row of
// one unit, nb <= 8 blocks, has D <= 8 + 2 + 3). The result does not depend on the schedule.
// 1024 blocks of 256 threads for 4096 rows: ~2 waves at 4 blocks / SM.
//
// Predictions (n = 1, 4096 x 7168, H200): per lane and unit in flight 2 x (16..48 B of quants + the
// header); instructions per weight ~ PRMT + fma (+ fsub for the mins) + fma with x, plus unpacking:
//   Q8_0   34 B / 32 w,  ~4.3 instr / w (byte shift of 2-aligned blocks ~1.3): memory bound, >= 2.8 TB/s
//   Q4_K   ~4.6 instr / w (mins + nibble masks + scales 0.4): ~3 TB/s (issue and L1 close to the limit)
//   Q5_K   ~5 instr / w: ~3 TB/s;   Q6_K ~5.5 instr / w (two shifted 16-byte windows): ~2.5-3 TB/s
//   IQ4_XS ~5 instr / w (codebook by PRMT ~1, exact int->float by fadd, the CPU's fmul): ~2.5-3 TB/s
// n = 8: 8 fmas + 8 float4 x loads per 4 weights dominate: ~2x v1's per-weight issue rate (v1 decodes
// with I2F and byte loads); the L1 traffic of x is the same as v1's per row (4 rows share a 128-byte x
// chunk, but a part's x spans 4 lines).
#include "k3/backend/cuda/quant_decode.cuh"
#include "k3/backend/cuda/quant_kernels.h"
#include "k3/backend/cuda/quant_part.cuh"
#include "k3/backend/cuda/pdl.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <type_traits>

namespace k3::cuda {
namespace {

constexpr int kWarps = 8;

// v1's kernel with R rows per warp (v1: R = 1; QuantGemvKernel::V1Rows: R = kV1Rows, instantiated at 8 tokens
// only): warp w takes rows R (blockIdx.x kWarps + w) .. + R - 1, and each lane's 8 activations of a token, loaded
// once, serve all R rows. At n = 8 v1 spends its L1 bandwidth on activations (16 float4 loads per 8 weights per
// lane; the Kimi-Linear head at 0.25 TB/s, session 19); R = 4 cuts them 4-fold. Each row's fmas and shuffles are
// v1's in v1's order: the same bits.
template <WeightFormat F, int NT, int R>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_v1_kernel(const uint8_t* __restrict__ W, int64_t rows, int64_t cols, const float* __restrict__ x,
                      float* __restrict__ y, IqTables T) {
  pdl::begin();  // launched by pdl::launch (pdl.cuh): nothing read before the predecessor completes
  const bool x_aligned = (reinterpret_cast<uintptr_t>(x) & 15) == 0;  // then so is every c = 8 gi of every token (cols % 32 == 0)
  constexpr int E = weight_layout(F).block_elems, B = weight_layout(F).block_bytes, kGroups = E / 8;
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * R;
  if (row0 >= rows) return;
  const uint8_t* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = W + (row0 + r < rows ? row0 + r : rows - 1) * (cols / E) * B;  // past the end: read, not written
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;
  const int64_t groups = cols / 8;
  for (int64_t gi = lane; gi < groups; gi += 32) {
    float w[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) qdev::decode8<F>(wr[r] + (gi / kGroups) * B, static_cast<int>(gi % kGroups), T, w[r]);
    const int64_t c = gi * 8;
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float v[8];
      qdev::load_x8(x + t * cols + c, x_aligned, v);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float s = acc[r][t];
#pragma unroll
        for (int j = 0; j < 8; ++j) s = fmaf(w[r][j], v[j], s);
        acc[r][t] = s;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float v = acc[r][t];
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0 && row0 + r < rows) y[t * rows + row0 + r] = v;
    }
}
constexpr int kV1Rows = 4;
constexpr int64_t kTallRows = 65536;  // V1Rows' rule: rows enough for 4x fewer warps to fill the GPU


constexpr int kGroupRows = 4;  // v2: rows per block (= row groups per warp)

// v2: lane i of row group g (lane / 8) of warp w; units w, w + kWarps, ... of row blockIdx.x * 4 + g.
template <WeightFormat F, int NT>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_v2_kernel(const uint8_t* __restrict__ W, int64_t rows, int64_t cols, const float* __restrict__ x,
                         float* __restrict__ y, IqTables T) {
  using P = typename qpart::PartOf<F>::type;
  pdl::begin();
  __shared__ float red[kWarps][kGroupRows][NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 3, i = lane & 7;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGroupRows + g;
  const uint8_t* wr = W + (row < rows ? row : rows - 1) * row_data_bytes(F, cols);  // past the end: read, never written
  const int64_t units = (cols + 255) / 256;
  const typename P::Ctx ctx = P::context(T);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  for (int64_t u = warp; u < units; u += 2 * kWarps) {
    const int64_t u1 = u + kWarps;  // the second unit's loads go out before the first is decoded
    const typename P::Raw a = P::load(wr, u, i, cols);
    const typename P::Raw b = P::load(wr, u1 < units ? u1 : u, i, cols);
    if (P::valid(u, i, cols)) P::template dot<NT>(a, x + u * 256, cols, i, ctx, acc);
    if (u1 < units && P::valid(u1, i, cols)) P::template dot<NT>(b, x + u1 * 256, cols, i, ctx, acc);
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = (acc[t][0] + acc[t][1]) + (acc[t][2] + acc[t][3]);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    if (i == 0) red[warp][g][t] = v;
  }
  __syncthreads();
  if (threadIdx.x < kGroupRows * NT) {
    const int gg = threadIdx.x / NT, t = threadIdx.x % NT;
    const int64_t r = static_cast<int64_t>(blockIdx.x) * kGroupRows + gg;
    const float(&s)[kWarps][kGroupRows][NT] = red;
    if (r < rows)
      y[t * rows + r] = ((s[0][gg][t] + s[1][gg][t]) + (s[2][gg][t] + s[3][gg][t])) +
                        ((s[4][gg][t] + s[5][gg][t]) + (s[6][gg][t] + s[7][gg][t]));
  }
}

// v3: one warp per row (8 rows a block), the row's parts over all 32 lanes: lane l takes parts l, l + 32, ...
// (part p = part p % 8 of unit p / 8), kAhead of them loaded before the first is decoded. Every load of a row
// up to 3 x 32 parts (3 x 8 units: 6144 columns) is in flight at once and the block keeps no shared state: v2
// spent a block (4 rows, a shared-memory reduction and a barrier) per ~8 KB of weights, which held the
// Kimi-Linear head (163840 x 2304 Q6_K, 310 MB) at 0.79 TB/s (ncu, session 19). Error: each lane's 4
// accumulators take 8 fmas per part, ceil(parts / 32) parts, then 2 + 5 shuffle adds: D = 8 ceil(cols / 1024)
// + 7 <= cols / 32 + 13 for cols >= 256; a one-unit Q8_0 row (cols <= 224, one part per lane) has D = 15.
//
// XS (session 32; Q4_K / Q5_K / Q6_K at one token, rows kNarrowCols wide): the block first copies x into
// shared memory, swizzled (quant_part.cuh's XSwizzled), and the parts read it there. With x from global memory the 8
// lanes of a unit span 4 cache lines per 16-byte load, 16 L1 wavefronts a warp load against the 4 its bytes need:
// 4096 x 2304 Q4_K took 7.3 us in a graph of such projections where a plain read of its bytes takes 3.2 (call s32-3,
// CudaPdl.TimingChainOfOneTokenProjections; ncu: L1/TEX 70% busy, DRAM 11%). Same products, same order: the same bits.
// Measured (call s32-4): a win at 4096 columns only (the launch rule below). The ncu figures' other reading -- 12.8
// instructions per weight, a lane's fixed costs paid per 2.25 parts at 2304 columns -- was tried as a kernel with 4
// rows a warp and every unit of a row per lane (call s32-5): slower at every shape (4096 x 2304 Q4_K 7.28 -> 8.97 us,
// 1024 x 2304 3.22 -> 7.66: 8 warps an SM, three dependent rounds of loads), removed (docs/perf/cuda.md, session 32).
constexpr int kAhead = 3;
constexpr int64_t kNarrowCols = 4096;  // the widest row v3 takes by the rule (below), and XS's shared copy of x

template <WeightFormat F>
constexpr bool has_xs() {
  return F == WeightFormat::Q4_K || F == WeightFormat::Q5_K || F == WeightFormat::Q6_K;
}

// The matrices one v3 launch multiplies by the same x (quant_gemv_group; one matrix for quant_gemv): blocks
// [first_block[m], first_block[m + 1]) take matrix m's rows. A kernel parameter (__grid_constant__: indexed by the
// block's m without a local copy).
struct V3Group {
  const uint8_t* W[kQuantGemvGroupMax];
  float* y[kQuantGemvGroupMax];
  int64_t rows[kQuantGemvGroupMax];
  int64_t first_block[kQuantGemvGroupMax];
  int count;
};

template <WeightFormat F, int NT, bool XS>
__global__ void __launch_bounds__(kWarps * 32)
    quant_gemv_v3_kernel(const __grid_constant__ V3Group grp, int64_t cols, const float* __restrict__ x, IqTables T) {
  using P = typename qpart::PartOf<F>::type;
  const int lane = threadIdx.x & 31;
  int m = 0;  // this block's matrix (block-uniform)
  while (m + 1 < grp.count && static_cast<int64_t>(blockIdx.x) >= grp.first_block[m + 1]) ++m;
  // The matrix's fields are read where they are used, not held: registers decide the blocks per SM (a y pointer and
  // rows kept live from here took Q6_K's kernel from 78 to 95 registers).
  // 32-bit: a grid has < 2^31 blocks (a 64-bit row here cost Q4_K's kernel a spilled register at 64)
  const int row = (static_cast<int>(blockIdx.x) - static_cast<int>(grp.first_block[m])) * kWarps + (threadIdx.x >> 5);
  const bool in_range = row < grp.rows[m];
  if (in_range) pdl::prefetch_l2(grp.W[m] + static_cast<int64_t>(row) * row_data_bytes(F, cols), row_data_bytes(F, cols), lane, 32);  // weights only (pdl.cuh)
  pdl::begin();
  const float* xr = x;
  if constexpr (XS) {
    using XL = typename P::XShared;
    __shared__ __align__(1024) float xs[NT * kNarrowCols];
    for (int64_t q = threadIdx.x; q < NT * cols / 4; q += kWarps * 32) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(x) + q);
      *reinterpret_cast<float4*>(XL::at(reinterpret_cast<uintptr_t>(xs + 4 * q))) = v;
    }
    __syncthreads();
    xr = xs;
  }
  if (!in_range) return;  // the whole warp (after the block's barrier)
  const uint8_t* __restrict__ wr = grp.W[m] + static_cast<int64_t>(row) * row_data_bytes(F, cols);
  const int64_t parts = (cols + 255) / 256 * 8;
  const typename P::Ctx ctx = P::context(T);
  float acc[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.f;
  for (int64_t p0 = lane; p0 < parts; p0 += 32 * kAhead) {
    typename P::Raw r[kAhead];
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int64_t p = p0 + 32 * k < parts ? p0 + 32 * k : parts - 1;  // past the row: its last part, not used
      r[k] = P::load(wr, p / 8, static_cast<int>(p % 8), cols);
    }
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int64_t p = p0 + 32 * k;
      if (p < parts && P::valid(p / 8, static_cast<int>(p % 8), cols)) {
        if constexpr (XS)
          P::template dot<NT, typename P::XShared>(r[k], xr + (p / 8) * 256, cols, static_cast<int>(p % 8), ctx, acc);
        else
          P::template dot<NT>(r[k], xr + (p / 8) * 256, cols, static_cast<int>(p % 8), ctx, acc);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = (acc[t][0] + acc[t][1]) + (acc[t][2] + acc[t][3]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) grp.y[m][t * grp.rows[m] + row] = v;
  }
}

// Rows up to this wide (Kimi-Linear's 2304, its 163840-row head) take v3 at one token and v1 above (session 19,
// CudaQuantKernels.GemvTimingAtK3Width and k3 bench on the Kimi-Linear slice's Q4_K_M, H200: head Q6_K n = 1 v3 295
// us, v2 306, v1 328; n = 2 v1 402, v2 485; 4096 x 2304 Q4_K n = 1 v3 11.5, v2 12.6; decode batch 1 / 2 / 4 +5 /
// +5 / +11% over the v2 rule). Wider rows keep the session-14 rule below (4096 x 7168: v2 wins at n = 1..4 there).

// Which kernel a GEMV of n tokens takes. Unset: the measured default (H200, 4096 x 7168, L2 flushed;
// docs/perf/cuda.md "Session 14"): v2 where it won -- Q6_K and Q5_K up to 4 tokens (n = 1: 25 vs 45 us,
// 26 vs 38 us), Q4_K at one token (23 vs 33 us) -- and v1 elsewhere (Q8_0 42 vs 37 us and IQ4_XS 37 vs 33 us
// at n = 1; at n = 8 v1 wins for every format); rows up to kNarrowCols wide: v3 at one token, v1 above.
// K3_QUANT_GEMV (A/B timing, every format with a part decoder): v1 = v1 (one row per warp) for everything; <N>
// (0..8) = v2 for n <= N; v3 or v3:N = v3 for n <= 8 (N); v1 above (4 rows per warp as the rule says).
struct GemvOverride {
  bool set = false, v1_only = false;  // v1_only: K3_QUANT_GEMV=v1, one row per warp (the session-19 kernel)
  int v2_max = 0, v3_max = 0;
};
const GemvOverride& gemv_override() {
  static const GemvOverride o = [] {
    GemvOverride r;
    const char* e = std::getenv("K3_QUANT_GEMV");
    // q8: the rule (q8_rule); exact: the exact kernels by their rule
    if (e == nullptr || e[0] == 0 || std::strcmp(e, "q8") == 0 || std::strcmp(e, "exact") == 0) return r;
    r.set = true;
    if (std::strncmp(e, "v3", 2) == 0)
      r.v3_max = e[2] == ':' ? std::atoi(e + 3) : 8;
    else if (std::strcmp(e, "v1") == 0)
      r.v1_only = true;
    else
      r.v2_max = std::clamp(std::atoi(e), 0, 8);
    return r;
  }();
  return o;
}

// One token of Q4_K / Q5_K / Q6_K takes quant_gemv_q8 (int8 activations: the CPU's default tiers' numbers, bit for
// bit) by the rule since session 47 (call s47-5: the kl48 GGUF at batch 1 +12.9% with Q4_K / Q5_K alone); any
// K3_QUANT_GEMV form (exact, v1, v3, N) keeps the exact fp32 kernels. Read once; tests force it either way.
std::optional<bool> g_q8_forced;
bool q8_rule() {
  if (g_q8_forced) return *g_q8_forced;
  static const bool on = [] {
    const char* e = std::getenv("K3_QUANT_GEMV");
    return e == nullptr || e[0] == 0 || std::strcmp(e, "q8") == 0;
  }();
  return on;
}

// Whether one token of W takes quant_gemv_q8: forced (kernel Q8), or by the rule, where it can run.
bool takes_q8(const WeightMatrix& W, const float* x, int n, QuantGemvKernel kernel) {
  if (n != 1 || (kernel != QuantGemvKernel::Q8 && !(kernel == QuantGemvKernel::Auto && q8_rule()))) return false;
  const uintptr_t align = W.format == WeightFormat::Q6_K ? 2 : 16;
  return quant_gemv_q8_supported(W.format, W.cols) && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.data) % align == 0;
}

bool xs_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("K3_QUANT_GEMV_XS");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

int v2_max_tokens(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q6_K:
    case WeightFormat::Q5_K: return 4;
    case WeightFormat::Q4_K: return 1;
    default: return 0;
  }
}

template <WeightFormat F>
bool parts_ok(const WeightMatrix& W, const float* x) {
  if constexpr (!qpart::has_part(F)) {
    return false;
  } else {
    using P = typename qpart::PartOf<F>::type;
    return reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(W.data) % P::kAlign == 0;
  }
}

// The kernel for n tokens: a forced one where it can run, else K3_QUANT_GEMV's, else the rule.
template <WeightFormat F>
QuantGemvKernel pick(const WeightMatrix& W, const float* x, int n, QuantGemvKernel forced) {
  if (forced == QuantGemvKernel::V1 || forced == QuantGemvKernel::V1Rows) return forced;
  // v1 where the rule (or a kernel that cannot run) leaves it; 4 rows per warp for 8 tokens of a tall matrix
  // (session 21, GemvTimingAtK3Width: the Kimi-Linear head 163840 x 2304 Q6_K at n = 8 882 vs 1225 us; at n = 2 / 4
  // it lost (682 / 723 vs 400 / 649), and on 4096 rows at every n: 4x fewer warps, 80-198 registers instead of 31-72)
  const QuantGemvKernel v1 = n == 8 && W.rows >= kTallRows && !gemv_override().v1_only ? QuantGemvKernel::V1Rows
                                                                                      : QuantGemvKernel::V1;
  if (!parts_ok<F>(W, x)) return v1;
  if (forced != QuantGemvKernel::Auto) return forced;
  if (const GemvOverride& o = gemv_override(); o.set)
    return n <= o.v3_max ? QuantGemvKernel::V3 : n <= o.v2_max ? QuantGemvKernel::V2 : v1;
  if (W.cols <= kNarrowCols) return n == 1 ? QuantGemvKernel::V3 : v1;
  return n <= v2_max_tokens(F) ? QuantGemvKernel::V2 : v1;
}

// v3 over the group's matrices in one launch (first_block filled here).
template <WeightFormat F, int NT>
cudaError_t launch_v3(V3Group g, int64_t cols, const float* x, cudaStream_t s, const IqTables& T) {
  int64_t blocks = 0;
  for (int m = 0; m < g.count; ++m) {
    g.first_block[m] = blocks;
    blocks += (g.rows[m] + kWarps - 1) / kWarps;
  }
  if (blocks == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(blocks);
  // XS at one token on rows 4096 wide (call s32-4, the projection chain: 2304 x 4096 Q4_K 10.86 -> 9.69 us, Q6_K
  // 10.02 -> 9.57; on 2304-wide rows it lost, 4096 x 2304 Q4_K 7.28 -> 7.61, 1024 x 2304 3.21 -> 3.45).
  // K3_QUANT_GEMV_XS=0: never (A/B).
  if constexpr (has_xs<F>() && NT == 1)
    if (cols == kNarrowCols && xs_enabled())
      return pdl::launch(quant_gemv_v3_kernel<F, NT, true>, grid, kWarps * 32, 0, s, g, cols, x, T);
  return pdl::launch(quant_gemv_v3_kernel<F, NT, false>, grid, kWarps * 32, 0, s, g, cols, x, T);
}

template <WeightFormat F, int NT>
cudaError_t launch(const WeightMatrix& W, const float* x, float* y, cudaStream_t s, const IqTables& T, QuantGemvKernel forced) {
  const uint8_t* data = static_cast<const uint8_t*>(W.data);
  const QuantGemvKernel k = pick<F>(W, x, NT, forced);
  if constexpr (qpart::has_part(F)) {
    if (k == QuantGemvKernel::V2) {
      const unsigned grid = static_cast<unsigned>((W.rows + kGroupRows - 1) / kGroupRows);
      return pdl::launch(quant_gemv_v2_kernel<F, NT>, grid, kWarps * 32, 0, s, data, W.rows, W.cols, x, y, T);
    }
    if (k == QuantGemvKernel::V3) {
      V3Group g{};
      g.W[0] = data;
      g.y[0] = y;
      g.rows[0] = W.rows;
      g.count = 1;
      return launch_v3<F, NT>(g, W.cols, x, s, T);
    }
  }
  if constexpr (NT == 8) {  // the only size it won at (session 21), so the only one instantiated
    if (k == QuantGemvKernel::V1Rows) {
      const unsigned grid = static_cast<unsigned>((W.rows + kWarps * kV1Rows - 1) / (kWarps * kV1Rows));
      return pdl::launch(quant_gemv_v1_kernel<F, NT, kV1Rows>, grid, kWarps * 32, 0, s, data, W.rows, W.cols, x, y, T);
    }
  }
  const unsigned grid = static_cast<unsigned>((W.rows + kWarps - 1) / kWarps);
  return pdl::launch(quant_gemv_v1_kernel<F, NT, 1>, grid, kWarps * 32, 0, s, data, W.rows, W.cols, x, y, T);
}

// fn(std::integral_constant<int, n>) for 1 <= n <= 8 tokens (the kernels' NT); cudaErrorInvalidValue otherwise.
template <class Fn>
cudaError_t with_tokens(int n, const Fn& fn) {
  switch (n) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 5: return fn(std::integral_constant<int, 5>{});
    case 6: return fn(std::integral_constant<int, 6>{});
    case 7: return fn(std::integral_constant<int, 7>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool quant_gemv_has_parts(WeightFormat f) { return qpart::has_part(f); }

void force_quant_gemv_q8_for_testing(std::optional<bool> on) { g_q8_forced = on; }

bool quant_gemv_groupable(const WeightMatrix* const* W, int count, const float* x, int n) {
  if (count < 1 || count > kQuantGemvGroupMax || n < 1 || n > 8 || reinterpret_cast<uintptr_t>(x) % 4 != 0) return false;
  const WeightFormat f0 = W[0]->format;
  if (!is_gguf_block(f0)) return false;
  for (int m = 0; m < count; ++m) {
    const WeightMatrix& w = *W[m];
    if (w.format != f0 || w.cols != W[0]->cols || w.rows <= 0 || w.cols % weight_layout(f0).block_elems != 0 ||
        reinterpret_cast<uintptr_t>(w.data) % 2 != 0)
      return false;
  }
  return with_gguf_block_format(
      f0,
      [&](auto f) {
        constexpr WeightFormat F = decltype(f)::value;
        for (int m = 0; m < count; ++m)
          if (pick<F>(*W[m], x, n, QuantGemvKernel::Auto) != QuantGemvKernel::V3) return false;
        return true;
      },
      false);
}

cudaError_t quant_gemv_group(const WeightMatrix* const* W, float* const* y, int count, const float* x, int n, cudaStream_t s) {
  if (!quant_gemv_groupable(W, count, x, n)) return cudaErrorInvalidValue;
  bool q8 = true;  // every matrix where the q8 kernel runs (the group shares format and width; the alignment is each's)
  for (int m = 0; m < count; ++m) q8 = q8 && takes_q8(*W[m], x, n, QuantGemvKernel::Auto);
  if (q8) return quant_gemv_q8(W, y, count, x, s);
  V3Group g{};
  for (int m = 0; m < count; ++m) {
    g.W[m] = static_cast<const uint8_t*>(W[m]->data);
    g.y[m] = y[m];
    g.rows[m] = W[m]->rows;
  }
  g.count = count;
  const IqTables T = iq_tables();
  return with_gguf_format(W[0]->format, [&](auto f) -> cudaError_t {
    constexpr WeightFormat F = decltype(f)::value;
    if constexpr (qpart::has_part(F)) {  // more than one token only where K3_QUANT_GEMV=v3:N asks for v3 (A/B timing)
      return with_tokens(n, [&](auto nt) { return launch_v3<F, decltype(nt)::value>(g, W[0]->cols, x, s, T); });
    } else {
      return cudaErrorInvalidValue;  // not groupable (no v3 kernel): checked above
    }
  });
}

cudaError_t quant_gemv(const WeightMatrix& W, const float* x, int n, float* y, cudaStream_t s, QuantGemvKernel kernel) {
  if (!is_gguf_block(W.format) || n < 0 || n > 8 || W.rows < 0 || W.cols % weight_layout(W.format).block_elems != 0)
    return cudaErrorInvalidValue;
  if (n == 0 || W.rows == 0) return cudaSuccess;
  if (reinterpret_cast<uintptr_t>(W.data) % 2 != 0 || reinterpret_cast<uintptr_t>(x) % 4 != 0) return cudaErrorInvalidValue;
  if (takes_q8(W, x, n, kernel)) {
    const WeightMatrix* Ws[1] = {&W};
    float* ys[1] = {y};
    return quant_gemv_q8(Ws, ys, 1, x, s);
  }
  if (kernel == QuantGemvKernel::Q8) kernel = QuantGemvKernel::Auto;  // forced where it cannot run: the rule
  const IqTables T = iq_tables();
  return with_gguf_format(W.format, [&](auto f) {
    return with_tokens(n, [&](auto nt) { return launch<decltype(f)::value, decltype(nt)::value>(W, x, y, s, T, kernel); });
  });
}

}  // namespace k3::cuda
