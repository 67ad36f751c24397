// MLA kernels (mla_kernels.h).
//
// mla_attend_latent: one block of 8 warps per (token, group of 8 heads, key split). The 8 queries
// (kr+dr floats each) sit in shared memory; tiles of 8 latent rows are staged in shared memory by all
// threads as fp32 (each stored row decoded by cache_dtype.cuh's loader, FP8 c_kv times the row's scale),
// so each row is read from memory once per 8 heads (the latent is shared by all heads, MQA-like).
// Warp w owns head 8g+w: per key a warp-wide dot product, an online softmax (max, sum) and an accumulator
// of kr values spread over the lanes (lane l holds dims l, l+32, ...: at most 16 for kr = 512). With several
// key splits each block writes (max, sum, acc) to the workspace and a merge kernel combines them in split
// order. Every (token, head) is computed on its own, so results do not depend on batching.
#include "k3/backend/cuda/mla_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/cache_dtype.cuh"
#include "k3/backend/cuda/mla_decode_tc.h"
#include "k3/backend/cuda/mla_decode_wgmma.h"
#include "k3/backend/cuda/mla_paging.cuh"
#include "k3/backend/cuda/pdl.cuh"  // each kernel first lets a pdl-launched successor begin (its weight prefetch)

namespace k3::cuda {
namespace {

constexpr int kMaxKrPerLane = 16;  // kr <= 512

__global__ void copy_qpe_kernel(const float* __restrict__ q, int nh, int dn, int dr, int kr, float* __restrict__ ql) {
  pdl::begin();
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < nh * dr; i += blockDim.x) {
    const int h = i / dr, j = i % dr;
    ql[(static_cast<int64_t>(t) * nh + h) * (kr + dr) + kr + j] = q[(static_cast<int64_t>(t) * nh + h) * (dn + dr) + dn + j];
  }
}

constexpr int kHeadsPerBlock = 8;
constexpr int kKeyTile = 8;

// Rows base .. base + nk - 1 of `rows_of` -> rows [nk][cd] fp32, four values per thread and step.
template <CacheDType DT>
__device__ __forceinline__ void stage_rows(const MlaSeqRows& rows_of, int base, int nk, int kr, int dr,
                                           float* __restrict__ rows) {
  const int cd = kr + dr, cd4 = cd / 4;
  for (int i = threadIdx.x; i < nk * cd4; i += blockDim.x) {
    const int r = i / cd4, c = 4 * (i % cd4);
    const uint8_t* row = rows_of.row(base + r);
    float4 v = mla_row_load4<DT>(row, kr, c);
    if (DT == CacheDType::FP8_E4M3 && c < kr) {
      const float sc = mla_row_ckv_scale<DT>(row, kr, dr);
      v.x *= sc;
      v.y *= sc;
      v.z *= sc;
      v.w *= sc;
    }
    *reinterpret_cast<float4*>(rows + r * cd + c) = v;
  }
}

template <CacheDType DT>
__global__ void __launch_bounds__(kHeadsPerBlock * 32)
    attend_split_kernel(MlaPaging pg, int nh, const float* __restrict__ q_lat, float scale, int nsplit,
                        float* __restrict__ o_lat, float* __restrict__ ws) {
  pdl::begin();
  extern __shared__ float sm[];
  const int kr = pg.kr, dr = pg.dr, cd = kr + dr;
  float* qs = sm;                              // [8][cd]
  float* rows = sm + kHeadsPerBlock * cd;      // [kKeyTile][cd]
  const int ti = blockIdx.x;
  const int t = pg.tok_index ? pg.tok_index[ti] : ti;
  const int h0 = blockIdx.y * kHeadsPerBlock, sp = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int h = h0 + warp;
  for (int i = threadIdx.x; i < kHeadsPerBlock * cd; i += blockDim.x) {
    const int hh = h0 + i / cd;
    qs[i] = hh < nh ? q_lat[(static_cast<int64_t>(t) * nh + hh) * cd + i % cd] : 0.f;
  }
  const int seq = pg.tok_seq[t], len = pg.tok_pos[t] + 1;
  const MlaSeqRows rows_of = mla_seq_rows(pg, seq);
  const int chunk = (len + nsplit - 1) / nsplit;
  const int k0 = sp * chunk, k1 = min(len, k0 + chunk);
  float m = -INFINITY, l = 0.f;
  float acc[kMaxKrPerLane];
#pragma unroll
  for (int i = 0; i < kMaxKrPerLane; ++i) acc[i] = 0.f;
  const float* q = qs + warp * cd;
  for (int base = k0; base < k1; base += kKeyTile) {
    const int nk = min(kKeyTile, k1 - base);
    __syncthreads();  // the previous tile (and, the first time, qs) is complete / no longer read
    stage_rows<DT>(rows_of, base, nk, kr, dr, rows);
    __syncthreads();
    if (h < nh) {
      for (int j = 0; j < nk; ++j) {
        const float* row = rows + j * cd;
        float d = 0.f;
        for (int i = lane; i < cd; i += 32) d = fmaf(q[i], row[i], d);
        for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        const float score = d * scale;
        const float m_new = fmaxf(m, score);
        const float corr = __expf(m - m_new);  // m = -inf the first time: 0
        const float p = __expf(score - m_new);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < kMaxKrPerLane; ++i) {
          const int jj = lane + 32 * i;
          if (jj < kr) acc[i] = acc[i] * corr + p * row[jj];
        }
        m = m_new;
      }
    }
  }
  if (h >= nh) return;
  if (nsplit == 1) {
    const float inv = 1.0f / l;
    float* og = o_lat + (static_cast<int64_t>(t) * nh + h) * kr;
#pragma unroll
    for (int i = 0; i < kMaxKrPerLane; ++i) {
      const int jj = lane + 32 * i;
      if (jj < kr) og[jj] = acc[i] * inv;
    }
    return;
  }
  float* w = ws + ((static_cast<int64_t>(ti) * nh + h) * nsplit + sp) * (kr + 2);
  if (lane == 0) {
    w[0] = m;
    w[1] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxKrPerLane; ++i) {
    const int jj = lane + 32 * i;
    if (jj < kr) w[2 + jj] = acc[i];
  }
}

// Merges the splits' (max, sum, acc) of one (token, head) and kMergeDims of its latent dims per block, one
// dim per thread. The split weights exp(m_s - max) are computed once per block into shared memory (block-wide
// max and sum trees, a fixed order for a given split count), then each thread sums its dim over the splits
// with independent loads in flight. (The first form, a block per (token, head) looping dims x splits -- 32
// blocks at batch 1, each thread 64 splits x 4 dims of loads -- left the batch-1 attention at 68 us for 8k
// keys on the H200; with this one it takes 25 us, CudaMlaDecodeTiming, session 15.) Only the splits that hold keys are read (mla_detail::split_chunk;
// the SIMT kernel's min_keys = gran = 1 keeps its old cut).
constexpr int kMergeDims = 128;
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = is_max ? fmaxf(v, o) : v + o;
  }
  const int warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // red is reused between the two reductions
  if ((threadIdx.x & 31) == 0) red[warp] = v;
  __syncthreads();
  v = red[0];
  for (int w = 1; w < nw; ++w) v = is_max ? fmaxf(v, red[w]) : v + red[w];
  return v;
}

__global__ void __launch_bounds__(kMergeDims) attend_merge_kernel(const MlaPaging pg, int nh, int kr, int nsplit,
                                                                   int min_keys, int gran, const float* __restrict__ ws,
                                                                   float* __restrict__ o_lat) {
  pdl::begin();
  extern __shared__ float wt[];  // [nsplit] split weights
  __shared__ float red[kMergeDims / 32];
  const int ti = blockIdx.x / nh, h = blockIdx.x % nh;
  const int t = pg.tok_index ? pg.tok_index[ti] : ti;
  const int len = pg.tok_pos[t] + 1;
  const int chunk = mla_detail::split_chunk(len, nsplit, min_keys, gran);
  const int used = min(nsplit, (len + chunk - 1) / chunk);
  const int64_t stride = kr + 2;
  const float* w = ws + (static_cast<int64_t>(ti) * nh + h) * nsplit * stride;
  float mx = -INFINITY;
  for (int s = threadIdx.x; s < used; s += blockDim.x) mx = fmaxf(mx, w[s * stride]);
  const float gm = block_reduce(mx, true, red);
  float sum = 0.f;
  for (int s = threadIdx.x; s < used; s += blockDim.x) {
    const float ms = w[s * stride];
    const float e = ms == -INFINITY ? 0.f : __expf(ms - gm);
    wt[s] = e;
    sum += w[s * stride + 1] * e;
  }
  const float inv = 1.0f / block_reduce(sum, false, red);  // its barriers also publish wt
  const int j = blockIdx.y * kMergeDims + threadIdx.x;
  if (j >= kr) return;
  float o = 0.f;
#pragma unroll 8
  for (int s = 0; s < used; ++s) o += w[s * stride + 2 + j] * wt[s];
  o_lat[(static_cast<int64_t>(t) * nh + h) * kr + j] = o * inv;
}

// q absorption for up to 8 tokens per block, and the copy of q's rope part beside it (blocks of column group 0; at
// batch 1 a launch of its own cost ~5.7 us a layer, ncu call s42-1). Block (head, 32 output columns, token group): 8 row groups
// of 32 threads each sum dn/8 rows (coalesced 128-byte loads of kv_b), then reduce through shared memory;
// enough blocks to keep many loads in flight (a block per head alone was latency-bound).
constexpr int kAbsorbTok = 8;
__global__ void __launch_bounds__(256) absorb_q_kernel(const float* __restrict__ q, const float* __restrict__ kvb, int N,
                                                       int nh, int dn, int dr, int dv, int kr, float* __restrict__ ql) {
  pdl::begin();
  extern __shared__ float qsm[];  // [kAbsorbTok][dn]
  __shared__ float red[8][kAbsorbTok][32];
  const int h = blockIdx.x, j0 = blockIdx.y * 32, t0 = blockIdx.z * kAbsorbTok;
  const int nt = min(kAbsorbTok, N - t0);
  if (blockIdx.y == 0)  // the rope part, copied as it is (q_lat[t][h][kr:]): what copy_qpe_kernel did in its own launch
    for (int i = threadIdx.x; i < nt * dr; i += blockDim.x) {
      const int64_t th = static_cast<int64_t>(t0 + i / dr) * nh + h;
      ql[th * (kr + dr) + kr + i % dr] = q[th * (dn + dr) + dn + i % dr];
    }
  for (int i = threadIdx.x; i < nt * dn; i += blockDim.x)
    qsm[i] = q[(static_cast<int64_t>(t0 + i / dn) * nh + h) * (dn + dr) + i % dn];
  __syncthreads();
  const int jj = threadIdx.x & 31, g = threadIdx.x >> 5, j = j0 + jj;
  float acc[kAbsorbTok];
#pragma unroll
  for (int t = 0; t < kAbsorbTok; ++t) acc[t] = 0.f;
  if (j < kr) {
    const float* w = kvb + static_cast<int64_t>(h) * (dn + dv) * kr + j;
#pragma unroll 4
    for (int i = g; i < dn; i += 8) {
      const float wv = w[static_cast<int64_t>(i) * kr];
#pragma unroll
      for (int t = 0; t < kAbsorbTok; ++t) acc[t] = fmaf(qsm[min(t, nt - 1) * dn + i], wv, acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < kAbsorbTok; ++t) red[g][t][jj] = acc[t];
  __syncthreads();
  if (g == 0 && j < kr)
    for (int t = 0; t < nt; ++t) {
      float sum = 0.f;
      for (int gg = 0; gg < 8; ++gg) sum += red[gg][t][jj];
      ql[(static_cast<int64_t>(t0 + t) * nh + h) * (kr + dr) + j] = sum;
    }
}

// v up-projection for up to 8 tokens per block: warp per output value, lanes over kr.
__global__ void up_v_kernel(const float* __restrict__ ol, const float* __restrict__ kvb, int N, int nh, int dn, int dv,
                            int kr, float* __restrict__ o) {
  pdl::begin();
  extern __shared__ float osm[];  // [kAbsorbTok][kr]
  const int h = blockIdx.x, t0 = blockIdx.z * kAbsorbTok;
  const int nt = min(kAbsorbTok, N - t0);
  for (int i = threadIdx.x; i < nt * kr; i += blockDim.x) osm[i] = ol[(static_cast<int64_t>(t0 + i / kr) * nh + h) * kr + i % kr];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  // Block (head, 8 output values, token group): one warp per output value.
  for (int i = blockIdx.y * nw + warp; i < min(dv, (blockIdx.y + 1) * nw); i += nw) {
    const float* w = kvb + (static_cast<int64_t>(h) * (dn + dv) + dn + i) * kr;
    float acc[kAbsorbTok];
#pragma unroll
    for (int t = 0; t < kAbsorbTok; ++t) acc[t] = 0.f;
    for (int j = lane; j < kr; j += 32) {
      const float wv = w[j];
#pragma unroll
      for (int t = 0; t < kAbsorbTok; ++t) acc[t] = fmaf(wv, osm[min(t, nt - 1) * kr + j], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < kAbsorbTok; ++t) {
      float v = acc[t];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && t < nt) o[(static_cast<int64_t>(t0 + t) * nh + h) * dv + i] = v;
    }
  }
}

// One block per (head, query) row.
__global__ void causal_softmax_kernel(float* __restrict__ scores, int Tq, int S, int first_pos) {
  pdl::begin();
  __shared__ float red[32];
  float* row = scores + static_cast<int64_t>(blockIdx.x) * S;
  const int t = blockIdx.x % Tq;
  const int valid = min(S, first_pos + t + 1);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float m = -INFINITY;
  for (int s = threadIdx.x; s < valid; s += blockDim.x) m = fmaxf(m, row[s]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < nw; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float sum = 0.f;
  for (int s = threadIdx.x; s < valid; s += blockDim.x) {
    const float e = __expf(row[s] - m);
    row[s] = e;
    sum += e;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0.f;
  for (int w = 0; w < nw; ++w) sum += red[w];
  const float inv = 1.0f / sum;
  for (int s = threadIdx.x; s < S; s += blockDim.x) row[s] = s < valid ? row[s] * inv : 0.f;
}

}  // namespace

cudaError_t mla_causal_softmax(float* scores, int nh, int Tq, int S, int first_pos, cudaStream_t s) {
  if (nh <= 0 || Tq <= 0 || S <= 0) return cudaSuccess;
  (void)pdl::launch(causal_softmax_kernel, static_cast<unsigned>(nh) * Tq, 256, 0, s, scores, Tq, S, first_pos);
  return cudaGetLastError();
}

cudaError_t mla_copy_qpe(const float* q, int N, int nh, int dn, int dr, int kr, float* q_lat, cudaStream_t s) {
  if (N <= 0 || dr == 0) return cudaSuccess;
  (void)pdl::launch(copy_qpe_kernel, N, 128, 0, s, q, nh, dn, dr, kr, q_lat);
  return cudaGetLastError();
}

namespace mla_detail {
cudaError_t merge_splits(const MlaPaging& pg, int N, int nh, int kr, int ns, int min_keys, int gran, const float* ws,
                         float* o_lat, cudaStream_t s) {
  const dim3 grid(static_cast<unsigned>(N) * nh, static_cast<unsigned>((kr + kMergeDims - 1) / kMergeDims));
  (void)pdl::launch(attend_merge_kernel, grid, kMergeDims, sizeof(float) * ns, s, pg, nh, kr, ns, min_keys, gran, ws, o_lat);
  return cudaGetLastError();
}
}  // namespace mla_detail

namespace {
// K3_MLA_DECODE=simt|tc|wgmma forces a kernel where the shape allows it (A/B timing, tolerance checks).
// Read per call (a getenv per layer is negligible next to a launch), so a test can switch in one process.
enum class Forced { Auto, Simt, Tc, Wgmma };
Forced forced_kernel() {
  const char* e = std::getenv("K3_MLA_DECODE");
  if (e && std::strcmp(e, "simt") == 0) return Forced::Simt;
  if (e && std::strcmp(e, "tc") == 0) return Forced::Tc;
  if (e && std::strcmp(e, "wgmma") == 0) return Forced::Wgmma;
  return Forced::Auto;
}
}  // namespace

MlaDecodeKernel mla_attend_kernel(int N, int nh, int kr, int dr, CacheDType dtype) {
  const bool tc_ok = mla_tc::supports(kr, dr), wg_ok = mla_wg::supports(kr, dr, dtype);
  switch (forced_kernel()) {
    case Forced::Simt: return MlaDecodeKernel::Simt;
    case Forced::Tc: return tc_ok ? MlaDecodeKernel::MmaSync : MlaDecodeKernel::Simt;
    case Forced::Wgmma: return wg_ok ? MlaDecodeKernel::Wgmma : tc_ok ? MlaDecodeKernel::MmaSync : MlaDecodeKernel::Simt;
    default: break;
  }
  if (wg_ok && mla_wgmma_preferred(nh)) return MlaDecodeKernel::Wgmma;
  if (tc_ok && nh >= kMlaTensorCoreMinHeads) return MlaDecodeKernel::MmaSync;
  return MlaDecodeKernel::Simt;
}

bool mla_wgmma_preferred(int nh) {
  // Measured on the H200 against the mma.sync kernel over BF16 rows (docs/perf/cuda.md, session 50, the seesaw
  // wgmma kernel): at 96 heads 0.98x at one token and 1k keys, 1.09x at 8k, 1.28x at 32k, 1.62x at 128k, 1.39-2.53x
  // from 8 tokens; at 32 heads 0.98-1.22x (0.98-0.99x in two of 14 shapes). Below 32 heads (3/4 of a 64-head
  // block empty): not measured.
  return nh >= 32;
}

bool mla_attend_uses_tensor_cores(int nh, int kr, int dr) {
  return mla_attend_kernel(1, nh, kr, dr, CacheDType::F32) != MlaDecodeKernel::Simt;
}

int mla_attend_splits(int N, int nh) {
  // Enough blocks for ~2 waves on 132 SMs; at most 32 splits.
  const int blocks = N * ((nh + kHeadsPerBlock - 1) / kHeadsPerBlock);
  return std::max(1, std::min(32, 264 / std::max(blocks, 1)));
}

size_t mla_attend_workspace_floats(int N, int nh, int kr) {
  const int ns = mla_attend_splits(N, nh);
  const size_t simt = ns == 1 ? 0 : static_cast<size_t>(N) * nh * ns * (kr + 2);
  // Either path may run (K3_MLA_DECODE), so the workspace fits both (the tensor-core one for every dtype).
  if (kr != mla_tc::kKr) return simt;
  return std::max({simt, mla_tc::workspace_floats(N, nh, kr), mla_wg::workspace_floats(N, nh, kr)});
}

size_t mla_attend_workspace_floats_max(int max_n, int nh, int kr) {
  size_t m = 0;
  for (int n = 1; n <= max_n; ++n) m = std::max(m, mla_attend_workspace_floats(n, nh, kr));
  return m;
}

cudaError_t mla_attend_latent(const MlaPaging& pg, int N, int nh, const float* q_lat, float scale, float* o_lat,
                              float* ws, cudaStream_t s) {
  const int kr = pg.kr, dr = pg.dr;
  if (!mla_paging_shape_ok(pg) || kr > 32 * kMaxKrPerLane || nh <= 0 || N < 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  switch (mla_attend_kernel(N, nh, kr, dr, pg.dtype)) {
    case MlaDecodeKernel::Wgmma: return mla_wg::attend(pg, N, nh, q_lat, scale, o_lat, ws, s);
    case MlaDecodeKernel::MmaSync: return mla_tc::attend(pg, N, nh, q_lat, scale, o_lat, ws, s);
    case MlaDecodeKernel::Simt: break;
  }
  const int ns = ws ? mla_attend_splits(N, nh) : 1;
  const size_t smem = static_cast<size_t>((kHeadsPerBlock + kKeyTile) * (kr + dr)) * sizeof(float);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>((nh + kHeadsPerBlock - 1) / kHeadsPerBlock),
                  static_cast<unsigned>(ns));
  const unsigned threads = kHeadsPerBlock * 32;
  switch (pg.dtype) {
    case CacheDType::F32:
      (void)pdl::launch(attend_split_kernel<CacheDType::F32>, grid, threads, smem, s, pg, nh, q_lat, scale, ns, o_lat, ws);
      break;
    case CacheDType::BF16:
      (void)pdl::launch(attend_split_kernel<CacheDType::BF16>, grid, threads, smem, s, pg, nh, q_lat, scale, ns, o_lat, ws);
      break;
    case CacheDType::FP8_E4M3:
      (void)pdl::launch(attend_split_kernel<CacheDType::FP8_E4M3>, grid, threads, smem, s, pg, nh, q_lat, scale, ns, o_lat, ws);
      break;
  }
  if (ns > 1) return mla_detail::merge_splits(pg, N, nh, kr, ns, 1, 1, ws, o_lat, s);
  return cudaGetLastError();
}

cudaError_t mla_absorb_q(const float* q, const float* kv_b, int N, int nh, int dn, int dr, int dv, int kr, float* q_lat,
                         cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(kAbsorbTok) * dn * sizeof(float);
  if (smem + sizeof(float) * 8 * kAbsorbTok * 32 > 48 * 1024) return cudaErrorInvalidValue;
  (void)pdl::launch(absorb_q_kernel, dim3(nh, (kr + 31) / 32, (N + kAbsorbTok - 1) / kAbsorbTok), 256, smem, s, q, kv_b, N, nh, dn, dr, dv,
                                                                                                 kr, q_lat);
  return cudaGetLastError();
}

cudaError_t mla_up_v(const float* o_lat, const float* kv_b, int N, int nh, int dn, int dv, int kr, float* o, cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(kAbsorbTok) * kr * sizeof(float);
  if (smem > 48 * 1024) return cudaErrorInvalidValue;
  (void)pdl::launch(up_v_kernel, dim3(nh, (dv + 7) / 8, (N + kAbsorbTok - 1) / kAbsorbTok), 256, smem, s, o_lat, kv_b, N, nh, dn, dv, kr, o);
  return cudaGetLastError();
}

}  // namespace k3::cuda
