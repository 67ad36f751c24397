// Absorbed MLA decode attention on warpgroup MMAs (wgmma, sm_90a) for BF16 latent rows (mla_decode_wgmma.h).
//
// Why a second tensor-core kernel: the mma.sync kernel (mla_decode_tc.cu) is bound by the shared-memory
// pipe at 96 heads (docs/perf/cuda.md, session 6: fp32 staging, bf16 store, K/V fragments by ldmatrix per
// 32-head warp, a partial-score exchange). Here, as in FlashMLA, one warpgroup computes whole rows of S for
// 64 heads with the tensor cores reading Q and K straight from shared memory, and bf16 rows are copied to
// shared memory as stored (cp.async, no staging pass, no conversion).
//
// Block = (64 heads of one token, one key split), 2 warpgroups (256 threads), one block per SM (225 KB of
// shared memory): Q [64 x 576] bf16 and two stages of K/V tiles [64 keys x 576] bf16, all in the 128-byte
// swizzled K-major layout (9 column blocks of 64 values; row r of a block at 128 r, its 16-byte chunk c at
// (c ^ (r & 7)) * 16), and P [64 x 64] bf16 in the same layout. Per tile of 64 keys:
//   warpgroup 0: S [64 x 64] = Q K^T (36 wgmma m64n64k16, both operands from shared memory), online
//     softmax in base 2 (fp32), P to registers (the accumulator layout is the A-fragment layout) and to
//     shared memory, the row correction factors to shared memory;
//   both: O [64 x 256 dims of their half] = O * correction + P V (4 wgmma m64n256k16; V is the same tile
//     read N-major: the first 512 values of each row), warpgroup 0 with P from registers.
// Tile t + 1 is in flight (cp.async) while tile t is multiplied. Key splits (flash-decoding) and their
// merge as in the other kernels (mla_detail::split_chunk / merge_splits, granularity 64 keys). nh that is
// not a multiple of 64: the last block's missing heads are zero rows of Q, never written.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/mla_decode_tc.h"
#include "k3/backend/cuda/mla_decode_wgmma.h"
#include "k3/backend/cuda/mla_paging.cuh"
#include "k3/backend/cuda/sm90a/mla_wg_common.cuh"
#include "k3/backend/cuda/sm90a/wgmma.cuh"

namespace k3::cuda::mla_wg {
namespace {

using namespace detail;
constexpr int kThreads = 256;
constexpr int kChunksPerThread = 64 * kChunks / kThreads;  // 18
constexpr size_t kSmemBytes = 1024 /* alignment slack */ + 3 * kTileBytes + kBlockBytes /* P */ + 3 * 64 * sizeof(float);
// The kernel attend() runs unless K3_MLA_WG says otherwise: this file's (1) until the seesaw kernel (2) has been
// measured on a GPU (written in session 50, whose device calls were all refused).
constexpr int kDefaultKernel = 1;

// Keys base .. base + 63 (rows past `end` become zeros: masked scores, zero values) into the stage at
// `dst`, as stored (bf16): thread t copies chunks t + 256 u, coalesced along each 1152-byte row. Lane l
// resolves the rows of keys base + l and base + 32 + l; the copies fetch theirs by shuffle.
__device__ __forceinline__ void issue_tile(uint32_t dst, const MlaSeqRows& rows_of, int base, int end) {
  const int lane = threadIdx.x & 31;
  const unsigned long long r0 = base + lane < end ? reinterpret_cast<unsigned long long>(rows_of.row(base + lane)) : 0ull;
  const unsigned long long r1 =
      base + 32 + lane < end ? reinterpret_cast<unsigned long long>(rows_of.row(base + 32 + lane)) : 0ull;
#pragma unroll
  for (int u = 0; u < kChunksPerThread; ++u) {
    const int j = threadIdx.x + kThreads * u;
    const int r = j / kChunks, c = j % kChunks;
    const unsigned long long a = __shfl_sync(0xffffffffu, r0, r & 31), b = __shfl_sync(0xffffffffu, r1, r & 31);
    const auto* src = reinterpret_cast<const uint8_t*>(r < 32 ? a : b);
    if (src)
      cp_async16(dst + swz(r, c), src + 16 * c);
    else
      st_shared16(dst + swz(r, c), make_uint4(0, 0, 0, 0));
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    attend_wg_kernel(MlaPaging pg, int nh, const float* __restrict__ q_lat, float scale_log2, int ns,
                     float* __restrict__ o_lat, float* __restrict__ ws) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t base_addr = (raw + 1023u) & ~1023u;  // swizzle atoms start 1024-byte aligned
  const uint32_t sQ = base_addr, sKV = base_addr + kTileBytes, sP = base_addr + 3 * kTileBytes;
  float* const s_corr = reinterpret_cast<float*>(smem_raw + (base_addr - raw) + 3 * kTileBytes + kBlockBytes);  // [64]
  float* const s_m = s_corr + 64;  // [64] final row max (base 2)
  float* const s_l = s_m + 64;     // [64] final row sum

  const int ti = blockIdx.y, sp = blockIdx.z;
  const int t = pg.tok_index ? pg.tok_index[ti] : ti;
  const int seq = pg.tok_seq[t], len = pg.tok_pos[t] + 1;
  const MlaSeqRows rows_of = mla_seq_rows(pg, seq);
  const int chunk = mla_detail::split_chunk(len, ns, kMinSplitKeys, kKeys);
  const int k0 = sp * chunk;
  if (k0 >= len) return;  // an unused split: the merge does not read it
  const int k1 = min(len, k0 + chunk);
  const int h0 = blockIdx.x * kHeadsPerBlock;
  // Warp-uniform by construction (a shuffle from lane 0), so that ptxas sees the warpgroup branches below
  // as uniform and does not serialise their wgmmas.
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x >> 7), 0), lane = threadIdx.x & 31;
  const int gr = lane >> 2, gc = lane & 3;
  const int row0 = ((threadIdx.x & 127) >> 5) * 16 + gr;  // the thread's accumulator rows: row0, row0 + 8

  // Two tiles in flight from the start; one cp.async group per tile (empty past the end).
  issue_tile(sKV, rows_of, k0, k1);
  cp_async_commit();
  if (k0 + kKeys < k1) issue_tile(sKV + kTileBytes, rows_of, k0 + kKeys, k1);
  cp_async_commit();
  load_q(sQ, q_lat, t, nh, h0);

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // warpgroup 0's running max / sum

  int it = 0;
  for (int kb = k0; kb < k1; kb += kKeys, ++it) {
    const uint32_t kv = sKV + (it & 1) * kTileBytes;
    cp_async_wait<1>();            // this thread's copies of tile `it` have landed
    wgmma::fence_proxy_async();    // ... and are visible to the tensor cores, as are Q and the zero rows
    __syncthreads();
    uint32_t pa[kPvSteps][4];      // warpgroup 0: P as A fragments of the k16 steps of P V
    if (wg == 0) {
      float s[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) s[i] = 0.f;
      wgmma::fence_regs(s);
      wgmma::fence();
#pragma unroll
      for (int st = 0; st < kSteps; ++st) {
        const uint32_t off = (st >> 2) * kBlockBytes + (st & 3) * 32;  // k16 step inside a 128-byte swizzle row
        wgmma::mma_m64n64k16_ss(s, wgmma::make_desc(sQ + off, 16, kSbo), wgmma::make_desc(kv + off, 16, kSbo), st > 0);
      }
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_regs(s);
      // s[4j + e]: row row0 (e < 2) or row0 + 8, key kb + 8 j + 2 gc + (e & 1).
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
      const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);  // finite: every tile has a key < k1
      const float c0 = exp2f(m0 - mn0), c1 = exp2f(m1 - mn1);  // 0 on the first tile
      m0 = mn0;
      m1 = mn1;
      float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p0 = exp2f(s[4 * j] - mn0), p1 = exp2f(s[4 * j + 1] - mn0);
        const float p2 = exp2f(s[4 * j + 2] - mn1), p3 = exp2f(s[4 * j + 3] - mn1);
        ps0 += p0 + p1;
        ps1 += p2 + p3;
        const uint32_t lo = pack_bf16(p0, p1), hi = pack_bf16(p2, p3);
        pa[j >> 1][(j & 1) * 2] = lo;
        pa[j >> 1][(j & 1) * 2 + 1] = hi;
        // P [row][key] for warpgroup 1: chunk j of rows row0 and row0 + 8, 4 bytes at 4 gc.
        st_shared4(sP + row0 * 128 + ((j ^ (row0 & 7)) << 4) + 4 * gc, lo);
        st_shared4(sP + (row0 + 8) * 128 + ((j ^ ((row0 + 8) & 7)) << 4) + 4 * gc, hi);
      }
      l0 = l0 * c0 + ps0;
      l1 = l1 * c1 + ps1;
      if (gc == 0) {
        s_corr[row0] = c0;
        s_corr[row0 + 8] = c1;
      }
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[4 * n] *= c0;
        o[4 * n + 1] *= c0;
        o[4 * n + 2] *= c1;
        o[4 * n + 3] *= c1;
      }
      wgmma::fence_proxy_async();  // P's generic stores -> warpgroup 1's wgmma
    }
    __syncthreads();  // P and the correction factors are ready
    if (wg == 1) {
      const float c0 = s_corr[row0], c1 = s_corr[row0 + 8];
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        o[4 * n] *= c0;
        o[4 * n + 1] *= c0;
        o[4 * n + 2] *= c1;
        o[4 * n + 3] *= c1;
      }
    }
    wgmma::fence_regs(o);
    wgmma::fence();
    const uint32_t v_half = kv + wg * (kKr / 2 / 64) * kBlockBytes;  // dims 256 wg .. 256 wg + 255
    // V descriptor of keys 16 kk .. 16 kk + 15: two 8-key groups further per step.
    if (wg == 0) {
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk)
        wgmma::mma_m64n256k16_rs_tb(o, pa[kk], wgmma::make_desc(v_half + kk * 2 * kSbo, kVLbo, kSbo));
    } else {
#pragma unroll
      for (int kk = 0; kk < kPvSteps; ++kk)
        wgmma::mma_m64n256k16_ss_tb(o, wgmma::make_desc(sP + kk * 32, 16, kSbo),
                                    wgmma::make_desc(v_half + kk * 2 * kSbo, kVLbo, kSbo), 1);
    }
    wgmma::commit();
    wgmma::wait<0>();
    wgmma::fence_regs(o);
    __syncthreads();  // this stage and P are free again
    if (kb + 2 * kKeys < k1) issue_tile(kv, rows_of, kb + 2 * kKeys, k1);
    cp_async_commit();
  }

  if (wg == 0) {
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      l0 += __shfl_xor_sync(0xffffffffu, l0, off);
      l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    if (gc == 0) {
      s_m[row0] = m0;
      s_m[row0 + 8] = m1;
      s_l[row0] = l0;
      s_l[row0 + 8] = l1;
    }
  }
  __syncthreads();
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
      r.err = cudaFuncSetAttribute(attend_wg_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
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
  const float scale_log2 = scale * 1.44269504089f;
  // K3_MLA_WG=1: this file's kernel (serial phases, one warpgroup computing S), 2: the seesaw kernel; unset:
  // kDefaultKernel. Read per call (A/B timing and tests in one process).
  const char* v = std::getenv("K3_MLA_WG");
  const int which = v && std::strcmp(v, "1") == 0 ? 1 : v && std::strcmp(v, "2") == 0 ? 2 : kDefaultKernel;
  if (which == 1) {
    attend_wg_kernel<<<grid, kThreads, kSmemBytes, s>>>(pg, nh, q_lat, scale_log2, ns, o_lat, ws);
  } else {
    const cudaError_t e = detail::attend_seesaw(pg, N, nh, q_lat, scale_log2, ns, o_lat, ws, s);
    if (e != cudaSuccess) return e;
  }
  if (ns > 1) return mla_detail::merge_splits(pg, N, nh, kKr, ns, kMinSplitKeys, kKeys, ws, o_lat, s);
  return cudaGetLastError();
}

}  // namespace k3::cuda::mla_wg
