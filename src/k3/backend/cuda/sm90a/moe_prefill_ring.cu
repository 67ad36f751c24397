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

#include "k3/backend/cuda/env_flag.h"
#include "k3/backend/cuda/moe_prefill_wgmma.h"
#include "k3/backend/cuda/moe_tc_tile.cuh"
#include "k3/backend/cuda/mxfp8_quant.cuh"
#include "k3/backend/cuda/smem_ptx.cuh"
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
  // Grid order: 1 (launch_ring_one's choice) = blockIdx.x the column (gate+up) / row (down) block, blockIdx.y the plan
  // tile, so that a tile's blocks run side by side and read its activation rows from the L2: call s62-2's ncu had DRAM
  // at 50% in this tensor-bound kernel, x's rows fetched again by each of a tile's 24 blocks; in s63-1 21% and the
  // experts -8% (bf16x2) / -10% (bf16) at K3's 4096 tokens. 0 = the transpose, for more than 65535 tiles (gridDim.y).
  int col_major = 1;
};

__device__ __forceinline__ uint32_t ldg_u16(const uint8_t* p) {
  unsigned short v;
  asm volatile("ld.global.nc.u16 %0, [%1];\n" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ void st_shared_u16(uint32_t dst, uint32_t v) {
  asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(static_cast<unsigned short>(v)) : "memory");
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

constexpr int kRingThreads = 512;
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
  __syncthreads();
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
      __syncthreads();
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
      __syncthreads();  // the next pass's sums overwrite these
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

template <int NMAT, bool GATHER, bool SPLIT, int NN, bool MX8, bool NARROW>
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
    decode_a_frags_bits<NARROW>(af, w, sb);
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

template <int NMAT, bool GATHER, bool SPLIT, bool MX8, bool NARROW>
__global__ void __launch_bounds__(kRingThreads, 1) expert_ring_kernel(const RingArgs r) {
  const int tile = static_cast<int>(r.col_major ? blockIdx.y : blockIdx.x);
  if (tile >= *r.t.num_tiles) return;
  const int4 td = r.t.tiles[tile];
  // The tile's width (the MMA's N): the pairs rounded up to a multiple of 16 (K3 at 4096 tokens: ~73 pairs an expert,
  // n80; at 2048, ~36: n48, which s63-1 measured at -5% on the experts against the n64 this took before; steps of 8
  // above 64 gained nothing at 4096 and were dropped).
  const int z = td.z;
  switch ((z + 15) / 16 * 16) {
    case 16: return ring_body<NMAT, GATHER, SPLIT, 16, MX8, NARROW>(r, td.x, td.y, z);
    case 32: return ring_body<NMAT, GATHER, SPLIT, 32, MX8, NARROW>(r, td.x, td.y, z);
    case 48: return ring_body<NMAT, GATHER, SPLIT, 48, MX8, NARROW>(r, td.x, td.y, z);
    case 64: return ring_body<NMAT, GATHER, SPLIT, 64, MX8, NARROW>(r, td.x, td.y, z);
    case 80: return ring_body<NMAT, GATHER, SPLIT, 80, MX8, NARROW>(r, td.x, td.y, z);
    case 96: return ring_body<NMAT, GATHER, SPLIT, 96, MX8, NARROW>(r, td.x, td.y, z);
    case 112: return ring_body<NMAT, GATHER, SPLIT, 112, MX8, NARROW>(r, td.x, td.y, z);
    default: return ring_body<NMAT, GATHER, SPLIT, 128, MX8, NARROW>(r, td.x, td.y, z);
  }
}

// ------------------------------------------------------------------------------------------------ launchers
// The narrow-scale decode where the bank allows it (every scale <= 2^1: ExpertStack::max_scale <= 128);
// K3_RING_NARROW=0 keeps the general one (the A/B of session 64; tests force either).
EnvFlag g_narrow{"K3_RING_NARROW"};

// grid: (tiles, blocks of the tile), launched transposed (RingArgs::col_major) unless the tiles exceed gridDim.y.
template <int NMAT, bool GATHER, bool SPLIT, bool MX8 = false>
cudaError_t launch_ring_one(RingArgs r, dim3 grid, bool narrow, cudaStream_t stream) {
  r.col_major = r.col_major && grid.x <= 65535u;  // the tiles on gridDim.y (at most 65535)
  if (r.col_major) grid = dim3(grid.y, grid.x);
  auto* k = narrow ? &expert_ring_kernel<NMAT, GATHER, SPLIT, MX8, true> : &expert_ring_kernel<NMAT, GATHER, SPLIT, MX8, false>;
  constexpr int smem = ring_smem_bytes<SPLIT>();
  const cudaError_t attr = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return attr;
  k<<<grid, kRingThreads, smem, stream>>>(r);
  return cudaGetLastError();
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
  const bool narrow = w.max_scale <= 128 && g_narrow.on();
  RingArgs gu{gate_up, xp, xplane, hp, hplane};
  const dim3 g1(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.I + kRows / 2 - 1) / (kRows / 2)));
  if ((e = launch_ring_one<2, true, SPLIT, MX8>(gu, g1, narrow, stream)) != cudaSuccess) return e;
  TileArgs d = gate_up;
  to_down_args(d, w, gate_up.out, y);
  RingArgs dn{d, hp, hplane, nullptr, 0};
  const dim3 g2(static_cast<unsigned>(n_tiles_bound), static_cast<unsigned>((w.X + kRows - 1) / kRows));
  return launch_ring_one<1, false, SPLIT>(dn, g2, narrow, stream);
}

bool aligned(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

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

void force_ring_narrow_scales_for_testing(std::optional<bool> on) { g_narrow.force(on); }

bool ring_by_default() {
  static const bool v = [] {
    const char* s = std::getenv("K3_MOE_WGMMA");
    return s == nullptr || (std::strcmp(s, "smem") != 0 && std::strcmp(s, "rs") != 0 && std::strcmp(s, "0") != 0);
  }();
  return v;
}

}  // namespace k3::cuda::moe_wg
