// Absorbed MLA decode attention on warpgroup MMAs (wgmma, sm_90a) for BF16 latent rows (mla_decode_wgmma.h), with
// the two MMA warpgroups working on alternate key tiles ("seesaw", the schedule FlashMLA describes; learnt from its
// write-up, not copied) and a producer warpgroup that keeps both K/V stages loading.
//
// Why wgmma: the mma.sync kernel (mla_decode_tc.cu) is bound by the shared-memory pipe at 96 heads (session 6);
// here whole rows of S for 64 heads come from the tensor cores reading Q and K straight from shared memory, and
// bf16 rows are copied as stored (cp.async, no staging pass, no conversion). Why the seesaw: session 9's first
// form ran its phases in series (load wait, S by one warpgroup while the other waited, the softmax with the
// tensor cores idle, P V, a barrier, then the next load); this one is 1.02-1.28x it on every measured shape
// (docs/perf/cuda.md, session 50), which replaced it.
//
// Block = (64 heads of one token, one key split), 384 threads, one block per SM (~220 KB of shared
// memory: Q and two stages of 64 keys, the layouts of mla_wg_common.cuh).
//   warpgroup 0 (O for dims 0..255): S of the even tiles (stage 0), their softmax, P in registers;
//   warpgroup 1 (O for dims 256..511): S of the odd tiles (stage 1), likewise;
//   warpgroup 2 (producer, 40 registers): warps 8 / 9 copy stage 0's two 32-key halves, warps 10 / 11
//     stage 1's, each waiting for its own copies before it signals the stage full (mbarrier), so a stage
//     never waits for the other one.
// Per pair of tiles (t0 even, t1 = t0 + 1), with m the running row max (base 2):
//   WG0: S0 = Q K0^T; mA = max(m, rowmax S0); P0 = exp2(S0 - mA), stored over K0's rope column block
//        (its last use was S0); hands mA and exp2(m - mA) to WG1; O_L = O_L exp2(m - mA) + P0 V0_L;
//        then, with WG1's mB and P1: O_L = O_L exp2(mA - mB) + P1 V1_L.
//   WG1: S1 = Q K1^T issued at once (it overlaps WG0's softmax and P V), then with mA:
//        mB = max(mA, rowmax S1), P1 = exp2(S1 - mB) stored over K1's rope block, handed to WG0;
//        O_R = O_R exp2(m - mA) + P0 V0_R; O_R = O_R exp2(mA - mB) + P1 V1_R.
// Both warpgroups do the same MMA work (one S of 576, two P V halves of 256), and one's S runs while the
// other's softmax runs. The exchange goes through named barriers (1: WG0 -> WG1, 2: WG1 -> WG0); each
// consumer warp releases a stage (mbarrier, 8 arrivals) after its last MMA on it. WG0 keeps the row sum l.
// Operands rounded as the mma.sync kernel rounds them (bf16 Q, rows as stored, bf16 P): the same tolerances.
// Key splits (flash-decoding) and their merge as in the other kernels (mla_detail::split_chunk / merge_splits,
// granularity 64 keys). nh that is not a multiple of 64: the last block's missing heads are zero rows of Q, never
// written. Where it stands (sessions 50-51): at 96 heads / batch 64 a block streams all 8192 keys of its token through
// two 72 KB stages, and those loads alone take ~75% of the kernel's time; they are bound by the stages' round trips,
// not by L2 bytes -- a 2-CTA cluster that read each row from L2 once for both head blocks (session 51's pair form)
// gained 1-3% at batch 64-256 and lost 6-12% at batch 1-8, and was removed (docs/perf/cuda.md, session 51).
// Tiles of 32 keys (TILE = 32, K3_MLA_WG_TILE=32, session 52): the same shared memory as four stages of 32 keys,
// so that while the two MMA warpgroups hold a pair of tiles (64 keys) the next pair is already loading -- with
// 64-key tiles the pair in use is both stages and a stage reloads only after its pair is done. S is m64n32, P V
// two k16 steps, P stored over the stage's 4 KB rope block with rows of 64 bytes (64-byte swizzle), one producer
// warp per stage.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/mla_decode_tc.h"
#include "k3/backend/cuda/mla_decode_wgmma.h"
#include "k3/backend/cuda/sm90a/mla_wg_common.cuh"
#include "k3/backend/cuda/sm90a/wgmma.cuh"

namespace k3::cuda::mla_wg {
namespace {

using namespace detail;

constexpr int kThreads = 384;
constexpr int kConsumerRegs = 232, kProducerRegs = 40;  // 2 x 128 x 232 + 128 x 40 <= 65536
constexpr int kBarP0 = 1, kBarP1 = 2, kBarConsumers = 3;  // named barriers (0 is __syncthreads)
// A stage of TILE keys (TILE = 64: two stages, 32: four; the same 147456 bytes): 9 column blocks of TILE rows.
template <int TILE>
struct Geo {
  static constexpr int kStages = 128 / TILE;
  static constexpr int kHalves = TILE / 32;            // producer warps per stage (32 keys each)
  static constexpr uint32_t kBlk = TILE * 128;          // one column block of a stage
  static constexpr uint32_t kStageBytes = kColBlocks * kBlk;
  static constexpr uint32_t kRope = 8 * kBlk;           // the stage's rope column block: P after S
  static constexpr int kS = TILE / 2;                   // S floats a thread (m64nTILE)
  static constexpr int kPv = TILE / 16;                 // k16 steps of P V
};
static_assert(Geo<64>::kStages * Geo<64>::kStageBytes == 2 * kTileBytes && Geo<32>::kStages * Geo<32>::kStageBytes == 2 * kTileBytes,
              "both tilings fill the same shared memory");
// Exchange floats: max[2][64], scale[2][64], sum[2][64] (index 0: WG0's tile, 1: WG1's; sum[0] unused: WG0 keeps
// the row sums), then the final m and l.
constexpr int kXFloats = 8 * 64;
constexpr size_t kSmemBytes = 1024 + 3 * kTileBytes + kXFloats * sizeof(float) + 8 * sizeof(uint64_t);

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }

// Keys base + 32 half .. + 31 of a tile into `dst` by one warp (rows past `end`: zeros), coalesced along
// each 1152-byte row; lane l resolves the row of key base + 32 half + l, the copies fetch it by shuffle.
template <int TILE>
__device__ __forceinline__ void issue_half(uint32_t dst, const MlaSeqRows& rows_of, int base, int end, int half) {
  const int lane = threadIdx.x & 31, key = base + 32 * half + lane;
  const unsigned long long rp = key < end ? reinterpret_cast<unsigned long long>(rows_of.row(key)) : 0ull;
#pragma unroll 8
  for (int u = 0; u < kChunks; ++u) {
    const int j = lane + 32 * u, r = j / kChunks, c = j % kChunks;
    const auto* src = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, rp, r));
    const int row = 32 * half + r;
    const uint32_t off = (c >> 3) * Geo<TILE>::kBlk + row * 128 + (((c & 7) ^ (row & 7)) << 4);  // swz for TILE rows
    if (src)
      cp_async16(dst + off, src + 16 * c);
    else
      st_shared16(dst + off, make_uint4(0, 0, 0, 0));
  }
}

// S [64 x TILE] = Q K^T of the tile at `kv`, issued and committed (not waited for).
template <int TILE>
__device__ __forceinline__ void issue_qk(float (&s)[Geo<TILE>::kS], uint32_t sQ, uint32_t kv) {
#pragma unroll
  for (int i = 0; i < Geo<TILE>::kS; ++i) s[i] = 0.f;
  wgmma::fence_regs(s);
  wgmma::fence();
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    const uint32_t in_row = (st & 3) * 32;  // k16 step inside a 128-byte swizzle row
    const uint64_t a = wgmma::make_desc(sQ + (st >> 2) * kBlockBytes + in_row, 16, kSbo);
    const uint64_t b = wgmma::make_desc(kv + (st >> 2) * Geo<TILE>::kBlk + in_row, 16, kSbo);
    if constexpr (TILE == 64)
      wgmma::mma_m64n64k16_ss(s, a, b, st > 0);
    else
      wgmma::mma_m64n32k16_ss(s, a, b, st > 0);
  }
  wgmma::commit();
}

struct Rows2 {
  float a, b;  // the thread's rows row0 and row0 + 8
};

// Online softmax of a waited-for S (keys kb ..; those >= k1 masked) against the running max `m`: the new
// max, P (bf16) as A fragments in `pa` and stored at sP (row-major [head][key], swizzled), the row sums of
// P (whole rows: reduced over the quad). Returns the new max.
// P's rows: TILE 64: 128 bytes, 128-byte swizzle (as the stages); TILE 32: 64 bytes, 64-byte swizzle (chunk c of row
// r at (c ^ ((r >> 1) & 3)) * 16), which fits the 32-key stage's 4 KB rope block.
template <int TILE>
__device__ __forceinline__ uint32_t p_off(int row, int j) {
  if constexpr (TILE == 64) return row * 128 + ((j ^ (row & 7)) << 4);
  return row * 64 + ((j ^ ((row >> 1) & 3)) << 4);
}
template <int TILE>
__device__ __forceinline__ Rows2 softmax_tile(float (&s)[Geo<TILE>::kS], int kb, int k1, float scale_log2, Rows2 m,
                                              uint32_t (&pa)[Geo<TILE>::kPv][4], uint32_t sP, int row0, int gc, Rows2& sum) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < TILE / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = kb + 8 * j + 2 * gc + (e & 1);
      s[4 * j + e] = key < k1 ? s[4 * j + e] * scale_log2 : -INFINITY;
      if (e < 2)
        mx0 = fmaxf(mx0, s[4 * j + e]);
      else
        mx1 = fmaxf(mx1, s[4 * j + e]);
    }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
  }
  const Rows2 mn{fmaxf(m.a, mx0), fmaxf(m.b, mx1)};  // finite: every tile has a key < k1
  float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
  for (int j = 0; j < TILE / 8; ++j) {
    const float p0 = exp2f(s[4 * j] - mn.a), p1 = exp2f(s[4 * j + 1] - mn.a);
    const float p2 = exp2f(s[4 * j + 2] - mn.b), p3 = exp2f(s[4 * j + 3] - mn.b);
    ps0 += p0 + p1;
    ps1 += p2 + p3;
    const uint32_t lo = pack_bf16(p0, p1), hi = pack_bf16(p2, p3);
    pa[j >> 1][(j & 1) * 2] = lo;
    pa[j >> 1][(j & 1) * 2 + 1] = hi;
    st_shared4(sP + p_off<TILE>(row0, j) + 4 * gc, lo);
    st_shared4(sP + p_off<TILE>(row0 + 8, j) + 4 * gc, hi);
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    ps0 += __shfl_xor_sync(0xffffffffu, ps0, off);
    ps1 += __shfl_xor_sync(0xffffffffu, ps1, off);
  }
  sum = Rows2{ps0, ps1};
  return mn;
}

__device__ __forceinline__ void scale_o(float (&o)[128], Rows2 c) {
#pragma unroll
  for (int n = 0; n < 32; ++n) {
    o[4 * n] *= c.a;
    o[4 * n + 1] *= c.a;
    o[4 * n + 2] *= c.b;
    o[4 * n + 3] *= c.b;
  }
}

// O += P V over the warpgroup's 256 dims of the stage at `kv`: P from registers or from the stage's rope block. V is
// read N-major: the next 64 dims are the next column block (LBO = kBlk), the next 8 keys kSbo on.
template <int TILE>
__device__ __forceinline__ void pv_regs(float (&o)[128], const uint32_t (&pa)[Geo<TILE>::kPv][4], uint32_t kv, int wg) {
  const uint32_t v_half = kv + wg * 4 * Geo<TILE>::kBlk;
  wgmma::fence_regs(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < Geo<TILE>::kPv; ++kk)
    wgmma::mma_m64n256k16_rs_tb(o, pa[kk], wgmma::make_desc(v_half + kk * 2 * kSbo, Geo<TILE>::kBlk, kSbo));
  wgmma::commit();
}
template <int TILE>
__device__ __forceinline__ void pv_smem(float (&o)[128], uint32_t kv, int wg) {
  const uint32_t v_half = kv + wg * 4 * Geo<TILE>::kBlk;
  wgmma::fence_regs(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < Geo<TILE>::kPv; ++kk) {
    const uint32_t p = kv + Geo<TILE>::kRope + kk * 32;  // k16 step inside P's row
    const uint64_t a = TILE == 64 ? wgmma::make_desc(p, 16, kSbo) : wgmma::make_desc_sw64(p, 16, 8 * 64);
    wgmma::mma_m64n256k16_ss_tb(o, a, wgmma::make_desc(v_half + kk * 2 * kSbo, Geo<TILE>::kBlk, kSbo), 1);
  }
  wgmma::commit();
}
// Waits for the warpgroup's MMAs, then the warp releases the stage (its MMAs on it are done).
__device__ __forceinline__ void pv_done_release(float (&o)[128], uint32_t empty_bar) {
  wgmma::wait<0>();
  wgmma::fence_regs(o);
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbar_arrive(empty_bar);
}

// The block's O: the final rows (one split) or the split's unnormalised partials with m and l (the merge's input).
__device__ __forceinline__ void store_out(const float (&o)[128], const float* s_m, const float* s_l, int wg, int row0,
                                          int gc, int h0, int nh, int t, int ti, int sp, int ns, float* __restrict__ o_lat,
                                          float* __restrict__ ws) {
  const int dim0 = wg * (kKr / 2) + 2 * gc;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row0 + 8 * half, h = h0 + row;
    if (h >= nh) continue;
    const float m = s_m[row], l = s_l[row];
    if (ns == 1) {
      const float inv = 1.0f / l;
      float* og = o_lat + (static_cast<int64_t>(t) * nh + h) * kKr + dim0;
#pragma unroll
      for (int n = 0; n < 32; ++n)
        *reinterpret_cast<float2*>(og + 8 * n) = make_float2(o[4 * n + 2 * half] * inv, o[4 * n + 2 * half + 1] * inv);
    } else {
      float* w = ws + ((static_cast<int64_t>(ti) * nh + h) * ns + sp) * (kKr + 2);
      if (wg == 0 && gc == 0) {
        w[0] = m * 0.69314718056f;  // natural-log units, as the merge expects
        w[1] = l;
      }
#pragma unroll
      for (int n = 0; n < 32; ++n)
        *reinterpret_cast<float2*>(w + 2 + dim0 + 8 * n) = make_float2(o[4 * n + 2 * half], o[4 * n + 2 * half + 1]);
    }
  }
}

struct Ctx {
  uint32_t sQ, kv_base, bars;  // stage st at kv_base + st * kStageBytes; full[st] at bars + 8 st, empty[st] 8 stages on
  float* x;                    // exchange floats
  int k0, k1, n_tiles, row0, gc;
  float scale_log2;
};

// Tile t's stage, its full / empty mbarriers and the parity of its use (the stage's u-th tile waits for parity u & 1).
template <int TILE>
struct StageOf {
  uint32_t kv, full, empty, parity;
  __device__ __forceinline__ StageOf(const Ctx& c, int t) {
    constexpr int S = Geo<TILE>::kStages;
    const int st = t % S;
    kv = c.kv_base + st * Geo<TILE>::kStageBytes;
    full = c.bars + 8 * st;
    empty = c.bars + 8 * (S + st);
    parity = (t / S) & 1;
  }
};

// Warpgroup 0: even tiles' S and softmax, O for dims 0..255, the row sums. Returns the final (m, l).
template <int TILE>
__device__ __forceinline__ void consume_even(const Ctx& c, float (&o)[128], Rows2& m, Rows2& l) {
  using G = Geo<TILE>;
  float* x_max = c.x;
  float* x_scale = c.x + 128;
  float* x_sum = c.x + 256;
  for (int i = 0; 2 * i < c.n_tiles; ++i) {
    const bool has1 = 2 * i + 1 < c.n_tiles;
    const StageOf<TILE> e(c, 2 * i), d(c, 2 * i + 1);
    mbar_wait(e.full, e.parity);
    float s[G::kS];
    issue_qk<TILE>(s, c.sQ, e.kv);
    wgmma::wait<0>();
    wgmma::fence_regs(s);
    uint32_t pa[G::kPv][4];
    Rows2 ps;
    const Rows2 mA = softmax_tile<TILE>(s, c.k0 + 2 * TILE * i, c.k1, c.scale_log2, m, pa, e.kv + G::kRope, c.row0, c.gc, ps);
    const Rows2 cA{exp2f(m.a - mA.a), exp2f(m.b - mA.b)};  // 0 on the first tile
    if (c.gc == 0) {
      x_max[c.row0] = mA.a;
      x_max[c.row0 + 8] = mA.b;
      x_scale[c.row0] = cA.a;
      x_scale[c.row0 + 8] = cA.b;
    }
    wgmma::fence_proxy_async();  // P's generic stores -> warpgroup 1's wgmma
    bar_arrive(kBarP0);
    l = Rows2{l.a * cA.a + ps.a, l.b * cA.b + ps.b};
    m = mA;
    scale_o(o, cA);
    pv_regs<TILE>(o, pa, e.kv, 0);
    pv_done_release(o, e.empty);  // the even stage reloads as soon as warpgroup 1 is done with it too
    if (has1) {
      bar_sync(kBarP1);  // warpgroup 1's P1, mB, exp2(mA - mB), row sums of P1
      const Rows2 cB{x_scale[64 + c.row0], x_scale[64 + c.row0 + 8]};
      m = Rows2{x_max[64 + c.row0], x_max[64 + c.row0 + 8]};
      l = Rows2{l.a * cB.a + x_sum[64 + c.row0], l.b * cB.b + x_sum[64 + c.row0 + 8]};
      scale_o(o, cB);
      pv_smem<TILE>(o, d.kv, 0);
      pv_done_release(o, d.empty);
    }
  }
}

// Warpgroup 1: odd tiles' S and softmax, O for dims 256..511.
template <int TILE>
__device__ __forceinline__ void consume_odd(const Ctx& c, float (&o)[128]) {
  using G = Geo<TILE>;
  float* x_max = c.x;
  float* x_scale = c.x + 128;
  float* x_sum = c.x + 256;
  for (int i = 0; 2 * i < c.n_tiles; ++i) {
    const bool has1 = 2 * i + 1 < c.n_tiles;
    const StageOf<TILE> e(c, 2 * i), d(c, 2 * i + 1);
    float s[G::kS];
    if (has1) {
      mbar_wait(d.full, d.parity);
      issue_qk<TILE>(s, c.sQ, d.kv);  // runs while warpgroup 0 finishes its tile
    }
    bar_sync(kBarP0);
    const Rows2 mA{x_max[c.row0], x_max[c.row0 + 8]}, cA{x_scale[c.row0], x_scale[c.row0 + 8]};
    uint32_t pa[G::kPv][4];
    Rows2 cB{1.f, 1.f};
    if (has1) {
      wgmma::wait<0>();
      wgmma::fence_regs(s);
      Rows2 ps;
      const Rows2 mB =
          softmax_tile<TILE>(s, c.k0 + 2 * TILE * i + TILE, c.k1, c.scale_log2, mA, pa, d.kv + G::kRope, c.row0, c.gc, ps);
      cB = Rows2{exp2f(mA.a - mB.a), exp2f(mA.b - mB.b)};
      if (c.gc == 0) {
        x_max[64 + c.row0] = mB.a;
        x_max[64 + c.row0 + 8] = mB.b;
        x_scale[64 + c.row0] = cB.a;
        x_scale[64 + c.row0 + 8] = cB.b;
        x_sum[64 + c.row0] = ps.a;
        x_sum[64 + c.row0 + 8] = ps.b;
      }
      wgmma::fence_proxy_async();  // P1's generic stores -> warpgroup 0's wgmma
      bar_arrive(kBarP1);
    }
    // (P0 V0 is not issued before the softmax of S1: any non-wgmma access to a wgmma's registers while another
    // is in flight makes ptxas serialise every wgmma of the kernel, C7514 / C7515.)
    scale_o(o, cA);
    pv_smem<TILE>(o, e.kv, 1);
    pv_done_release(o, e.empty);
    if (has1) {
      scale_o(o, cB);
      pv_regs<TILE>(o, pa, d.kv, 1);
      pv_done_release(o, d.empty);
    }
  }
}

// The producer warpgroup: warp p copies 32-key half (p % kHalves) of stage (p / kHalves) for each of the stage's tiles,
// after its consumers released it.
template <int TILE>
__device__ __forceinline__ void produce(const Ctx& c, const MlaSeqRows& rows_of, int p, int lane) {
  using G = Geo<TILE>;
  const int st = p / G::kHalves, half = p % G::kHalves;
  for (int tile = st; tile < c.n_tiles; tile += G::kStages) {
    const StageOf<TILE> g(c, tile);
    if (tile >= G::kStages) mbar_wait(g.empty, g.parity ^ 1);  // the previous use's release
    issue_half<TILE>(g.kv, rows_of, c.k0 + TILE * tile, c.k1, half);
    cp_async_commit();
    cp_async_wait<0>();
    wgmma::fence_proxy_async();  // this warp's copies -> the consumers' wgmma
    __syncwarp();
    if (lane == 0) mbar_arrive(g.full);
  }
}

template <int TILE>
__global__ void __launch_bounds__(kThreads, 1)
    attend_seesaw_kernel(MlaPaging pg, int nh, const float* __restrict__ q_lat, float scale_log2, int ns,
                         float* __restrict__ o_lat, float* __restrict__ ws) {
  using G = Geo<TILE>;
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base_addr = (raw + 1023u) & ~1023u;  // swizzle atoms start 1024-byte aligned
  float* const x = reinterpret_cast<float*>(smem_raw + (base_addr - raw) + 3 * kTileBytes);
  const uint32_t bars = base_addr + 3 * kTileBytes + kXFloats * sizeof(float);  // full[kStages], empty[kStages]

  const int ti = blockIdx.y, sp = blockIdx.z;
  const int t = pg.tok_index ? pg.tok_index[ti] : ti;
  const int seq = pg.tok_seq[t], len = pg.tok_pos[t] + 1;
  const int chunk = mla_detail::split_chunk(len, ns, kMinSplitKeys, kKeys);
  const int k0 = sp * chunk;
  if (k0 >= len) return;  // an unused split: the merge does not read it
  const int k1 = min(len, k0 + chunk);
  const int h0 = blockIdx.x * kHeadsPerBlock;
  // Warp-uniform by construction (a shuffle from lane 0): ptxas must see the warpgroup branches as uniform.
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 5), 0), lane = static_cast<int>(threadIdx.x & 31);
  const int row0 = ((static_cast<int>(threadIdx.x) & 127) >> 5) * 16 + (lane >> 2);  // accumulator rows row0, row0 + 8
  const Ctx c{base_addr, base_addr + kTileBytes, bars, x, k0, k1, (k1 - k0 + TILE - 1) / TILE, row0, lane & 3, scale_log2};
  if (threadIdx.x == 0) {
    for (int st = 0; st < G::kStages; ++st) {
      mbar_init(bars + 8 * st, G::kHalves);
      mbar_init(bars + 8 * (G::kStages + st), 8);
    }
  }
  __syncthreads();

  if (warp >= 8) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    produce<TILE>(c, mla_seq_rows(pg, seq), warp - 8, lane);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  load_q(c.sQ, q_lat, t, nh, h0);
  wgmma::fence_proxy_async();
  bar_sync(kBarConsumers);

  const int wg = warp >> 2;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float* s_m = x + 6 * 64;
  float* s_l = x + 7 * 64;
  if (wg == 0) {
    Rows2 m{-INFINITY, -INFINITY}, l{0.f, 0.f};
    consume_even<TILE>(c, o, m, l);
    if (c.gc == 0) {
      s_m[c.row0] = m.a;
      s_m[c.row0 + 8] = m.b;
      s_l[c.row0] = l.a;
      s_l[c.row0 + 8] = l.b;
    }
  } else {
    consume_odd<TILE>(c, o);
  }
  bar_sync(kBarConsumers);  // the final m and l
  store_out(o, s_m, s_l, wg, c.row0, c.gc, h0, nh, t, ti, sp, ns, o_lat, ws);
}

struct Device {
  int sms = 132;
  cudaError_t err = cudaSuccess;
};

// The SM count and the kernel's shared-memory limit, once per process.
const Device& device() {
  static const Device d = [] {
    Device r;
    int dev = 0;
    r.err = cudaGetDevice(&dev);
    if (r.err == cudaSuccess) r.err = cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev);
    if (r.err == cudaSuccess)
      r.err = cudaFuncSetAttribute(attend_seesaw_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kSmemBytes));
    if (r.err == cudaSuccess)
      r.err = cudaFuncSetAttribute(attend_seesaw_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kSmemBytes));
    return r;
  }();
  return d;
}

}  // namespace

// K3_MLA_WG_TILE=32 | 64 (read per call, like K3_MLA_DECODE: the tests and the timing switch it): keys per tile.
int tile_keys() {
  const char* e = std::getenv("K3_MLA_WG_TILE");
  return e && std::strcmp(e, "32") == 0 ? 32 : 64;
}

bool supports(int kr, int dr, CacheDType dtype) { return kr == kKr && kr + dr == kCd && dtype == CacheDType::BF16; }

int splits(int N, int nh) {
  const int64_t per = static_cast<int64_t>(N) * ((nh + kHeadsPerBlock - 1) / kHeadsPerBlock);
  return mla_detail::even_splits(per, device().sms, device().sms);
}

size_t workspace_floats(int N, int nh, int kr) {
  const int ns = splits(N, nh);
  return ns == 1 ? 0 : static_cast<size_t>(N) * nh * ns * (kr + 2);
}

cudaError_t attend(const MlaPaging& pg, int N, int nh, const float* q_lat, float scale, float* o_lat, float* ws,
                   cudaStream_t s) {
  if (!supports(pg.kr, pg.dr, pg.dtype)) return cudaErrorInvalidValue;
  if (device().err != cudaSuccess) return device().err;
  const int ns = ws ? splits(N, nh) : 1;
  const dim3 grid(static_cast<unsigned>((nh + kHeadsPerBlock - 1) / kHeadsPerBlock), static_cast<unsigned>(N),
                  static_cast<unsigned>(ns));
  if (tile_keys() == 32)
    attend_seesaw_kernel<32><<<grid, kThreads, kSmemBytes, s>>>(pg, nh, q_lat, scale * 1.44269504089f, ns, o_lat, ws);
  else
    attend_seesaw_kernel<64><<<grid, kThreads, kSmemBytes, s>>>(pg, nh, q_lat, scale * 1.44269504089f, ns, o_lat, ws);
  if (ns > 1) return mla_detail::merge_splits(pg, N, nh, kKr, ns, kMinSplitKeys, kKeys, ws, o_lat, s);
  return cudaGetLastError();
}

}  // namespace k3::cuda::mla_wg
