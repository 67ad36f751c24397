// Routed MXFP4 experts' prefill tiles, register-A wgmma fed by a cp.async ring (moe_prefill_wgmma.h, launch_ring).
//
// Why: K3's MXFP4 experts are compute-bound at prefill (4096 tokens: ~73 pairs an expert) and the two earlier
// wgmma forms reach 107-140 TFLOP/s useful of ~990: the shared-memory form stores every decoded weight as bf16 and
// reads it back (call s39-1: the L1 / shared pipe 76-82% busy, the tensor pipe 21%), and the register-A form loads
// the weights from global memory one chunk ahead into registers (s39-2 .. s39-4: bound by load latency and spills).
// Here the stored MXFP4 bytes (a quarter of bf16's) and the activations go to shared memory by cp.async kStages - 1
// chunks ahead, in a ring; each thread reads its A fragments' 8 bytes a row from there, decodes them in registers
// (decode_a_frags_bits: E2M1 bit fields placed as bf16, one bf16x2 multiply by the scale) and issues the register-A
// wgmmas; nothing is staged through registers, so the depth costs no registers. The activations are bf16 already, in
// the permuted k order the decode produces (ring_pos): x by a small kernel before gate+up (hi and lo planes with
// split), the hidden rows by gate+up's epilogue, so a chunk of a pair is 128 bytes copied as stored.
// Block = (plan tile of <= 128 pairs, 128 gate+up output columns or 256 down rows), four warpgroups with one m64 A
// tile each (gate+up: 0, 1 gate, 2, 3 the same up rows, the up sums handed over through shared memory for the GLU),
// one block an SM; a warpgroup decodes its next chunk into a second fragment set while its wgmmas on the current one
// run. K3 at 4096 tokens has ~73 pairs an expert: one tile (an n80 MMA), so each weight is decoded once. Measured
// against session 60's first form (two warpgroups of two m64 tiles, 64-pair tiles, two blocks an SM): docs/perf/cuda.md
// sessions 60-61. The plan, tiles and outputs are the other forms' (down writes y [P][X] fp32 by slot, the caller
// combines).
#include <cuda_bf16.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/backend/cuda/moe_tc_tile.cuh"
#include "k3/backend/cuda/mxfp8_quant.cuh"
#include "k3/backend/cuda/smem_ptx.cuh"
#include "k3/backend/cuda/sm90a/mbarrier.cuh"
#include "k3/backend/cuda/sm90a/moe_wg_common.cuh"
#include "k3/backend/cuda/sm90a/wgmma.cuh"

namespace k3::cuda::moe_wg {
namespace {

using namespace detail;

// Five stages: chunk kc + 1 decoded while chunk kc's and kc - 1's wgmmas may run, chunk kc + 2 landing, kc + 3 issued.
constexpr int kStages = 5;
constexpr int kWRowBytes = kKc / 2;  // one row's MXFP4 bytes of a chunk
struct RingArgs {
  TileArgs t;                     // weights, shape, plan, GLU, and (down) the fp32 output by slot
  const uint16_t* in = nullptr;   // bf16 activation planes, permuted (ring_pos): gate+up x [n][X], down hidden [P][I]
  int64_t in_plane = 0;           // elements from the hi plane to the lo plane
  uint16_t* hidden = nullptr;     // gate+up: its GLU outputs as such planes [P][I]
  int64_t hidden_plane = 0;
  // Grid order: 0 = blockIdx.x the plan tile, blockIdx.y the column (gate+up) / row (down) block; 1 = the transpose, so
  // that a tile's column blocks run side by side and read its activation rows from the L2 (K3_RING_GRID=col; call
  // s62-2's ncu had DRAM at 50% in this tensor-bound kernel: x's rows fetched again by each of a tile's 24 blocks).
  int col_major = 0;
  // Tile widths (the MMA's N) in steps of 8 pairs above 64 instead of 16 / 32 (K3_RING_WIDTHS=8): K3 at 4096 tokens has
  // 60-90 pairs an expert, whose padding is ~9% of the tensor pipe's work at the coarse steps, ~5% at 8.
  int fine_widths = 0;
  // The warp-specialised body (K3_RING_WS=1, ring_body_ws): a producer warp fills the ring and mbarriers pace it, so
  // the 16 MMA warps never meet at a block barrier (call s62-2's ncu: the barrier is the ring's bound at bf16x2).
  int ws = 0;
};

__device__ __forceinline__ uint32_t ldg_u16(const uint8_t* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_shared_u16(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(static_cast<unsigned short>(v)) : "memory");
}
__device__ __forceinline__ int ld_shared_s32(uint32_t src) {
  int v;
  asm volatile("ld.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(src));
  return v;
}
__device__ __forceinline__ uint32_t ld_shared_u8(uint32_t src) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(src));
  return v;
}

// The activation tiles' wgmma descriptors (128-byte swizzle rows, wgmma::make_desc with lbo 16, sbo kSbo): the low
// word is the start address / 16 plus lbo's field, so a tile's descriptor is its stage's plus its byte offset / 16 --
// one add a wgmma instead of make_desc's masks and shifts (six uniform instructions each, 48 of a bf16x2 step's ~250).
// The ring lies below 256 KB of shared memory, so the 14-bit address field never carries.
__device__ __forceinline__ uint32_t desc_lo(uint32_t smem_addr) { return static_cast<uint32_t>(wgmma::make_desc(smem_addr, 16, kSbo)); }
__device__ __forceinline__ uint64_t ring_desc(uint32_t lo) {
  return (wgmma::make_desc(0, 16, kSbo) & 0xffffffff00000000ull) | lo;
}

extern __shared__ __align__(1024) uint8_t moe_ring_smem[];

constexpr int kRingThreads = 512;  // the MMA warps (four warpgroups); ring_body_ws adds a producer warp
// The MMA warps' barrier (named barrier 1 of 512 threads): the epilogue's exchanges, without the producer warp.
__device__ __forceinline__ void mma_warps_sync() { asm volatile("bar.sync 1, %0;\n" ::"n"(kRingThreads) : "memory"); }

// One GLU output into the hidden planes at element idx: bf16 hi, and with SPLIT the bf16 of what it leaves (the same
// values and rounding the other forms stage from fp32).
template <bool SPLIT>
__device__ __forceinline__ void put_hidden(const RingArgs& r, int64_t idx, float v) {
  const __nv_bfloat16 hi = __float2bfloat16_rn(v);
  r.hidden[idx] = __bfloat16_as_ushort(hi);
  if constexpr (SPLIT) r.hidden[r.hidden_plane + idx] = __bfloat16_as_ushort(__float2bfloat16_rn(v - __bfloat162float(hi)));
}

// x [n][X] fp32 -> bf16 planes (hi; lo with SPLIT) [n][X], each 64-column chunk in the permuted order: thread =
// one 8-position group (16 bytes) of one plane row.
template <bool SPLIT>
__global__ void ring_planes_kernel(const float* __restrict__ x, int64_t groups, uint16_t* __restrict__ out, int64_t plane) {
  const int64_t gi = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (gi >= groups) return;
  const float* src = x + (gi >> 3) * kKc;  // the chunk (rows are whole chunks: X % 64 == 0)
  const int pos0 = static_cast<int>(gi & 7) * 8;
  uint32_t hi[4], lo[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float r0, r1;
    hi[i] = bf16x2_rn(src[ring_col(pos0 + 2 * i)], src[ring_col(pos0 + 2 * i + 1)], r0, r1);
    lo[i] = bf16x2_rn(r0, r1);
  }
  reinterpret_cast<uint4*>(out)[gi] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
  if constexpr (SPLIT) reinterpret_cast<uint4*>(out + plane)[gi] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

constexpr int kRingPairs = 128;
constexpr int kRingXBytes = kRingPairs * 128;
template <bool SPLIT>
constexpr int ring_stage_bytes() {
  return ((SPLIT ? 2 : 1) * kRingXBytes + kRows * kWRowBytes + kRows * 2 + 1023) / 1024 * 1024;
}
template <bool SPLIT>
constexpr int ring_smem_bytes() {
  return 1024 + kStages * ring_stage_bytes<SPLIT>();
}
static_assert(ring_smem_bytes<true>() <= 227 * 1024, "one block an SM");
static_assert(2 * 128 * 64 * 4 <= kStages * ring_stage_bytes<false>(), "the up accumulators fit the ring for the GLU");

// Accumulator element 4 j + q of warp wq, lane (g, c): weight row 16 wq + g + 8 (q >> 1), pair 8 j + 2 c + (q & 1).
// MoePrecision::Mxfp8's tile form (TileArgs::mxfp8_hidden_rows): the GLU of one 64-row half rounded to MXFP8 along each
// pair's hidden row, as round_hidden_mxfp8 does for the other forms. xch holds the half's gate sums [0, E) and up sums
// [E, 2E) in the [element][thread] order of store_tile; the GLU goes in place, then a warp takes one (pair, 32-row
// block) -- the rows rows0 + 32 b .., a block of the CPU's rounding since rows0 is a multiple of 64 -- with lane =
// row, so the block's amax is a warp reduction. The rounded values are bf16-exact (4 significant bits) unless a
// block's largest |value| is below 2^-116 (bits of values under ~1e-35 may go), so the hi plane holds them as they are.
template <bool SPLIT, int NN>
__device__ __forceinline__ void glu_mxfp8(const RingArgs& r, float* xch, int rows0, int start, int cnt) {
  const TileArgs& a = r.t;
  constexpr int E = NN / 2 * 128;
  const int tid = threadIdx.x, lane = tid & 31;
#pragma unroll 1
  for (int l = tid; l < E; l += kRingThreads) xch[l] = moe_dev::glu(xch[l], xch[E + l], a.act, a.beta, a.lbeta);
  mma_warps_sync();
#pragma unroll 1
  for (int wb = tid >> 5; wb < 2 * NN; wb += kRingThreads / 32) {  // warp-uniform: whole warps take a block
    const int p = wb >> 1, rr = 32 * (wb & 1) + lane;  // pair, row in the half
    // store_tile's element of (p, rr): accumulator i = 4 (p / 8) + 2 ((rr / 8) % 2) + p % 2 of thread
    // tt = 32 (rr / 16) + 4 (rr % 8) + (p % 8) / 2
    const int i = 4 * (p >> 3) + 2 * ((rr >> 3) & 1) + (p & 1), tt = 32 * (rr >> 4) + 4 * (rr & 7) + ((p & 7) >> 1);
    const float q = mxfp8::fake_quant_warp(xch[i * 128 + tt]);
    const int n = rows0 + rr;
    if (p < cnt && n < a.rows) put_hidden<SPLIT>(r, static_cast<int64_t>(start + p) * a.rows + (n & ~63) + ring_pos(n & 63), q);
  }
}

// gate+up: the GLU of gate warpgroup h's and up warpgroup 2 + h's sums, written as bf16 planes at ring_pos; down: each
// warpgroup its rows into y by slot.
template <int NMAT, bool SPLIT, int NN, bool MX8>
__device__ __forceinline__ void store_tile(const RingArgs& r, float (&acc)[NN / 2], uint32_t base, int n0, int start, int cnt) {
  const TileArgs& a = r.t;
  const int tid = threadIdx.x, wg = tid >> 7;
  if constexpr (NMAT == 2) {
    // The GLU in two passes of 64 rows (gate warpgroup h, up warpgroup 2 + h): both write their sums to the ring's
    // memory ([element][thread]: conflict-free), then all 512 threads form those rows' GLU in a loop -- one copy of
    // the GLU's code (tanh, exp, divisions) instead of one per accumulator and tile width: the unrolled form made this
    // kernel's machine code 6x the down kernel's and its warps stall on instruction fetch (call s61-3).
    float* xch = reinterpret_cast<float*>(moe_ring_smem + (base - static_cast<uint32_t>(__cvta_generic_to_shared(moe_ring_smem))));
    constexpr int E = NN / 2 * 128;  // one warpgroup's sums
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      if (wg == h || wg == 2 + h) {
        float* dst = xch + (wg >= 2 ? E : 0);
#pragma unroll
        for (int i = 0; i < NN / 2; ++i) dst[i * 128 + (tid & 127)] = acc[i];
      }
      mma_warps_sync();
      if constexpr (MX8) {
        glu_mxfp8<SPLIT, NN>(r, xch, n0 + 64 * h, start, cnt);
      } else {
#pragma unroll 1
        for (int l = tid; l < E; l += kRingThreads) {  // element l: accumulator i of thread tt of those warpgroups
          const int i = l >> 7, tt = l & 127, ln = tt & 31;
          const int pair = 8 * (i >> 2) + (ln & 3) * 2 + (i & 1);
          const int n = n0 + 64 * h + 16 * (tt >> 5) + (ln >> 2) + 8 * ((i >> 1) & 1);
          if (pair < cnt && n < a.rows)
            put_hidden<SPLIT>(r, static_cast<int64_t>(start + pair) * a.rows + (n & ~63) + ring_pos(n & 63),
                              moe_dev::glu(xch[l], xch[E + l], a.act, a.beta, a.lbeta));
        }
      }
      mma_warps_sync();  // the next pass's sums overwrite these
    }
  } else {
    const int wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
    for (int j = 0; j < NN / 8; ++j)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int pair = 8 * j + c2 + (q & 1), n = n0 + 64 * wg + 16 * wq + g + 8 * (q >> 1);
        if (pair < cnt && n < a.rows) a.out[static_cast<int64_t>(start + pair) * a.rows + n] = acc[4 * j + q];
      }
  }
}

template <int NMAT, bool GATHER, bool SPLIT, int NN, bool MX8>
__device__ __forceinline__ void ring_body(const RingArgs& r, int e, int start, int cnt) {
  constexpr int NS = SPLIT ? 2 : 1, S = kStages;
  const TileArgs& a = r.t;
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int rows = a.rows, cols = a.cols;
  const int n0 = (r.col_major ? blockIdx.x : blockIdx.y) * (NMAT == 2 ? kRows / 2 : kRows);
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(moe_ring_smem)) + 1023u) & ~1023u;

  // Copies: weight row tid / 2's half tid % 2; scale bytes of row tid (tid < 256); pair tid / 4's groups 2 (tid % 4), + 1.
  auto wrow = [&](int rr, bool& ok) {  // smem row rr -> the matrix's row offset (gate/up: rows 128.. are up's)
    const int gr = n0 + (NMAT == 2 ? rr % 128 : rr);
    ok = gr < rows;
    return static_cast<int64_t>(e) * rows + (ok ? gr : 0);
  };
  bool wvalid, svalid;
  const int crow = tid >> 1;
  const uint8_t* wsrc = static_cast<const uint8_t*>(NMAT == 2 && crow >= 128 ? a.w1 : a.w0) + wrow(crow, wvalid) * (cols / 2) + 16 * (tid & 1);
  const int srow = tid & 255;
  const uint8_t* ssrc = (NMAT == 2 && srow >= 128 ? a.s1 : a.s0) + wrow(srow, svalid) * (cols / 32);
  svalid = svalid && tid < 256;
  const int p = tid >> 2, xq = tid & 3;
  const bool xvalid = p < cnt;
  const uint16_t* xsrc = r.in + 16 * xq;
  if (xvalid) xsrc += static_cast<int64_t>(GATHER ? a.sorted[start + p] / a.K : start + p) * cols;

  // The copy cursor (why: the copies' addresses rebuilt from kc every step -- a chunk's stage kc % 5, 64-bit offsets --
  // took ~40 of a step's ~210 instructions, and the ring is issue-bound at bf16): the next chunk issued goes to stage
  // address `cs`, from sources advanced by one chunk at each issue; `sc_stage` is the stage whose scales are stored next.
  constexpr uint32_t SB = ring_stage_bytes<SPLIT>();
  const uint32_t ring_end = base + S * SB;
  auto next_stage = [&](uint32_t sa) { return sa + SB == ring_end ? base : sa + SB; };
  const uint32_t xo0 = swz(p, 2 * xq), xo1 = swz(p, 2 * xq + 1), wo = NS * kRingXBytes + crow * kWRowBytes + 16 * (tid & 1);
  const uint32_t so = NS * kRingXBytes + kRows * kWRowBytes + 2 * tid;
  const uint16_t* xp = xsrc;
  const uint8_t* wp = wsrc;
  const uint8_t* sp = ssrc;
  uint32_t cs = base, sc_stage = base;
  auto issue_next = [&]() {  // returns the chunk's scale bytes (row tid; tid < 256)
    if (p < NN) {  // pairs past the tile's width are never read
#pragma unroll
      for (int h = 0; h < NS; ++h) {
        cp_async16_or_zero(cs + h * kRingXBytes + xo0, xp + h * r.in_plane, xvalid);
        cp_async16_or_zero(cs + h * kRingXBytes + xo1, xp + h * r.in_plane + 8, xvalid);
      }
    }
    cp_async16_or_zero(cs + wo, wp, wvalid);
    const uint32_t sc = svalid ? ldg_u16(sp) : 0x7f7fu;
    xp += kKc, wp += kKc / 2, sp += 2;
    sc_stage = cs;
    cs = next_stage(cs);
    return sc;
  };
  auto decode = [&](uint32_t stage, uint32_t (&af)[4][4]) {
    uint2 w[2];
    uint32_t sb[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 64 * wg + 16 * wq + g + 8 * h;
      w[h] = ptx::lds64(stage + NS * kRingXBytes + row * kWRowBytes + 8 * c);
      sb[h] = ld_shared_u8(stage + NS * kRingXBytes + kRows * kWRowBytes + 2 * row + (c >> 1));
    }
    decode_a_frags_bits(af, w, sb);
  };

  float acc[NN / 2];
#pragma unroll
  for (int i = 0; i < NN / 2; ++i) acc[i] = 0.f;
  uint32_t af0[4][4], af1[4][4];
  const int nk = cols / kKc;
  // Chunks 0 .. S - 3 in flight before the loop (step kc issues chunk kc + S - 2).
#pragma unroll
  for (int kc = 0; kc < S - 2; ++kc) {
    if (kc < nk) {
      const uint32_t sc = issue_next();
      if (tid < 256) st_shared_u16(sc_stage + so, sc);
    }
    cp_async_commit();
  }
  cp_async_wait<S - 3>();
  wgmma::fence_proxy_async();
  __syncthreads();
  uint32_t ms = base;  // chunk kc's stage
  decode(ms, af0);
  uint32_t sc_next = 0;
  // Step kc: chunk kc + 1 landed (decoded under chunk kc's wgmmas). Chunk kc - 1's wgmmas are waited for only after
  // chunk kc's are issued, so the tensor pipe still has work while the block meets at the barrier and issues its
  // copies (waiting for all of them before the barrier left it idle there: call s61-5's ncu, 46% of the tensor peak).
  // So the stage refilled is the one chunk kc - 2 used (all its readers done: each warpgroup waited for its wgmmas in
  // step kc - 1 before this barrier), and chunk kc - 1's fragments are overwritten only after its wait.
  auto step = [&](int kc, uint32_t (&cur)[4][4], uint32_t (&nxt)[4][4]) {
    cp_async_wait<S - 4>();
    wgmma::fence_proxy_async();
    __syncthreads();
    if (kc > 0 && kc + S - 3 < nk && tid < 256) st_shared_u16(sc_stage + so, sc_next);
    if (kc + S - 2 < nk) sc_next = issue_next();
    cp_async_commit();
    wgmma::fence_regs(acc);
    keep_frags(cur);
    wgmma::fence();
    const uint32_t d0 = desc_lo(ms);
#pragma unroll
    for (int st = 0; st < kKc / 16; ++st)
#pragma unroll
      for (int h = 0; h < NS; ++h) mma_rs<NN>(acc, cur[st], ring_desc(d0 + (h * kRingXBytes + st * 32) / 16));
    wgmma::commit();
    wgmma::wait<1>();  // chunk kc - 1's wgmmas: nxt held its fragments
    keep_frags(nxt);
    ms = next_stage(ms);
    if (kc + 1 < nk) decode(ms, nxt);
    wgmma::fence_regs(acc);
    keep_frags(cur);
    keep_frags(nxt);
  };
  for (int kc = 0; kc < nk; kc += 2) {
    step(kc, af0, af1);
    if (kc + 1 < nk) step(kc + 1, af1, af0);
  }
  wgmma::wait<0>();
  wgmma::fence_regs(acc);
  cp_async_wait<0>();
  __syncthreads();  // the ring's memory is the GLU's exchange buffer next
  store_tile<NMAT, SPLIT, NN, MX8>(r, acc, base, n0, start, cnt);
}

// ------------------------------------------------------------------------------------- the warp-specialised body
// K3_RING_WS=1 (opt-in until measured). Why: in ring_body every thread copies and computes, so the 16 MMA warps meet at
// a block barrier every chunk (call s62-2's ncu of gate+up at bf16x2: barrier the largest stall, the tensor pipe busy
// 54% of the time, the issue slots 45%). Here a fifth warpgroup fills the ring and mbarriers pace it: stage i's `full`
// barrier completes when chunk kc's bytes have landed there (one arrival a producer warp), its `empty` barrier
// when all 16 MMA warps are done with it (one arrival a warp, after the wait for its wgmmas on the chunk), so a warp
// waits only for the data it reads next and the producer only for a free stage.
// The producer waits for a chunk's copies kWsLag chunks after issuing them, then fences them to the async proxy (the
// MMA warps' wgmmas read them) before the arrival -- the MLA decode kernel's pattern, which racecheck cannot follow
// through the mbarriers (mla_decode_wgmma.cu) but synccheck does. Scales: four bytes a row (chunks 2 m and 2 m + 1) by
// one 4-byte copy each chunk, so the body needs cols % 128 == 0 and 4-byte aligned scale rows (ring_ws_supports).
constexpr int kWsThreads = kRingThreads + 128;  // + the producer warpgroup
constexpr int kWsLag = 2;  // chunks in flight a producer lane before it waits for the oldest
// Registers (setmaxnreg): an SM sub-partition holds one warp of each warpgroup, and the block starts with 96 a thread
// (65536 / 640 rounded down to 8), so 4 x 104 + 64 is all a sub-partition's warps can have (setmaxnreg.inc waits for
// registers the producer's dec frees). 104 spill a few in the n128 body's decode (16-24 bytes), none below.
constexpr int kWsMmaRegs = 104, kWsProducerRegs = 64;
static_assert(4 * kWsMmaRegs + kWsProducerRegs <= 5 * (65536 / kWsThreads / 8 * 8), "the producer's registers fund the MMA warps'");
template <bool SPLIT>
constexpr int ws_stage_bytes() {
  return ((SPLIT ? 2 : 1) * kRingXBytes + kRows * kWRowBytes + kRows * 4 + 1023) / 1024 * 1024;
}
template <bool SPLIT>
constexpr int ws_smem_bytes() {  // + the full and empty barriers, the tile's source rows
  return 1024 + kStages * ws_stage_bytes<SPLIT>() + 2 * kStages * 8 + kRingPairs * 4;
}
static_assert(ws_smem_bytes<true>() <= 227 * 1024, "one block an SM");

__device__ __forceinline__ void cp_async4_or_zero(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// The producer warpgroup: chunk j into stage j % kStages once the MMA warps have freed it (chunk j - kStages's empty
// phase). Warp pw (0..3), lane l copies: the 16-byte piece l % 8 of the tile's pairs l / 8 + 4 (pw + 4 i) (each plane;
// their source rows from `rowtab`); the 16-byte half l % 2 of weight rows l / 2 + 16 (pw + 4 i); the 4 scale bytes of
// rows l + 32 (pw + 4 i). Rows past the matrix and pairs past the tile are zero-filled. Everything is recomputed each
// chunk from the lane: the warpgroup runs on 64 registers.
template <int NMAT, bool SPLIT, int NN>
__device__ __forceinline__ void ws_produce(const RingArgs& r, int e, int cnt, int n0, uint32_t base, uint32_t bars, uint32_t rowtab) {
  constexpr int NS = SPLIT ? 2 : 1, S = kStages, NP = NN / 4;
  constexpr uint32_t SB = ws_stage_bytes<SPLIT>();
  const TileArgs& a = r.t;
  const int lane = threadIdx.x & 31, pw = (threadIdx.x >> 5) & 3, rows = a.rows, cols = a.cols, nk = cols / kKc;
  const int64_t wexp = static_cast<int64_t>(e) * rows;  // expert e's first row
  const uint32_t full0 = bars, empty0 = bars + 8 * S;
  auto arrive_full = [&](int j) {  // chunk j's copies (this lane's) landed: to the async proxy, then one arrival a warp
    wgmma::fence_proxy_async();
    __syncwarp();
    if (lane == 0) mbar::arrive(full0 + 8 * (j % S));
  };
#pragma unroll 1
  for (int j = 0; j < nk; ++j) {
    const int si = j % S;
    if (j >= S) mbar::wait(empty0 + 8 * si, (j / S - 1) & 1);
    const uint32_t st = base + si * SB;
#pragma unroll
    for (int i = 0; i < (NP + 3) / 4; ++i) {
      const int ip = pw + 4 * i, p = (lane >> 3) + 4 * ip;
      if (ip < NP) {
        const bool ok = p < cnt;
        const uint16_t* src = r.in + static_cast<int64_t>(ok ? ld_shared_s32(rowtab + 4 * p) : 0) * cols + j * kKc + 8 * (lane & 7);
#pragma unroll
        for (int h = 0; h < NS; ++h) cp_async16_or_zero(st + h * kRingXBytes + swz(p, lane & 7), src + h * r.in_plane, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // smem row rr: gate+up's rows 128.. are up's
      const int rr = (lane >> 1) + 16 * (pw + 4 * i), gr = n0 + (NMAT == 2 ? rr & 127 : rr);
      const uint8_t* m = static_cast<const uint8_t*>(NMAT == 2 && rr >= 128 ? a.w1 : a.w0);
      cp_async16_or_zero(st + NS * kRingXBytes + rr * kWRowBytes + 16 * (lane & 1),
                         m + (wexp + (gr < rows ? gr : 0)) * (cols / 2) + 16 * (lane & 1) + j * (kKc / 2), gr < rows);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int rr = lane + 32 * (pw + 4 * i), gr = n0 + (NMAT == 2 ? rr & 127 : rr);
      const uint8_t* m = NMAT == 2 && rr >= 128 ? a.s1 : a.s0;
      cp_async4_or_zero(st + NS * kRingXBytes + kRows * kWRowBytes + 4 * rr,
                        m + (wexp + (gr < rows ? gr : 0)) * (cols / 32) + 2 * (j & ~1), gr < rows);
    }
    cp_async_commit();
    if (j >= kWsLag) {
      cp_async_wait<kWsLag>();
      arrive_full(j - kWsLag);
    }
  }
  cp_async_wait<0>();
#pragma unroll 1
  for (int j = nk > kWsLag ? nk - kWsLag : 0; j < nk; ++j) arrive_full(j);
}

// The MMA warps of the warp-specialised body. One fragment set (the producer warpgroup leaves each MMA warp 104
// registers; two sets, as ring_body keeps, spilled even at 120): chunk kc's wgmmas issued, chunk kc + 1's bytes read from its stage as
// they run, then the wait for them (their stage released) and chunk kc + 1's decode. A warpgroup's tensor work pauses
// for that decode, but with no block barrier the four warpgroups drift apart and the other three keep the pipe fed.
template <int NMAT, bool SPLIT, int NN, bool MX8>
__device__ __forceinline__ void ws_consume(const RingArgs& r, int start, int cnt, int n0, uint32_t base, uint32_t bars) {
  constexpr int NS = SPLIT ? 2 : 1, S = kStages;
  constexpr uint32_t SB = ws_stage_bytes<SPLIT>();
  const int tid = threadIdx.x, wg = tid >> 7, wq = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, c = lane & 3;
  const int nk = r.t.cols / kKc;
  const uint32_t full0 = bars, empty0 = bars + 8 * S;
  const uint32_t wrow0 = NS * kRingXBytes + (64 * wg + 16 * wq + g) * kWRowBytes + 8 * c;
  const uint32_t srow0 = NS * kRingXBytes + kRows * kWRowBytes + 4 * (64 * wg + 16 * wq + g) + (c >> 1);
  uint2 w[2];
  uint32_t sb[2];
  auto load = [&](uint32_t stage, int kc) {  // this thread's two rows' bytes and scales of chunk kc
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      w[h] = ptx::lds64(stage + wrow0 + 8 * h * kWRowBytes);
      sb[h] = ld_shared_u8(stage + srow0 + 32 * h + 2 * (kc & 1));
    }
  };
  float acc[NN / 2];
#pragma unroll
  for (int i = 0; i < NN / 2; ++i) acc[i] = 0.f;
  uint32_t af[4][4];
  mbar::wait(full0, 0);
  load(base, 0);
  decode_a_frags_bits(af, w, sb);
  int si = 0;  // chunk kc's stage
#pragma unroll 1
  for (int kc = 0; kc < nk; ++kc) {
    wgmma::fence_regs(acc);
    wgmma::fence();
    const uint32_t d0 = desc_lo(base + si * SB);
#pragma unroll
    for (int st = 0; st < kKc / 16; ++st)
#pragma unroll
      for (int h = 0; h < NS; ++h) mma_rs<NN>(acc, af[st], ring_desc(d0 + (h * kRingXBytes + st * 32) / 16));
    wgmma::commit();
    const int sn = si + 1 == S ? 0 : si + 1;
    if (kc + 1 < nk) {
      mbar::wait(full0 + 8 * sn, ((kc + 1) / S) & 1);
      load(base + sn * SB, kc + 1);
    }
    wgmma::wait<0>();
    wgmma::fence_regs(acc);
    keep_frags(af);  // read by the wgmmas until here: not reused before the wait
    __syncwarp();
    if (lane == 0) mbar::arrive(empty0 + 8 * si);  // chunk kc's stage: its decode and wgmmas done
    __syncwarp();
    if (kc + 1 < nk) decode_a_frags_bits(af, w, sb);
    si = sn;
  }
  mma_warps_sync();  // every MMA warp done with the ring: its memory is the GLU's exchange buffer next
  store_tile<NMAT, SPLIT, NN, MX8>(r, acc, base, n0, start, cnt);
}

template <int NMAT, bool GATHER, bool SPLIT, int NN, bool MX8>
__device__ __forceinline__ void ring_body_ws(const RingArgs& r, int e, int start, int cnt) {
  const int n0 = (r.col_major ? blockIdx.x : blockIdx.y) * (NMAT == 2 ? kRows / 2 : kRows);
  const uint32_t base = (static_cast<uint32_t>(__cvta_generic_to_shared(moe_ring_smem)) + 1023u) & ~1023u;
  const uint32_t bars = base + kStages * ws_stage_bytes<SPLIT>(), rowtab = bars + 2 * kStages * 8;
  if (threadIdx.x < kStages) {
    mbar::init(bars + 8 * threadIdx.x, 4);                              // full: one arrival a producer warp
    mbar::init(bars + 8 * (kStages + threadIdx.x), kRingThreads / 32);  // empty: one arrival an MMA warp
  }
  if (threadIdx.x < static_cast<unsigned>(min(cnt, NN))) {  // the tile's activation rows (x by token, hidden by slot)
    const int p = threadIdx.x;
    st_shared4(rowtab + 4 * p, static_cast<uint32_t>(GATHER ? r.t.sorted[start + p] / r.t.K : start + p));
  }
  __syncthreads();
  // Warp-uniform by construction (a shuffle from lane 0): ptxas must see the roles' branches as uniform.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0);
  if (warp >= kRingThreads / 32) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kWsProducerRegs));
    ws_produce<NMAT, SPLIT, NN>(r, e, cnt, n0, base, bars, rowtab);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kWsMmaRegs));
    ws_consume<NMAT, SPLIT, NN, MX8>(r, start, cnt, n0, base, bars);
  }
}

// One body of a tile width: the barrier-paced ring (ring_body) or the warp-specialised one (ring_body_ws).
template <int NMAT, bool GATHER, bool SPLIT, int NN, bool MX8, bool WS>
__device__ __forceinline__ void body(const RingArgs& r, int e, int start, int cnt) {
  if constexpr (WS)
    ring_body_ws<NMAT, GATHER, SPLIT, NN, MX8>(r, e, start, cnt);
  else
    ring_body<NMAT, GATHER, SPLIT, NN, MX8>(r, e, start, cnt);
}

template <int NMAT, bool GATHER, bool SPLIT, bool MX8, bool WS>
__global__ void __launch_bounds__(WS ? kWsThreads : kRingThreads, 1) expert_ring_kernel(const RingArgs r) {
  const int tile = static_cast<int>(r.col_major ? blockIdx.y : blockIdx.x);
  if (tile >= *r.t.num_tiles) return;
  const int4 td = r.t.tiles[tile];
  // The tile's width (the MMA's N): the pairs rounded up to 16, 32, 64, 80, 96 or 128 (K3 at 4096 tokens: ~73 pairs
  // an expert, n80), or with fine_widths to a multiple of 16 up to 64 and of 8 above.
  const int z = td.z;
  const int nn = r.fine_widths ? (z <= 64 ? (z + 15) / 16 * 16 : (z + 7) / 8 * 8)
                               : (z <= 32 ? (z + 15) / 16 * 16 : z <= 64 ? 64 : z <= 96 ? (z + 15) / 16 * 16 : 128);
  switch (nn) {
    case 16: return body<NMAT, GATHER, SPLIT, 16, MX8, WS>(r, td.x, td.y, z);
    case 32: return body<NMAT, GATHER, SPLIT, 32, MX8, WS>(r, td.x, td.y, z);
    case 48: return body<NMAT, GATHER, SPLIT, 48, MX8, WS>(r, td.x, td.y, z);
    case 64: return body<NMAT, GATHER, SPLIT, 64, MX8, WS>(r, td.x, td.y, z);
    case 72: return body<NMAT, GATHER, SPLIT, 72, MX8, WS>(r, td.x, td.y, z);
    case 80: return body<NMAT, GATHER, SPLIT, 80, MX8, WS>(r, td.x, td.y, z);
    case 88: return body<NMAT, GATHER, SPLIT, 88, MX8, WS>(r, td.x, td.y, z);
    case 96: return body<NMAT, GATHER, SPLIT, 96, MX8, WS>(r, td.x, td.y, z);
    case 104: return body<NMAT, GATHER, SPLIT, 104, MX8, WS>(r, td.x, td.y, z);
    case 112: return body<NMAT, GATHER, SPLIT, 112, MX8, WS>(r, td.x, td.y, z);
    case 120: return body<NMAT, GATHER, SPLIT, 120, MX8, WS>(r, td.x, td.y, z);
    default: return body<NMAT, GATHER, SPLIT, 128, MX8, WS>(r, td.x, td.y, z);
  }
}

// ------------------------------------------------------------------------------------------------ launchers
bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }
// ring_body_ws's 4-byte scale copies (two chunks' bytes a row, at 2 (kc & ~1)): every scale row 4-byte aligned.
bool ring_ws_supports(const ExpertBank& w) {
  return w.X % 128 == 0 && w.I % 128 == 0 && aligned(w.gate_scales, 4) && aligned(w.up_scales, 4) && aligned(w.down_scales, 4);
}
// The opt-in variants (RingArgs::col_major: K3_RING_GRID=col; fine_widths: K3_RING_WIDTHS=8), read at each launch (a
// getenv next to two kernel launches costs nothing) so that one test process can run every variant.
bool env_is(const char* name, const char* value) {
  const char* s = std::getenv(name);
  return s != nullptr && std::strcmp(s, value) == 0;
}

// grid: (tiles, blocks of the tile); RingArgs::col_major launches its transpose.
template <int NMAT, bool GATHER, bool SPLIT, bool MX8, bool WS>
cudaError_t launch_ring_kernel(const RingArgs& r, dim3 grid, cudaStream_t stream) {
  auto* k = &expert_ring_kernel<NMAT, GATHER, SPLIT, MX8, WS>;
  constexpr int smem = WS ? ws_smem_bytes<SPLIT>() : ring_smem_bytes<SPLIT>();
  const cudaError_t attr = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  k<<<grid, WS ? kWsThreads : kRingThreads, smem, stream>>>(r);
  return cudaGetLastError();
}
template <int NMAT, bool GATHER, bool SPLIT, bool MX8 = false>
cudaError_t launch_ring_one(RingArgs r, dim3 grid, cudaStream_t stream) {
  r.col_major = r.col_major && grid.x <= 65535u;  // the tiles on gridDim.y (at most 65535)
  if (r.col_major) grid = dim3(grid.y, grid.x);
  return r.ws ? launch_ring_kernel<NMAT, GATHER, SPLIT, MX8, true>(r, grid, stream)
              : launch_ring_kernel<NMAT, GATHER, SPLIT, MX8, false>(r, grid, stream);
}

template <bool SPLIT, bool MX8>
cudaError_t launch_ring_pair(const ExpertBank& w, int n, int n_tiles_bound, const TileArgs& gate_up, int64_t max_pairs,
                             float* y, cudaStream_t stream) {
  // x's planes in y (>= n * X floats: y holds P >= n rows of X; down overwrites it after gate+up has read them).
  auto* xp = reinterpret_cast<uint16_t*>(y);
  const int64_t xplane = static_cast<int64_t>(n) * w.X, groups = xplane / 8;
  ring_planes_kernel<SPLIT><<<static_cast<unsigned>((groups + 255) / 256), 256, 0, stream>>>(gate_up.in, groups, xp, xplane);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // The hidden planes in gate+up's fp32 buffer (max_pairs x I floats: two bf16 planes of max_pairs x I).
  auto* hp = reinterpret_cast<uint16_t*>(gate_up.out);
  const int64_t hplane = max_pairs * w.I;
  const int col = env_is("K3_RING_GRID", "col"), fine = env_is("K3_RING_WIDTHS", "8");
  const int ws = env_is("K3_RING_WS", "1") && ring_ws_supports(w);
  RingArgs gu{gate_up, xp, xplane, hp, hplane, col, fine, ws};
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + kRows / 2 - 1) / (kRows / 2)));
  if ((e = launch_ring_one<2, true, SPLIT, MX8>(gu, g1, stream)) != cudaSuccess) return e;
  TileArgs d = gate_up;
  to_down_args(d, w, gate_up.out, y);
  RingArgs dn{d, hp, hplane, nullptr, 0, col, fine, ws};
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + kRows - 1) / kRows));
  return launch_ring_one<1, false, SPLIT>(dn, g2, stream);
}

}  // namespace

bool ring_supports(const ExpertBank& w) {
  return supports(w) && w.format == WeightFormat::MXFP4 && w.X % kKc == 0 && w.I % kKc == 0 && aligned(w.gate, 16) &&
         aligned(w.up, 16) && aligned(w.down, 16) && aligned(w.gate_scales, 2) && aligned(w.up_scales, 2) &&
         aligned(w.down_scales, 2);
}

cudaError_t launch_ring(const ExpertBank& w, int n, int n_tiles_bound, const TileArgs& gate_up, int64_t max_pairs,
                        bool split, float* y, cudaStream_t stream) {
  if (!ring_supports(w) || n_tiles_bound <= 0 || n <= 0) return cudaErrorInvalidValue;
  if (gate_up.mxfp8_hidden_rows > 0)  // the tile form's products run at Bf16: no split
    return split ? cudaErrorInvalidValue : launch_ring_pair<false, true>(w, n, n_tiles_bound, gate_up, max_pairs, y, stream);
  return split ? launch_ring_pair<true, false>(w, n, n_tiles_bound, gate_up, max_pairs, y, stream)
               : launch_ring_pair<false, false>(w, n, n_tiles_bound, gate_up, max_pairs, y, stream);
}

int ring_tile_pairs() { return kRingPairs; }

bool ring_by_default() {
  static const bool v = [] {
    const char* s = std::getenv("K3_MOE_WGMMA");
    return s == nullptr || (std::strcmp(s, "smem") != 0 && std::strcmp(s, "rs") != 0 && std::strcmp(s, "0") != 0);
  }();
  return v;
}

}  // namespace k3::cuda::moe_wg
