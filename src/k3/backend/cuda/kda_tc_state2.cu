// State + output kernel v2 of the chunked KDA prefill on tensor cores (chunk 32, D = 128; kda_chunked_tc.cu's
// file comment has the algorithm). Per chunk, with the intra-chunk kernel's operands W, U, Q (= q exp(G)),
// K (= exp(G_last - G) k), A_qk and eL = exp(G_last):
//   V~ = U - W S;   O = Q S + A_qk V~;   S = diag(eL) S + K^T V~        (S [k][v] fp32)
// v1 (kda_tc_state_kernel) splits S by key rows across warps, so every chunk step exchanges a bf16 copy of S
// and V~ through shared memory behind three barriers: a cross-warp chain over all chunks, latency-bound.
// v2 splits the VALUE columns: warp w owns v in [16 w, 16 w + 16) of the block's columns and every product
// of a chunk step needs only its own columns, so the step is warp-local. The warp holds S^T (16 v x 128 k)
// as 16 m16n8 C fragments (64 fp32 registers) and computes transposed:
//   V~^T = U^T - S^T W^T        A = S^T: C fragments of n-tiles 2j, 2j + 1 packed to bf16 ARE the A
//                               fragment of k-slice j (FlashAttention-2's trick, no shared memory);
//                               B[k][n] = W[n][k]: W rows in shared memory, plain ldmatrix
//   O^T  = S^T Q^T + V~^T A_qk^T   B[j][i] = A_qk[i][j] (zero above the diagonal: one k-step skipped)
//   S^T  = S^T diag(eL) + V~^T K   A = V~^T repacked from its C fragments; B = K rows: ldmatrix.trans
// Chunk operands stream into a ring of NBUF = 3 shared-memory buffers with cp.async two chunks ahead (rows
// past the sequence's end zero-filled, so they add nothing); the buffer hand-off is the only block-wide
// synchronisation (one __syncthreads per chunk). Numerics class as v1: S fp32 in registers, bf16 copies of
// S and V~ as mma operands, fp32 accumulation (only the summation order differs).
// Cost model: ~102 mma per warp per chunk; each warp reads all of W, Q, K (24 KB of ldmatrix per chunk), so
// shared-memory bandwidth (8 warps x 26.5 KB per chunk and head) rather than HBM (34 KB per chunk and head)
// is the expected floor. ptxas (CUDA 13, sm_90): 8 warps 128 registers, 4 warps 190, no spills.
#include "k3/backend/cuda/kda_tc_state2.h"

#include <cuda_bf16.h>

#include <cstdint>

#include "k3/backend/cuda/kda_tc_common.cuh"
#include "k3/backend/cuda/kda_tc_state2_ops.cuh"

namespace k3::cuda {
namespace {

// NW warps = BV = 16 NW value columns per block, NBUF operand buffers (3; 2 in the overlapped launch). One buffer: W, Q, K bf16 [L][LDB]; A_qk bf16 [L][LDA]; the
// block's U columns bf16 [L][LDU]; eL fp32 [kD]. Row strides of 16 B times an odd number: the 8 rows of an
// ldmatrix phase fall in distinct banks.
template <int NW, int NBUF_ = 3>
struct State2Cfg {
  static constexpr int L = 32, NT = 32 * NW, BV = 16 * NW, NBUF = NBUF_;
  static constexpr int LDB = kD + 8, LDA = L + 8, LDU = BV + 8;
  static constexpr int off_w = 0, off_q = L * LDB * 2, off_k = 2 * L * LDB * 2, off_a = 3 * L * LDB * 2;
  static constexpr int off_u = off_a + L * LDA * 2, off_e = off_u + L * LDU * 2;
  static constexpr int buf_bytes = off_e + kD * 4;
  static constexpr size_t bytes = static_cast<size_t>(NBUF) * buf_bytes;
  static_assert(off_q % 16 == 0 && off_a % 16 == 0 && off_u % 16 == 0 && off_e % 16 == 0 && buf_bytes % 16 == 0,
                "cp.async / ldmatrix alignment");
};

// Chunk c's operands into buffer b: rows [r0, r0 + Lc) of the workspace, zeros past them (the row address is
// clamped into the sequence, its bytes not read). erow: the chunk's eL row ((chunk * H + h) * kD).
template <class Cfg>
__device__ __forceinline__ void state2_load(char* b, const TcWs& ws, size_t r0, int Lc, size_t hcol, int v0, int C,
                                            int H, int h, size_t erow) {
  constexpr int L = Cfg::L, NT = Cfg::NT, LDB = Cfg::LDB, LDA = Cfg::LDA, LDU = Cfg::LDU, BV = Cfg::BV;
  bf16* W = reinterpret_cast<bf16*>(b + Cfg::off_w);
  bf16* Q = reinterpret_cast<bf16*>(b + Cfg::off_q);
  bf16* K = reinterpret_cast<bf16*>(b + Cfg::off_k);
  bf16* A = reinterpret_cast<bf16*>(b + Cfg::off_a);
  bf16* U = reinterpret_cast<bf16*>(b + Cfg::off_u);
  float* eL = reinterpret_cast<float*>(b + Cfg::off_e);
  const int tid = threadIdx.x;
#pragma unroll
  for (int it = 0; it < L * (kD / 8) / NT; ++it) {
    const int e = tid + it * NT, i = e / (kD / 8), d = 8 * (e % (kD / 8));
    const size_t at = (r0 + min(i, Lc - 1)) * C + hcol + d;
    cp_async16(W + i * LDB + d, ws.W + at, i < Lc);
    cp_async16(Q + i * LDB + d, ws.Q + at, i < Lc);
    cp_async16(K + i * LDB + d, ws.K + at, i < Lc);
  }
#pragma unroll
  for (int it = 0; it < L * (BV / 8) / NT; ++it) {
    const int e = tid + it * NT, i = e / (BV / 8), j = 8 * (e % (BV / 8));
    cp_async16(U + i * LDU + j, ws.U + (r0 + min(i, Lc - 1)) * C + hcol + v0 + j, i < Lc);
  }
  if (tid < L * (L / 8)) {
    const int i = tid / (L / 8), j = 8 * (tid % (L / 8));
    cp_async16(A + i * LDA + j, ws.A + ((r0 + min(i, Lc - 1)) * H + h) * L + j, i < Lc);
  }
  if (tid < kD / 4) cp_async16(eL + 4 * tid, ws.eL + erow + 4 * tid, true);
}

// Grid (n_seqs, H, kD / BV): one block per sequence, head and BV value columns, walking the sequence's chunks.
// Launch bounds: 8 warps are held to 128 registers (2 blocks = 16 warps per SM; 111 KB of shared memory each
// fits twice); 4 warps may use more (natural ~190, no spills): their 99 KB of shared memory already limits an SM
// to 2 blocks = 8 warps.
// kWait (the overlapped launch, NBUF = 2): the kernel may run while the intra kernel is still producing, so chunk
// c's operands are copied only after thread 0 has seen its flag (tc_flag_wait) and a __syncthreads has passed
// that on: the wait for chunk c + NBUF - 1 sits just before the barrier after which the block issues its copies.
// Two buffers, not three: the block then needs chunk c + 1 (not c + 2) produced before it computes chunk c, and
// 66 / 74 KB of shared memory (4 / 8 warps) leave room beside the intra blocks. The arithmetic is unchanged: the
// outputs are bit-identical to the sequential launch's.
template <int NW, int NBUF = 3, bool kWait = false>
__global__ void __launch_bounds__(State2Cfg<NW, NBUF>::NT, NW == 8 ? 2 : 1)
    kda_tc_state2_kernel(const KdaSeq* __restrict__ seqs, int H, const int* __restrict__ base, TcWs ws,
                         float* __restrict__ o, float* __restrict__ chunk_states) {
  using Cfg = State2Cfg<NW, NBUF>;
  constexpr int L = Cfg::L;
  extern __shared__ float4 smem4[];
  char* sp = reinterpret_cast<char*>(smem4);
  const KdaSeq sq = seqs[blockIdx.x];
  if (sq.n <= 0) return;
  const int h = blockIdx.y, v0 = blockIdx.z * Cfg::BV, C = H * kD, cb = base[blockIdx.x];
  const int warp = threadIdx.x / 32, vw = v0 + 16 * warp;  // the warp's first value column in the head
  const State2Lane ln = state2_lane<Cfg>(warp, threadIdx.x % 32);
  const size_t hcol = static_cast<size_t>(h) * kD;
  const int nch = n_chunks(sq.n, L);
  auto load = [&](int c) {  // one commit group per chunk, empty past the last: the wait count stays fixed
    if (c < nch)
      state2_load<Cfg>(sp + (c % NBUF) * Cfg::buf_bytes, ws, static_cast<size_t>(sq.offset + c * L),
                       min(L, sq.n - c * L), hcol, v0, C, H, h, (static_cast<size_t>(cb + c) * H + h) * kD);
    cp_async_commit();
  };
  auto ready = [&](int c) {  // kWait: thread 0 waits until chunk c (if it exists) is produced
    if constexpr (kWait) {
      if (threadIdx.x == 0 && c < nch) tc_flag_wait(ws.flags + static_cast<size_t>(cb + c) * H + h);
    }
  };
  if constexpr (kWait) {
    for (int c = 0; c < NBUF - 1; ++c) ready(c);
    __syncthreads();  // passes thread 0's acquire on to the threads issuing the copies
  }
  for (int c = 0; c < NBUF - 1; ++c) load(c);

  float* Sg = sq.S + hcol * kD + vw;
  float st[16][4];
  state2_io<false>(st, Sg, ln);
  for (int c = 0; c < nch; ++c) {
    ready(c + NBUF - 1);        // kWait: before the barrier that precedes that chunk's copies
    cp_async_wait<NBUF - 2>();  // this thread's copies of chunk c have landed (later chunks may pend)
    __syncthreads();            // ... everyone's; and every warp is done with chunk c - 1's buffer
    load(c + NBUF - 1);         // into that buffer
    const State2Ops b = state2_ops<Cfg>(sp + (c % NBUF) * Cfg::buf_bytes);
    const int t0 = c * L, Lc = min(L, sq.n - t0);
    uint32_t va[2][4];
    float ot[4][4];
    state2_vnew<Cfg>(b, ln, st, va, ot);
    state2_out<Cfg>(b, ln, va, ot, Lc, o + static_cast<size_t>(sq.offset + t0) * C + hcol + vw, C);
    state2_update<Cfg>(b, ln, va, st);
    if (chunk_states) state2_io<true>(st, chunk_states + (static_cast<size_t>(cb + c) * H + h) * kD * kD + vw, ln);
  }
  state2_io<true>(st, Sg, ln);
}

template <int NW>
cudaError_t launch_state2(const KdaSeq* seqs, int n_seqs, int H, const TcWs& ws, float* o, float* chunk_states,
                          cudaStream_t stream) {
  using Cfg = State2Cfg<NW>;
  static const cudaError_t attr = cudaFuncSetAttribute(
      kda_tc_state2_kernel<NW>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::bytes));
  if (attr != cudaSuccess) return attr;
  const dim3 grid(static_cast<unsigned>(n_seqs), static_cast<unsigned>(H), kD / Cfg::BV);
  kda_tc_state2_kernel<NW><<<grid, Cfg::NT, Cfg::bytes, stream>>>(seqs, H, ws.base, ws, o, chunk_states);
  return cudaGetLastError();
}

// The overlapped launch (kda_chunked_tc.cu's run_tc_overlap): kWait, two buffers, the shared memory carveout at its
// maximum (so an SM already running intra blocks is configured to take a state block beside them), and
// programmatic stream serialization: the launch may begin once every block of the preceding intra kernel has
// executed griddepcontrol.launch_dependents (all of them resident) instead of after that kernel completes. No
// griddepcontrol.wait here: the flags order every read of the intra kernel's outputs.
template <int NW>
cudaError_t launch_state2_overlap(const KdaSeq* seqs, int n_seqs, int H, const TcWs& ws, float* o,
                                  float* chunk_states, cudaStream_t stream) {
  using Cfg = State2Cfg<NW, 2>;
  auto* kern = kda_tc_state2_kernel<NW, 2, true>;
  static const cudaError_t attr = [&] {
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Cfg::bytes));
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kern, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (attr != cudaSuccess) return attr;
  cudaLaunchAttribute la[1];
  la[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  la[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(n_seqs), static_cast<unsigned>(H), kD / Cfg::BV);
  cfg.blockDim = dim3(Cfg::NT);
  cfg.dynamicSmemBytes = Cfg::bytes;
  cfg.stream = stream;
  cfg.attrs = la;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, seqs, H, static_cast<const int*>(ws.base), ws, o, chunk_states);
}

template <int NW>
cudaError_t state2_overlap_cost(int* regs, int* smem, int* threads) {
  cudaFuncAttributes fa{};
  const cudaError_t e = cudaFuncGetAttributes(&fa, kda_tc_state2_kernel<NW, 2, true>);
  if (e != cudaSuccess) return e;
  *regs = ((fa.numRegs * 32 + 255) / 256) * 256 * NW;  // allocated per warp in units of 256
  *smem = static_cast<int>(State2Cfg<NW, 2>::bytes + fa.sharedSizeBytes);
  *threads = State2Cfg<NW, 2>::NT;
  return cudaSuccess;
}

// The two public launches: the workspace views, then the 8- or 4-warp kernel, sequential or overlapped.
cudaError_t state2_dispatch(bool overlap, int warps, const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H,
                            void* workspace, float* o, float* chunk_states, cudaStream_t stream) {
  if (warps != 8 && warps != 4) return cudaErrorInvalidValue;
  TcWs ws;
  tc_ws_layout(static_cast<size_t>(n_total_tokens), n_seqs, H, kD, State2Cfg<8>::L, static_cast<char*>(workspace),
               &ws);
  if (overlap)
    return warps == 8 ? launch_state2_overlap<8>(seqs, n_seqs, H, ws, o, chunk_states, stream)
                      : launch_state2_overlap<4>(seqs, n_seqs, H, ws, o, chunk_states, stream);
  return warps == 8 ? launch_state2<8>(seqs, n_seqs, H, ws, o, chunk_states, stream)
                    : launch_state2<4>(seqs, n_seqs, H, ws, o, chunk_states, stream);
}

}  // namespace

cudaError_t kda_tc_state2_launch_overlap(int warps, const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H,
                                         void* workspace, float* o, float* chunk_states, cudaStream_t stream) {
  return state2_dispatch(true, warps, seqs, n_seqs, n_total_tokens, H, workspace, o, chunk_states, stream);
}

cudaError_t kda_tc_state2_overlap_cost(int warps, int* regs, int* smem, int* threads) {
  if (warps != 8 && warps != 4) return cudaErrorInvalidValue;
  return warps == 8 ? state2_overlap_cost<8>(regs, smem, threads) : state2_overlap_cost<4>(regs, smem, threads);
}

cudaError_t kda_tc_state2_launch(int warps, const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H,
                                 void* workspace, float* o, float* chunk_states, cudaStream_t stream) {
  return state2_dispatch(false, warps, seqs, n_seqs, n_total_tokens, H, workspace, o, chunk_states, stream);
}

}  // namespace k3::cuda
