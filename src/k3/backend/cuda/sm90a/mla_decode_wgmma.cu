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
// two 72 KB stages (session 50: the kernel with its MMAs removed took ~75% of its time; a bare copy stream of the same
// rows, session 52, ~51%) -- not bound by L2 bytes (a 2-CTA cluster that
// read each row from L2 once for both head blocks, session 51's pair form: 1-3% at batch 64-256, -6..-12% at 1-8,
// removed), nor by the stage count (32-key tiles in four stages, session 52: 0.93-1.07x; per-column-block barriers with
// early refills by the producer warps, 0.63-0.74x; both removed), nor by HBM (an H100
// takes the same time as an H200), nor by the copies themselves (its rows alone stream in 220 us of its 432 at nh 96 /
// b64 / 8k, a loads-only probe): under ncu the consumers compute ~55% of the time and wait for full stages the rest --
// loads and compute in series, since both stages are held by the pair being computed (docs/perf/cuda.md, session 52).
// compute-sanitizer racecheck flags the producer's copies against the consumers' P stores; those are ordered by the
// empty mbarrier, which racecheck does not follow (a probe: scripts/perf/probes/racecheck_mbarrier.cu).
#include <cuda_bf16.h>

#include <cmath>

#include "k3/backend/cuda/mla_decode_tc.h"
#include "k3/backend/cuda/mla_decode_wgmma.h"
#include "k3/backend/cuda/sm90a/mbarrier.cuh"
#include "k3/backend/cuda/sm90a/mla_wg_common.cuh"
#include "k3/backend/cuda/sm90a/wgmma.cuh"

namespace k3::cuda::mla_wg {
namespace {

using namespace detail;

constexpr int kThreads = 384;
constexpr int kConsumerRegs = 232, kProducerRegs = 40;  // 2 x 128 x 232 + 128 x 40 <= 65536
constexpr int kBarP0 = 1, kBarP1 = 2, kBarConsumers = 3;  // named barriers (0 is __syncthreads)
constexpr uint32_t kRope = 8 * kBlockBytes;              // a stage's rope column block: P after S
// Exchange floats: max[2][64], scale[2][64], sum[2][64] (index 0: WG0's tile, 1: WG1's; sum[0] unused: WG0 keeps
// the row sums), then the final m and l.
constexpr int kXFloats = 8 * 64;
constexpr size_t kSmemBytes = 1024 + 3 * kTileBytes + kXFloats * sizeof(float) + 4 * sizeof(uint64_t);

__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }

// Keys base + 32 half .. + 31 of a tile into `dst` by one warp (rows past `end`: zeros), coalesced along
// each 1152-byte row; lane l resolves the row of key base + 32 half + l, the copies fetch it by shuffle.
__device__ __forceinline__ void issue_half(uint32_t dst, const MlaSeqRows& rows_of, int base, int end, int half) {
  const int lane = threadIdx.x & 31, key = base + 32 * half + lane;
  const unsigned long long rp = key < end ? reinterpret_cast<unsigned long long>(rows_of.row(key)) : 0ull;
#pragma unroll 8
  for (int u = 0; u < kChunks; ++u) {
    const int j = lane + 32 * u, r = j / kChunks, c = j % kChunks;
    const auto* src = reinterpret_cast<const uint8_t*>(__shfl_sync(0xffffffffu, rp, r));
    if (src)
      cp_async16(dst + swz(32 * half + r, c), src + 16 * c);
    else
      st_shared16(dst + swz(32 * half + r, c), make_uint4(0, 0, 0, 0));
  }
}

// S [64 x 64] = Q K^T of the tile at `kv`, issued and committed (not waited for).
__device__ __forceinline__ void issue_qk(float (&s)[32], uint32_t sQ, uint32_t kv) {
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.f;
  wgmma::fence_regs(s);
  wgmma::fence();
#pragma unroll
  for (int st = 0; st < kSteps; ++st) {
    const uint32_t off = (st >> 2) * kBlockBytes + (st & 3) * 32;  // k16 step inside a 128-byte swizzle row
    wgmma::mma_ss<64>(s, wgmma::make_desc(sQ + off, 16, kSbo), wgmma::make_desc(kv + off, 16, kSbo), st > 0);
  }
  wgmma::commit();
}

struct Rows2 {
  float a, b;  // the thread's rows row0 and row0 + 8
};

// Online softmax of a waited-for S (keys kb ..; those >= k1 masked) against the running max `m`: the new
// max, P (bf16) as A fragments in `pa` and stored at sP (row-major [head][key], swizzled), the row sums of
// P (whole rows: reduced over the quad). Returns the new max.
__device__ __forceinline__ Rows2 softmax_tile(float (&s)[32], int kb, int k1, float scale_log2, Rows2 m,
                                              uint32_t (&pa)[kPvSteps][4], uint32_t sP, int row0, int gc, Rows2& sum) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j)
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
  for (int j = 0; j < 8; ++j) {
    const float p0 = exp2f(s[4 * j] - mn.a), p1 = exp2f(s[4 * j + 1] - mn.a);
    const float p2 = exp2f(s[4 * j + 2] - mn.b), p3 = exp2f(s[4 * j + 3] - mn.b);
    ps0 += p0 + p1;
    ps1 += p2 + p3;
    const uint32_t lo = pack_bf16(p0, p1), hi = pack_bf16(p2, p3);
    pa[j >> 1][(j & 1) * 2] = lo;
    pa[j >> 1][(j & 1) * 2 + 1] = hi;
    st_shared4(sP + row0 * 128 + ((j ^ (row0 & 7)) << 4) + 4 * gc, lo);
    st_shared4(sP + (row0 + 8) * 128 + ((j ^ ((row0 + 8) & 7)) << 4) + 4 * gc, hi);
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

// O += P V over the warpgroup's 256 dims of the stage at `kv`: P from registers or from the stage's rope block.
__device__ __forceinline__ void pv_regs(float (&o)[128], const uint32_t (&pa)[kPvSteps][4], uint32_t kv, int wg) {
  const uint32_t v_half = kv + wg * 4 * kBlockBytes;
  wgmma::fence_regs(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk)
    wgmma::mma_rs<256, wgmma::gmma::Major::MN>(o, pa[kk], wgmma::make_desc(v_half + kk * 2 * kSbo, kVLbo, kSbo));
  wgmma::commit();
}
__device__ __forceinline__ void pv_smem(float (&o)[128], uint32_t kv, int wg) {
  const uint32_t v_half = kv + wg * 4 * kBlockBytes;
  wgmma::fence_regs(o);
  wgmma::fence();
#pragma unroll
  for (int kk = 0; kk < kPvSteps; ++kk)
    wgmma::mma_ss<256, wgmma::gmma::Major::MN>(o, wgmma::make_desc(kv + kRope + kk * 32, 16, kSbo),
                                wgmma::make_desc(v_half + kk * 2 * kSbo, kVLbo, kSbo), 1);
  wgmma::commit();
}
// Waits for the warpgroup's MMAs, then the warp releases the stage (its MMAs on it are done).
__device__ __forceinline__ void pv_done_release(float (&o)[128], uint32_t empty_bar) {
  wgmma::wait<0>();
  wgmma::fence_regs(o);
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbar::arrive(empty_bar);
}

struct Ctx {
  uint32_t sQ, kv0, kv1, full0, full1, empty0, empty1;
  float* x;  // exchange floats
  int k0, k1, n_tiles, row0, gc;
  float scale_log2;
};

// Warpgroup 0: even tiles' S and softmax, O for dims 0..255, the row sums. Returns the final (m, l).
__device__ __forceinline__ void consume_even(const Ctx& c, float (&o)[128], Rows2& m, Rows2& l) {
  float* x_max = c.x;
  float* x_scale = c.x + 128;
  float* x_sum = c.x + 256;
  for (int i = 0; 2 * i < c.n_tiles; ++i) {
    const bool has1 = 2 * i + 1 < c.n_tiles;
    mbar::wait(c.full0, i & 1);
    float s[32];
    issue_qk(s, c.sQ, c.kv0);
    wgmma::wait<0>();
    wgmma::fence_regs(s);
    uint32_t pa[kPvSteps][4];
    Rows2 ps;
    const Rows2 mA = softmax_tile(s, c.k0 + 128 * i, c.k1, c.scale_log2, m, pa, c.kv0 + kRope, c.row0, c.gc, ps);
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
    pv_regs(o, pa, c.kv0, 0);
    pv_done_release(o, c.empty0);  // stage 0 reloads as soon as warpgroup 1 is done with it too
    if (has1) {
      bar_sync(kBarP1);  // warpgroup 1's P1, mB, exp2(mA - mB), row sums of P1
      const Rows2 cB{x_scale[64 + c.row0], x_scale[64 + c.row0 + 8]};
      m = Rows2{x_max[64 + c.row0], x_max[64 + c.row0 + 8]};
      l = Rows2{l.a * cB.a + x_sum[64 + c.row0], l.b * cB.b + x_sum[64 + c.row0 + 8]};
      scale_o(o, cB);
      pv_smem(o, c.kv1, 0);
      pv_done_release(o, c.empty1);
    }
  }
}

// Warpgroup 1: odd tiles' S and softmax, O for dims 256..511.
__device__ __forceinline__ void consume_odd(const Ctx& c, float (&o)[128]) {
  float* x_max = c.x;
  float* x_scale = c.x + 128;
  float* x_sum = c.x + 256;
  for (int i = 0; 2 * i < c.n_tiles; ++i) {
    const bool has1 = 2 * i + 1 < c.n_tiles;
    float s[32];
    if (has1) {
      mbar::wait(c.full1, i & 1);
      issue_qk(s, c.sQ, c.kv1);  // runs while warpgroup 0 finishes its tile
    }
    bar_sync(kBarP0);
    const Rows2 mA{x_max[c.row0], x_max[c.row0 + 8]}, cA{x_scale[c.row0], x_scale[c.row0 + 8]};
    uint32_t pa[kPvSteps][4];
    Rows2 cB{1.f, 1.f};
    if (has1) {
      wgmma::wait<0>();
      wgmma::fence_regs(s);
      Rows2 ps;
      const Rows2 mB = softmax_tile(s, c.k0 + 128 * i + 64, c.k1, c.scale_log2, mA, pa, c.kv1 + kRope, c.row0, c.gc, ps);
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
    pv_smem(o, c.kv0, 1);
    pv_done_release(o, c.empty0);
    if (has1) {
      scale_o(o, cB);
      pv_regs(o, pa, c.kv1, 1);
      pv_done_release(o, c.empty1);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    attend_seesaw_kernel(MlaPaging pg, int nh, const float* __restrict__ q_lat, float scale_log2, int ns,
                         float* __restrict__ o_lat, float* __restrict__ ws) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base_addr = (raw + 1023u) & ~1023u;  // swizzle atoms start 1024-byte aligned
  float* const x = reinterpret_cast<float*>(smem_raw + (base_addr - raw) + 3 * kTileBytes);
  const uint32_t bars = base_addr + 3 * kTileBytes + kXFloats * sizeof(float);  // full0, full1, empty0, empty1

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
  const Ctx c{base_addr, base_addr + kTileBytes, base_addr + 2 * kTileBytes,
              bars,      bars + 8,               bars + 16,
              bars + 24, x,                      k0,
              k1,        (k1 - k0 + kKeys - 1) / kKeys, row0,
              lane & 3,  scale_log2};
  if (threadIdx.x == 0) {
    mbar::init(c.full0, 2);
    mbar::init(c.full1, 2);
    mbar::init(c.empty0, 8);
    mbar::init(c.empty1, 8);
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: stage (warp - 8) / 2, half (warp - 8) % 2 of each of its tiles
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int st = (warp - 8) >> 1, half = (warp - 8) & 1;
    const MlaSeqRows rows_of = mla_seq_rows(pg, seq);
    const uint32_t dst = st ? c.kv1 : c.kv0, full = st ? c.full1 : c.full0, empty = st ? c.empty1 : c.empty0;
    for (int tile = st, u = 0; tile < c.n_tiles; tile += 2, ++u) {
      if (u > 0) mbar::wait(empty, (u - 1) & 1);
      issue_half(dst, rows_of, k0 + kKeys * tile, k1, half);
      cp_async_commit();
      cp_async_wait<0>();
      wgmma::fence_proxy_async();  // this warp's copies -> the consumers' wgmma
      __syncwarp();
      if (lane == 0) mbar::arrive(full);
    }
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
    consume_even(c, o, m, l);
    if (c.gc == 0) {
      s_m[c.row0] = m.a;
      s_m[c.row0 + 8] = m.b;
      s_l[c.row0] = l.a;
      s_l[c.row0 + 8] = l.b;
    }
  } else {
    consume_odd(c, o);
  }
  bar_sync(kBarConsumers);  // the final m and l

  const int dim0 = wg * (kKr / 2) + 2 * c.gc;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = c.row0 + 8 * half, h = h0 + row;
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
      if (wg == 0 && c.gc == 0) {
        w[0] = m * 0.69314718056f;  // natural-log units, as the merge expects
        w[1] = l;
      }
#pragma unroll
      for (int n = 0; n < 32; ++n)
        *reinterpret_cast<float2*>(w + 2 + dim0 + 8 * n) = make_float2(o[4 * n + 2 * half], o[4 * n + 2 * half + 1]);
    }
  }
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
      r.err = cudaFuncSetAttribute(attend_seesaw_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(kSmemBytes));
    return r;
  }();
  return d;
}

}  // namespace

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
  attend_seesaw_kernel<<<grid, kThreads, kSmemBytes, s>>>(pg, nh, q_lat, scale * 1.44269504089f, ns, o_lat, ws);
  if (ns > 1) return mla_detail::merge_splits(pg, N, nh, kKr, ns, kMinSplitKeys, kKeys, ws, o_lat, s);
  return cudaGetLastError();
}

}  // namespace k3::cuda::mla_wg
