// MLA latent rows of any cache dtype (mla_cache_rows.h). One block per row; the FP8 writer reduces
// max |c_kv| over the block first (fmaxf, exact and order-independent, so the scale is the host's).
#include "k3/backend/cuda/mla_cache_rows.h"

#include "k3/backend/cuda/cache_dtype.cuh"
#include "k3/backend/cuda/mla_paging.cuh"
#include "k3/backend/cuda/pdl.cuh"

namespace k3::cuda {
namespace {

constexpr int kThreads = 128;

__device__ float block_max(float v) {
  __shared__ float red[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = red[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, red[w]);
  return m;
}

template <CacheDType DT>
__global__ void __launch_bounds__(kThreads) write_rows_kernel(MlaPaging pg, const float* __restrict__ lat) {
  pdl::begin();  // pdl-launched (pdl.cuh): nothing read before the predecessor completes
  const int t = blockIdx.x, kr = pg.kr, dr = pg.dr, dc = kr + dr;
  const float* x = lat + static_cast<int64_t>(t) * dc;
  uint8_t* row = mla_seq_rows(pg, pg.tok_seq[t]).row(pg.tok_pos[t]);
  if constexpr (DT == CacheDType::F32) {
    for (int i = threadIdx.x; i < dc; i += kThreads) reinterpret_cast<float*>(row)[i] = x[i];
  } else if constexpr (DT == CacheDType::BF16) {
    for (int i = threadIdx.x; i < dc; i += kThreads) reinterpret_cast<uint16_t*>(row)[i] = f32_to_bf16_bits(x[i]);
  } else {
    float amax = 0.f;
    for (int i = threadIdx.x; i < kr; i += kThreads) amax = fmaxf(amax, fabsf(x[i]));
    amax = block_max(amax);
    const float scale = amax == 0.f ? 1.f : amax / kFp8E4M3Max;  // IEEE division, as the host
    for (int i = threadIdx.x; i < kr; i += kThreads) row[i] = f32_to_fp8_e4m3_bits(x[i] / scale);
    uint16_t* pe = reinterpret_cast<uint16_t*>(row + mla_fp8_pe_offset(kr));
    for (int i = threadIdx.x; i < dr; i += kThreads) pe[i] = f32_to_bf16_bits(x[kr + i]);
    // Padding bytes (none for multiples of 4) stay as they were; the scale last.
    if (threadIdx.x == 0) *reinterpret_cast<float*>(row + mla_fp8_scale_offset(kr, dr)) = scale;
  }
}

// Four values per thread through cache_dtype.cuh's row loader (what the SIMT attention kernel uses), so
// the gather test checks the loader too. The fp8 scale multiplies the c_kv values (1 for the other dtypes:
// exact).
template <CacheDType DT>
__global__ void __launch_bounds__(kThreads) gather_kernel(MlaPaging pg, int seq, float* __restrict__ out) {
  pdl::begin();  // pdl-launched (pdl.cuh): nothing read before the predecessor completes
  const int s = blockIdx.x, kr = pg.kr, dr = pg.dr, dc = kr + dr;
  const uint8_t* row = mla_seq_rows(pg, seq).row(s);
  const float scale = mla_row_ckv_scale<DT>(row, kr, dr);
  float* o = out + static_cast<int64_t>(s) * dc;
  for (int i = 4 * threadIdx.x; i < dc; i += 4 * kThreads) {
    float4 v = mla_row_load4<DT>(row, kr, i);
    if (DT == CacheDType::FP8_E4M3 && i < kr) {
      v.x *= scale;
      v.y *= scale;
      v.z *= scale;
      v.w *= scale;
    }
    o[i] = v.x;
    o[i + 1] = v.y;
    o[i + 2] = v.z;
    o[i + 3] = v.w;
  }
}

}  // namespace

cudaError_t mla_write_rows(const MlaPaging& pg, int N, const float* lat, cudaStream_t s) {
  if (!mla_paging_shape_ok(pg) || N < 0) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  switch (pg.dtype) {
    case CacheDType::F32: (void)pdl::launch(write_rows_kernel<CacheDType::F32>, N, kThreads, 0, s, pg, lat); break;
    case CacheDType::BF16: (void)pdl::launch(write_rows_kernel<CacheDType::BF16>, N, kThreads, 0, s, pg, lat); break;
    case CacheDType::FP8_E4M3: (void)pdl::launch(write_rows_kernel<CacheDType::FP8_E4M3>, N, kThreads, 0, s, pg, lat); break;
  }
  return cudaGetLastError();
}

cudaError_t mla_gather_latents(const MlaPaging& pg, int seq, int S, float* out, cudaStream_t s) {
  if (!mla_paging_shape_ok(pg) || S < 0 || seq < 0) return cudaErrorInvalidValue;
  if (S == 0) return cudaSuccess;
  switch (pg.dtype) {
    case CacheDType::F32: (void)pdl::launch(gather_kernel<CacheDType::F32>, S, kThreads, 0, s, pg, seq, out); break;
    case CacheDType::BF16: (void)pdl::launch(gather_kernel<CacheDType::BF16>, S, kThreads, 0, s, pg, seq, out); break;
    case CacheDType::FP8_E4M3: (void)pdl::launch(gather_kernel<CacheDType::FP8_E4M3>, S, kThreads, 0, s, pg, seq, out); break;
  }
  return cudaGetLastError();
}

}  // namespace k3::cuda
