// Absorbed MLA decode attention on tensor cores (mma.sync m16n8k16, bf16 operands, fp32 accumulators).
//
// Block = (32 heads of one token, one key split), 8 warps. All 32 heads share the latent rows, so a tile
// of 32 rows is read from memory once per block (FlashMLA's idea) and the two products are MMAs:
//   S [32 heads x 32 keys] = Q [32 x 576] . K^T      O [32 x 512] += P [32 x 32] . V [32 x 512]
// Warp w = (head tile mt = w / 4 of 16 heads, quarter qq = w % 4). For S the warp multiplies its heads'
// q over dims [144 qq, 144 qq + 144) (its 9 A fragments stay in registers for the whole block) by all
// 32 keys: the four quarters' partial scores meet in shared memory and every warp of the head tile sums
// them into the same full scores (same order: identical softmax in the four warps). For O the warp owns
// dims [128 qq, 128 qq + 128) of its 16 heads (64 fp32 accumulators per thread). Online softmax in
// base 2 in fp32. Rows arrive by cp.async in a 2-stage ring of staging tiles in the stored cache dtype
// (RowLoader<DT>: F32, BF16, FP8_E4M3 rows, converted to bf16 per tile), so tiles k+1 and k+2 are in flight while tile k, converted to bf16, is multiplied: with
// one block per SM (205 KB of shared memory) that is what keeps enough bytes in flight (v1 held one tile
// in registers and was latency-bound: docs/perf/cuda.md, session 6). Key splits as in the SIMT kernel (flash-decoding),
// merged by mla_detail::merge_splits.
#include "k3/backend/cuda/mla_decode_tc.h"

#include <algorithm>
#include <cmath>

#include "k3/backend/cuda/mla_row_loader.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda::mla_tc {
namespace {

constexpr int kQuarters = 4;
constexpr int kSliceK = kCd / kQuarters;  // 144 dims of q.k per warp
constexpr int kSteps = kSliceK / 16;      // 9 k-steps
constexpr int kSliceV = kKr / kQuarters;  // 128 output dims per warp
constexpr int kVTiles = kSliceV / 8;      // 16 n-tiles
constexpr int kSPad = kKeys + 8;          // fp32 score row stride: float2 reads of 4 rows per half-warp hit 32 banks
constexpr int kTileBytes = kKeys * kRowPad * 2;
constexpr int kSPartBytes = sizeof(float) * kQuarters * kHeadsPerBlock * kSPad;
// Shared memory: 2 staging stages of the stored rows, one bf16 tile, the partial scores.
template <CacheDType DT>
constexpr size_t smem_bytes() {
  return 2 * static_cast<size_t>(RowLoader<DT>::kStageBytes) + kTileBytes + kSPartBytes;
}
static_assert(kKeys == 32, "RowLoader resolves one key per lane");
static_assert(kThreads == 2 * kQuarters * 32, "8 warps: 2 head tiles x 4 quarters");

// Not volatile: a pure function of its registers, so the compiler may interleave MMAs with other work.
// The ldmatrix loads stay volatile (they read shared memory other threads write between barriers);
// their order is the source order, so the loops below issue each fragment one step ahead of its use.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ float2 ld_q(const float* row, int d) {
  return row ? __ldg(reinterpret_cast<const float2*>(row + d)) : make_float2(0.f, 0.f);
}

// The thread's A fragments of q (rows gr and gr + 8 of its head tile) over its quarter of the dims.
__device__ __forceinline__ void load_q(const float* q0, const float* q1, int qq, int gc, uint32_t (&qa)[kSteps][4]) {
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int d = qq * kSliceK + s * 16 + 2 * gc;
    const float2 a = ld_q(q0, d), b = ld_q(q1, d), c = ld_q(q0, d + 8), e = ld_q(q1, d + 8);
    qa[s][0] = pack_bf16(a.x, a.y);
    qa[s][1] = pack_bf16(b.x, b.y);
    qa[s][2] = pack_bf16(c.x, c.y);
    qa[s][3] = pack_bf16(e.x, e.y);
  }
}

// This warp's quarter of the scores of its 16 heads against the tile's 32 keys (B = K^T from the bf16 tile by
// non-transposed ldmatrix at `k_addr`; step s + 1's fragments load while step s multiplies).
__device__ __forceinline__ void quarter_scores(uint32_t k_addr, const uint32_t (&qa)[kSteps][4], float (&sc)[4][4]) {
#pragma unroll
  for (int n = 0; n < 4; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
  uint32_t kb[2][2][4];  // [step & 1][key half][fragment]
#pragma unroll
  for (int p = 0; p < 2; ++p) ldsm_x4(k_addr + p * 16 * kRowPad * 2, kb[0][p][0], kb[0][p][1], kb[0][p][2], kb[0][p][3]);
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (s + 1 < kSteps)
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        uint32_t(&b)[4] = kb[(s + 1) & 1][p];
        ldsm_x4(k_addr + (p * 16 * kRowPad + (s + 1) * 16) * 2, b[0], b[1], b[2], b[3]);
      }
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      mma_bf16(sc[2 * p], qa[s], kb[s & 1][p][0], kb[s & 1][p][1]);
      mma_bf16(sc[2 * p + 1], qa[s], kb[s & 1][p][2], kb[s & 1][p][3]);
    }
  }
}

// O += P V over this warp's value dims (B = V from the bf16 tile by transposed ldmatrix at `v_addr`; each x4 load one
// ahead of its MMAs).
__device__ __forceinline__ void accumulate_pv(uint32_t v_addr, const uint32_t (&pa)[2][4], float (&o)[kVTiles][4]) {
  constexpr int kLoads = 2 * kVTiles / 2;  // (kk, j) pairs: 16 x4 loads
  uint32_t vb[2][4];
  ldsm_x4_t(v_addr, vb[0][0], vb[0][1], vb[0][2], vb[0][3]);
#pragma unroll
  for (int i = 0; i < kLoads; ++i) {
    if (i + 1 < kLoads) {
      const int kk = (i + 1) / (kVTiles / 2), j = (i + 1) % (kVTiles / 2);
      uint32_t(&b)[4] = vb[(i + 1) & 1];
      ldsm_x4_t(v_addr + (kk * 16 * kRowPad + j * 16) * 2, b[0], b[1], b[2], b[3]);
    }
    const int kk = i / (kVTiles / 2), j = i % (kVTiles / 2);
    mma_bf16(o[2 * j], pa[kk], vb[i & 1][0], vb[i & 1][1]);
    mma_bf16(o[2 * j + 1], pa[kk], vb[i & 1][2], vb[i & 1][3]);
  }
}

template <CacheDType DT>
__global__ void __launch_bounds__(kThreads, 1)
    attend_tc_kernel(MlaPaging pg, int nh, const float* __restrict__ q_lat, float scale_log2, int ns,
                     float* __restrict__ o_lat, float* __restrict__ ws) {
  pdl::begin();
  extern __shared__ __align__(16) unsigned char smem[];
  using Loader = RowLoader<DT>;
  auto* kv = reinterpret_cast<__nv_bfloat16*>(smem + 2 * Loader::kStageBytes);        // [kKeys][kRowPad]
  auto* spart = reinterpret_cast<float*>(smem + 2 * Loader::kStageBytes + kTileBytes);  // [kQuarters][32 heads][kSPad]
  auto stage_of = [&](int i) { return smem + (i & 1) * Loader::kStageBytes; };  // [2] stages
  const int ti = blockIdx.y, sp = blockIdx.z;
  const int t = pg.tok_index ? pg.tok_index[ti] : ti;
  const int seq = pg.tok_seq[t], len = pg.tok_pos[t] + 1;
  const MlaSeqRows rows_of = mla_seq_rows(pg, seq);
  const int chunk = mla_detail::split_chunk(len, ns, kMinSplitKeys, kKeys);
  const int k0 = sp * chunk;
  if (k0 >= len) return;  // an unused split: the merge does not read it
  const int k1 = min(len, k0 + chunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mt = warp / kQuarters, qq = warp % kQuarters;
  const int gr = lane >> 2, gc = lane & 3;
  const int head0 = blockIdx.x * kHeadsPerBlock + mt * 16 + gr;  // the thread's rows: head0, head0 + 8

  // Two tiles in flight from the start; one cp.async group per tile (empty past the end) keeps the
  // group count uniform for wait_group.
  Loader::issue(stage_of(0), rows_of, k0, k1);
  cp_async_commit();
  if (k0 + kKeys < k1) Loader::issue(stage_of(1), rows_of, k0 + kKeys, k1);
  cp_async_commit();
  uint32_t qa[kSteps][4];
  load_q(head0 < nh ? q_lat + (static_cast<int64_t>(t) * nh + head0) * kCd : nullptr,
         head0 + 8 < nh ? q_lat + (static_cast<int64_t>(t) * nh + head0 + 8) * kCd : nullptr, qq, gc, qa);

  float o[kVTiles][4];
#pragma unroll
  for (int n = 0; n < kVTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  // ldmatrix row addresses: lanes 8i..8i+7 give the rows of 8x8 matrix i.
  const int mi = lane >> 3, rr = lane & 7;
  const uint32_t kv_addr = static_cast<uint32_t>(__cvta_generic_to_shared(kv));
  // K for S (B = K^T, non-transposed load): matrices (keys 0-7, dims +0), (0-7, +8), (8-15, +0), (8-15, +8).
  const uint32_t s_off = ((rr + 8 * (mi >> 1)) * kRowPad + qq * kSliceK + 8 * (mi & 1)) * 2;
  // V for O (B = V, transposed load): matrices (keys 0-7, dims +0), (8-15, +0), (0-7, +8), (8-15, +8).
  const uint32_t v_off = ((rr + 8 * (mi & 1)) * kRowPad + qq * kSliceV + 8 * (mi >> 1)) * 2;
  float* s_mine = spart + (qq * kHeadsPerBlock + mt * 16 + gr) * kSPad + 2 * gc;
  const float* s_row = spart + (mt * 16 + gr) * kSPad + 2 * gc;

  int it = 0;
  for (int base = k0; base < k1; base += kKeys, ++it) {
    // Tile `it` sits in stage it & 1: convert this thread's chunks, then refill the stage with tile it + 2.
    cp_async_wait<1>();
    Loader::convert(stage_of(it), kv);
    if (base + 2 * kKeys < k1) Loader::issue(stage_of(it), rows_of, base + 2 * kKeys, k1);
    cp_async_commit();
    __syncthreads();  // the bf16 tile is complete
    const uint32_t tile = kv_addr;
    // Partial scores of this quarter: 16 heads x 32 keys.
    float sc[4][4];
    quarter_scores(tile + s_off, qa, sc);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      *reinterpret_cast<float2*>(s_mine + 8 * n) = make_float2(sc[n][0], sc[n][1]);
      *reinterpret_cast<float2*>(s_mine + 8 * kSPad + 8 * n) = make_float2(sc[n][2], sc[n][3]);
    }
    __syncthreads();
    // Full scores (sum of the quarters, in quarter order), scaled to base 2, keys past the split masked.
    float x[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      float2 a = make_float2(0.f, 0.f), b = make_float2(0.f, 0.f);
#pragma unroll
      for (int q = 0; q < kQuarters; ++q) {
        const float2 u = *reinterpret_cast<const float2*>(s_row + q * kHeadsPerBlock * kSPad + 8 * n);
        const float2 v = *reinterpret_cast<const float2*>(s_row + q * kHeadsPerBlock * kSPad + 8 * kSPad + 8 * n);
        a.x += u.x; a.y += u.y; b.x += v.x; b.y += v.y;
      }
      const int key = base + 8 * n + 2 * gc;
      x[n][0] = key < k1 ? a.x * scale_log2 : -INFINITY;
      x[n][1] = key + 1 < k1 ? a.y * scale_log2 : -INFINITY;
      x[n][2] = key < k1 ? b.x * scale_log2 : -INFINITY;
      x[n][3] = key + 1 < k1 ? b.y * scale_log2 : -INFINITY;
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      mx0 = fmaxf(mx0, fmaxf(x[n][0], x[n][1]));
      mx1 = fmaxf(mx1, fmaxf(x[n][2], x[n][3]));
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
    }
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: every tile has a key < k1
    const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);  // 0 on the first tile (m = -inf)
    m0 = mn0;
    m1 = mn1;
    uint32_t pa[2][4];
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float p0 = exp2f(x[n][0] - mn0), p1 = exp2f(x[n][1] - mn0);
      const float p2 = exp2f(x[n][2] - mn1), p3 = exp2f(x[n][3] - mn1);
      ps0 += p0 + p1;
      ps1 += p2 + p3;
      pa[n >> 1][(n & 1) * 2] = pack_bf16(p0, p1);
      pa[n >> 1][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
    }
    l0 = l0 * c0 + ps0;
    l1 = l1 * c1 + ps1;
#pragma unroll
    for (int n = 0; n < kVTiles; ++n) {
      o[n][0] *= c0;
      o[n][1] *= c0;
      o[n][2] *= c1;
      o[n][3] *= c1;
    }
    accumulate_pv(tile + v_off, pa, o);
    __syncthreads();  // the bf16 tile and the partial scores are free again
  }

#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const int dim0 = qq * kSliceV + 2 * gc;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = head0 + 8 * half;
    if (h >= nh) continue;
    const float m = half ? m1 : m0, l = half ? l1 : l0;
    if (ns == 1) {
      const float inv = 1.0f / l;
      float* og = o_lat + (static_cast<int64_t>(t) * nh + h) * kKr + dim0;
#pragma unroll
      for (int n = 0; n < kVTiles; ++n)
        *reinterpret_cast<float2*>(og + 8 * n) = make_float2(o[n][2 * half] * inv, o[n][2 * half + 1] * inv);
    } else {
      float* w = ws + ((static_cast<int64_t>(ti) * nh + h) * ns + sp) * (kKr + 2);
      if (qq == 0 && gc == 0) {
        w[0] = m * 0.69314718056f;  // back to natural-log units, as the merge expects
        w[1] = l;
      }
#pragma unroll
      for (int n = 0; n < kVTiles; ++n)
        *reinterpret_cast<float2*>(w + 2 + dim0 + 8 * n) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
    }
  }
}

struct Occupancy {
  int sms = 132, blocks_per_sm = 1;
  cudaError_t err = cudaSuccess;
};

// Raises the kernel's shared-memory limit and reads the resident blocks per SM, once per process and dtype.
template <CacheDType DT>
const Occupancy& occupancy() {
  static const Occupancy occ = [] {
    Occupancy r;
    int dev = 0;
    r.err = cudaGetDevice(&dev);
    if (r.err == cudaSuccess) r.err = cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, dev);
    if (r.err == cudaSuccess)
      r.err = cudaFuncSetAttribute(attend_tc_kernel<DT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(smem_bytes<DT>()));
    if (r.err == cudaSuccess)
      r.err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.blocks_per_sm, attend_tc_kernel<DT>, kThreads,
                                                             smem_bytes<DT>());
    r.blocks_per_sm = std::max(1, r.blocks_per_sm);
    return r;
  }();
  return occ;
}

const Occupancy& occupancy_of(CacheDType dtype) {
  switch (dtype) {
    case CacheDType::BF16: return occupancy<CacheDType::BF16>();
    case CacheDType::FP8_E4M3: return occupancy<CacheDType::FP8_E4M3>();
    default: return occupancy<CacheDType::F32>();
  }
}

template <CacheDType DT>
void launch(const MlaPaging& pg, int N, int nh, int ns, const float* q_lat, float scale, float* o_lat, float* ws,
            cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>((nh + kHeadsPerBlock - 1) / kHeadsPerBlock), static_cast<unsigned>(N),
                  static_cast<unsigned>(ns));
  (void)pdl::launch(attend_tc_kernel<DT>, grid, kThreads, smem_bytes<DT>(), s, pg, nh, q_lat, scale * 1.44269504089f, ns, o_lat, ws);
}

}  // namespace

bool supports(int kr, int dr) { return kr == kKr && kr + dr == kCd; }

int splits(int N, int nh, CacheDType dtype) {
  const Occupancy& occ = occupancy_of(dtype);
  const int64_t per = static_cast<int64_t>(N) * ((nh + kHeadsPerBlock - 1) / kHeadsPerBlock);
  return mla_detail::even_splits(per, occ.sms * occ.blocks_per_sm, occ.sms);
}

size_t workspace_floats(int N, int nh, int kr) {
  int ns = 1;
  for (CacheDType dt : {CacheDType::F32, CacheDType::BF16, CacheDType::FP8_E4M3}) ns = std::max(ns, splits(N, nh, dt));
  return ns == 1 ? 0 : static_cast<size_t>(N) * nh * ns * (kr + 2);
}

cudaError_t attend(const MlaPaging& pg, int N, int nh, const float* q_lat, float scale, float* o_lat, float* ws,
                   cudaStream_t s) {
  if (!supports(pg.kr, pg.dr)) return cudaErrorInvalidValue;
  const Occupancy& occ = occupancy_of(pg.dtype);
  if (occ.err != cudaSuccess) return occ.err;
  const int ns = ws ? splits(N, nh, pg.dtype) : 1;
  switch (pg.dtype) {
    case CacheDType::F32: launch<CacheDType::F32>(pg, N, nh, ns, q_lat, scale, o_lat, ws, s); break;
    case CacheDType::BF16: launch<CacheDType::BF16>(pg, N, nh, ns, q_lat, scale, o_lat, ws, s); break;
    case CacheDType::FP8_E4M3: launch<CacheDType::FP8_E4M3>(pg, N, nh, ns, q_lat, scale, o_lat, ws, s); break;
    default: return cudaErrorInvalidValue;
  }
  if (ns > 1) return mla_detail::merge_splits(pg, N, nh, kKr, ns, kMinSplitKeys, kKeys, ws, o_lat, s);
  return cudaGetLastError();
}

}  // namespace k3::cuda::mla_tc

namespace k3::cuda::mla_detail {

int even_splits(int64_t per, int slots, int max_splits) {
  // Time in units of one whole-range block: waves(ns) / ns.
  const double ideal = static_cast<double>(per) / slots;
  int best = 1;
  double best_t = 1e30;
  for (int ns = 1; ns <= max_splits && (ns == 1 || per * ns <= 4 * slots); ++ns) {
    const double tm = static_cast<double>((per * ns + slots - 1) / slots) / ns;
    if (tm <= ideal * 1.05) return ns;
    if (tm < best_t) {
      best_t = tm;
      best = ns;
    }
  }
  return best;
}

}  // namespace k3::cuda::mla_detail
