// Device helpers and the workspace layout shared by the chunked-KDA tensor-core kernels (kda_chunked_tc.cu
// and the kernels in kda_tc_*.cu): PTX m16n8k16 bf16 mma (ldmatrix and cp.async from smem_ptx.cuh), and where the intra-chunk
// kernel leaves W, U, Q exp(G), exp(G_last - G) k, A_qk and exp(G_last) for the state kernel. Internal to
// those files (an unnamed namespace: each translation unit gets its own copies).
#pragma once
#include <cuda_bf16.h>

#include <cstddef>
#include <cstdint>

#include "k3/backend/cuda/kda_kernels.h"
#include "k3/backend/cuda/smem_ptx.cuh"

namespace k3::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kD = 128;  // the only head dim of this path (the real models)

using ptx::ldsm_x4;
using ptx::ldsm_x4_t;
using ptx::smem_u32;
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

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;

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

// flags: one word per (global chunk b, head h) item, index b H + h: the overlapped launch's ready flags (0 =
// not yet produced, cleared by the table kernel of each call; kTcReady = published by the intra kernel).
struct TcWs {
  bf16 *W, *U, *Q, *K, *A;
  float* eL;
  int* base;
  uint32_t* flags;
};
constexpr uint32_t kTcReady = 1;

inline size_t align256(size_t x) { return (x + 255) & ~static_cast<size_t>(255); }

inline size_t tc_ws_layout(size_t N, int n_seqs, int H, int D, int L, char* p, TcWs* ws) {
  const size_t plane = align256(N * H * D * sizeof(bf16));
  const size_t aplane = align256(N * H * L * sizeof(bf16));
  const size_t max_chunks = N / L + static_cast<size_t>(n_seqs);
  const size_t eplane = align256(max_chunks * H * D * sizeof(float));
  const size_t tab = align256((static_cast<size_t>(n_seqs) + 1) * sizeof(int));
  const size_t fplane = align256(max_chunks * H * sizeof(uint32_t));  // appended: the planes above keep their offsets
  if (ws) {
    ws->W = reinterpret_cast<bf16*>(p);
    ws->U = reinterpret_cast<bf16*>(p + plane);
    ws->Q = reinterpret_cast<bf16*>(p + 2 * plane);
    ws->K = reinterpret_cast<bf16*>(p + 3 * plane);
    ws->A = reinterpret_cast<bf16*>(p + 4 * plane);
    ws->eL = reinterpret_cast<float*>(p + 4 * plane + aplane);
    ws->base = reinterpret_cast<int*>(p + 4 * plane + aplane + eplane);
    ws->flags = reinterpret_cast<uint32_t*>(p + 4 * plane + aplane + eplane + tab);
  }
  return 4 * plane + aplane + eplane + tab + fplane;
}

// The overlapped launch's hand-off of one (chunk, head) item from the intra kernel to the state kernel.
// Publish: called by ONE thread after a __syncthreads that follows every store of the item by the block (the
// barrier orders the other threads' stores before this thread's; the fence and the gpu-scope release make them
// visible to whoever acquires the flag: cooperative groups' grid sync uses the same bar.sync + fence + flag
// pattern). The intra kernel's stores (plain or st.global.cs) go to L2; .cs is only an eviction hint.
__device__ __forceinline__ void tc_flag_publish(uint32_t* f) {
  __threadfence();
  asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(f), "r"(kTcReady) : "memory");
}
// Wait: ONE thread of the consumer block spins with gpu-scope acquire loads (the flag is in L2; an acquire load
// never hits a stale L1 line), backing off with __nanosleep; the caller's following __syncthreads extends the
// acquire to the block's other threads, whose cp.async.cg copies then read the item's operands from L2 (.cg
// bypasses L1, so no line cached before the flag was seen can be returned).
__device__ __forceinline__ void tc_flag_wait(const uint32_t* f) {
  unsigned ns = 32;
  for (;;) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(f) : "memory");
    if (v == kTcReady) return;
    __nanosleep(ns);
    ns = ns < 1024 ? 2 * ns : ns;
  }
}

}  // namespace

// The state kernel v2 of the overlapped launch (kda_tc_state2.cu; kda_chunked_tc.cu's run_tc_overlap): chunk 32,
// warps 8 or 4, two operand buffers, each chunk's operands copied only once ws.flags says the intra kernel
// has produced them. Launched with programmatic stream serialization right after the intra kernel (see
// run_tc_overlap): it may start while that kernel runs. Declared here, not in kda_tc_state2.h: internal to
// these two files.
cudaError_t kda_tc_state2_launch_overlap(int warps, const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H,
                                         void* workspace, float* o, float* chunk_states, cudaStream_t stream);
// Per-block resources of that kernel, for sizing the intra grid beside it: registers (allocated, per block),
// shared memory (dynamic bytes), threads.
cudaError_t kda_tc_state2_overlap_cost(int warps, int* regs, int* smem, int* threads);
}  // namespace k3::cuda
