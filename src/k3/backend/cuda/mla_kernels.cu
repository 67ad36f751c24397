// MLA kernels (mla_kernels.h).
//
// mla_attend_latent: one block of 4 warps per (token, head). The query (kr+dr floats) sits in shared
// memory; warp w takes keys w, w+4, ...; a key's score is a warp-wide dot product over the row; each
// warp keeps an online softmax (max, sum) and an accumulator of kr values spread over its lanes
// (lane l holds dims l, l+32, ...: at most 16 per lane for kr = 512); the four partial results are
// merged at the end. Every (token, head) is computed on its own, so results do not depend on batching.
// The latent row is shared by all heads (MQA-like); the heads of one token re-read it from L2.
#include "k3/backend/cuda/mla_kernels.h"

namespace k3::cuda {
namespace {

constexpr int kAttnWarps = 4;
constexpr int kMaxKrPerLane = 16;  // kr <= 512

__device__ __forceinline__ const float* row_ptr(const MlaPaging& pg, int seq, int pos) {
  const int pt = pg.page_tokens[seq];
  return pg.pages[pg.page_start[seq] + pos / pt] + static_cast<int64_t>(pos % pt) * pg.row_dim;
}

__global__ void write_rows_kernel(MlaPaging pg, const float* __restrict__ lat) {
  const int t = blockIdx.x;
  float* dst = const_cast<float*>(row_ptr(pg, pg.tok_seq[t], pg.tok_pos[t]));
  for (int i = threadIdx.x; i < pg.row_dim; i += blockDim.x) dst[i] = lat[static_cast<int64_t>(t) * pg.row_dim + i];
}

__global__ void copy_qpe_kernel(const float* __restrict__ q, int nh, int dn, int dr, int kr, float* __restrict__ ql) {
  const int t = blockIdx.x;
  for (int i = threadIdx.x; i < nh * dr; i += blockDim.x) {
    const int h = i / dr, j = i % dr;
    ql[(static_cast<int64_t>(t) * nh + h) * (kr + dr) + kr + j] = q[(static_cast<int64_t>(t) * nh + h) * (dn + dr) + dn + j];
  }
}

__global__ void __launch_bounds__(kAttnWarps * 32)
    attend_kernel(MlaPaging pg, int nh, int kr, int dr, const float* __restrict__ q_lat, float scale,
                  float* __restrict__ o_lat) {
  extern __shared__ float sm[];  // q: cd floats; then the merge area
  const int t = pg.tok_index ? pg.tok_index[blockIdx.x / nh] : static_cast<int>(blockIdx.x / nh);
  const int h = blockIdx.x % nh;
  const int cd = kr + dr;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* qs = sm;
  const float* qg = q_lat + (static_cast<int64_t>(t) * nh + h) * cd;
  for (int i = threadIdx.x; i < cd; i += blockDim.x) qs[i] = qg[i];
  __syncthreads();

  const int seq = pg.tok_seq[t], last = pg.tok_pos[t];
  float m = -INFINITY, l = 0.f;
  float acc[kMaxKrPerLane];
#pragma unroll
  for (int i = 0; i < kMaxKrPerLane; ++i) acc[i] = 0.f;
  for (int s = warp; s <= last; s += kAttnWarps) {
    const float* row = row_ptr(pg, seq, s);
    float d = 0.f;
    for (int i = lane; i < cd; i += 32) d = fmaf(qs[i], row[i], d);
    for (int o = 16; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
    const float score = d * scale;
    const float m_new = fmaxf(m, score);
    const float corr = __expf(m - m_new);  // m = -inf the first time: exp(-inf) = 0
    const float p = __expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxKrPerLane; ++i) {
      const int j = lane + 32 * i;
      if (j < kr) acc[i] = acc[i] * corr + p * row[j];
    }
    m = m_new;
  }
  // Merge the warps: sm after q holds per-warp (m, l) and accumulators [kAttnWarps][kr].
  float* wm = sm + cd;
  float* wl = wm + kAttnWarps;
  float* wacc = wl + kAttnWarps;
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxKrPerLane; ++i) {
    const int j = lane + 32 * i;
    if (j < kr) wacc[warp * kr + j] = acc[i];
  }
  __syncthreads();
  float gm = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) gm = fmaxf(gm, wm[w]);
  float scalew[kAttnWarps], gl = 0.f;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) {
    scalew[w] = wm[w] == -INFINITY ? 0.f : __expf(wm[w] - gm);  // a warp with no keys contributes nothing
    gl += wl[w] * scalew[w];
  }
  const float inv = 1.0f / gl;
  float* og = o_lat + (static_cast<int64_t>(t) * nh + h) * kr;
  for (int j = threadIdx.x; j < kr; j += blockDim.x) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += wacc[w * kr + j] * scalew[w];
    og[j] = o * inv;
  }
}

__global__ void gather_latents_kernel(MlaPaging pg, int seq, float* __restrict__ out) {
  const int s = blockIdx.x;
  const float* src = row_ptr(pg, seq, s);
  for (int i = threadIdx.x; i < pg.row_dim; i += blockDim.x) out[static_cast<int64_t>(s) * pg.row_dim + i] = src[i];
}

// One block per (head, query) row.
__global__ void causal_softmax_kernel(float* __restrict__ scores, int Tq, int S, int first_pos) {
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

cudaError_t mla_gather_latents(const MlaPaging& pg, int seq, int S, float* out, cudaStream_t s) {
  if (S <= 0) return cudaSuccess;
  gather_latents_kernel<<<S, 128, 0, s>>>(pg, seq, out);
  return cudaGetLastError();
}

cudaError_t mla_causal_softmax(float* scores, int nh, int Tq, int S, int first_pos, cudaStream_t s) {
  if (nh <= 0 || Tq <= 0 || S <= 0) return cudaSuccess;
  causal_softmax_kernel<<<static_cast<unsigned>(nh) * Tq, 256, 0, s>>>(scores, Tq, S, first_pos);
  return cudaGetLastError();
}

cudaError_t mla_write_rows(const MlaPaging& pg, int N, const float* lat, cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  write_rows_kernel<<<N, 128, 0, s>>>(pg, lat);
  return cudaGetLastError();
}

cudaError_t mla_copy_qpe(const float* q, int N, int nh, int dn, int dr, int kr, float* q_lat, cudaStream_t s) {
  if (N <= 0 || dr == 0) return cudaSuccess;
  copy_qpe_kernel<<<N, 128, 0, s>>>(q, nh, dn, dr, kr, q_lat);
  return cudaGetLastError();
}

cudaError_t mla_attend_latent(const MlaPaging& pg, int N, int nh, int kr, int dr, const float* q_lat, float scale,
                              float* o_lat, cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  if (kr > 32 * kMaxKrPerLane || kr <= 0 || nh <= 0) return cudaErrorInvalidValue;
  const size_t smem = static_cast<size_t>(kr + dr + 2 * kAttnWarps + kAttnWarps * kr) * sizeof(float);
  attend_kernel<<<static_cast<unsigned>(N) * nh, kAttnWarps * 32, smem, s>>>(pg, nh, kr, dr, q_lat, scale, o_lat);
  return cudaGetLastError();
}

}  // namespace k3::cuda
