// Device helpers and the workspace layout shared by the chunked-KDA tensor-core kernels (kda_chunked_tc.cu
// and the kernels in kda_tc_*.cu): PTX m16n8k16 bf16 mma, ldmatrix, cp.async, and where the intra-chunk
// kernel leaves W, U, Q exp(G), exp(G_last - G) k, A_qk and exp(G_last) for the state kernel. Internal to
// those files (an unnamed namespace: each translation unit gets its own copies).
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "k3/backend/cuda/kda_kernels.h"

namespace k3::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kD = 128;  // the only head dim of this path (the real models)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// c += a b (m16n8k16, bf16 in, fp32 accumulate)
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
__device__ __forceinline__ uint32_t lds32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ void sts32(bf16* p, uint32_t v) { *reinterpret_cast<uint32_t*>(p) = v; }

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(valid ? 16 : 0));  // src-size 0: zero-filled
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const bf16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = unpack2(u.x), b = unpack2(u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}

__device__ __forceinline__ int n_chunks(int n, int L) { return n > 0 ? (n + L - 1) / L : 0; }

// Which sequence chunk b belongs to: the last s with base[s] <= b (sequences without chunks skipped).
__device__ __forceinline__ int seq_of_chunk(const int* base, int n_seqs, int b) {
  int lo = 0, hi = n_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (base[mid] <= b) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

struct TcWs {
  bf16 *W, *U, *Q, *K, *A;
  float* eL;
  int* base;
};

inline size_t align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

inline size_t tc_ws_layout(size_t N, int n_seqs, int H, int D, int L, char* p, TcWs* ws) {
  const size_t plane = align256(N * H * D * sizeof(bf16));
  const size_t aplane = align256(N * H * L * sizeof(bf16));
  const size_t max_chunks = N / L + static_cast<size_t>(n_seqs);
  const size_t eplane = align256(max_chunks * H * D * sizeof(float));
  const size_t tab = align256((static_cast<size_t>(n_seqs) + 1) * sizeof(int));
  if (ws) {
    ws->W = reinterpret_cast<bf16*>(p);
    ws->U = reinterpret_cast<bf16*>(p + plane);
    ws->Q = reinterpret_cast<bf16*>(p + 2 * plane);
    ws->K = reinterpret_cast<bf16*>(p + 3 * plane);
    ws->A = reinterpret_cast<bf16*>(p + 4 * plane);
    ws->eL = reinterpret_cast<float*>(p + 4 * plane + aplane);
    ws->base = reinterpret_cast<int*>(p + 4 * plane + aplane + eplane);
  }
  return 4 * plane + aplane + eplane + tab;
}

}  // namespace
}  // namespace k3::cuda
