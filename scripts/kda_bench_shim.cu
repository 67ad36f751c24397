// C entry points over the KDA prefill kernels, for scripts/bench_kda_tc.py: it times k3's kernels and
// flash-linear-attention's chunk_kda in one Python process on the same tensors (ctypes; pointers come
// from torch). Built and run on the GPU machine by scripts/gpu-bench-kda.
#include "k3/backend/cuda/kda_chunked_tc.h"
#include "k3/backend/cuda/kda_kernels.h"

using k3::cuda::KdaSeq;

extern "C" {
int k3_kda_seq_size() { return static_cast<int>(sizeof(KdaSeq)); }

size_t k3_kda_old_ws(int N, int n_seqs, int H, int D, int chunk) {
  return k3::cuda::kda_chunked_workspace_bytes(N, n_seqs, H, D, chunk);
}
int k3_kda_old(const void* seqs, int n_seqs, int N, int H, int D, int chunk, const float* q, const float* k,
               const float* v, const float* g, const float* beta, float* o, void* ws, size_t wsb) {
  return k3::cuda::kda_chunked(static_cast<const KdaSeq*>(seqs), n_seqs, N, H, D, chunk, q, k, v, g, beta, o, ws, wsb,
                               nullptr);
}
int k3_kda_recurrent(const void* seqs, int n_seqs, int H, int D, const float* q, const float* k, const float* v,
                     const float* g, const float* beta, float* o) {
  return k3::cuda::kda_recurrent(static_cast<const KdaSeq*>(seqs), n_seqs, H, D, q, k, v, g, beta, o, nullptr);
}
size_t k3_kda_tc_ws(int N, int n_seqs, int H, int D, int chunk) {
  return k3::cuda::kda_chunked_tc_workspace_bytes(N, n_seqs, H, D, chunk);
}
// bf16_in: q, k, v, g are bf16 (else fp32). intra: the intra-chunk kernel (KdaTcTuning::intra: 0 default,
// 1 = v1, 2 = v2).
int k3_kda_tc(const void* seqs, int n_seqs, int N, int H, int D, int chunk, int bf16_in, const void* q,
              const void* k, const void* v, const void* g, const float* beta, float* o, float* chunk_states, int bv,
              int nbuf, int intra, void* ws, size_t wsb) {
  return k3::cuda::kda_chunked_tc(static_cast<const KdaSeq*>(seqs), n_seqs, N, H, D, chunk,
                                  bf16_in ? k3::cuda::KdaInType::BF16 : k3::cuda::KdaInType::F32, q, k, v, g, beta, o,
                                  chunk_states, k3::cuda::KdaTcTuning{bv, nbuf, intra}, ws, wsb, nullptr);
}
// k3_kda_tc plus state: the state kernel (KdaTcTuning::state: 0 default, 1 = v1, 2 = v2 at 8 warps, 3 = v2 at
// 4 warps; v2 ignores bv / nbuf).
int k3_kda_tc2(const void* seqs, int n_seqs, int N, int H, int D, int chunk, int bf16_in, const void* q, const void* k,
               const void* v, const void* g, const float* beta, float* o, float* chunk_states, int bv, int nbuf,
               int intra, int state, void* ws, size_t wsb) {
  return k3::cuda::kda_chunked_tc(static_cast<const KdaSeq*>(seqs), n_seqs, N, H, D, chunk,
                                  bf16_in ? k3::cuda::KdaInType::BF16 : k3::cuda::KdaInType::F32, q, k, v, g, beta, o,
                                  chunk_states, k3::cuda::KdaTcTuning{bv, nbuf, intra, state}, ws, wsb, nullptr);
}
// k3_kda_tc2 plus overlap (KdaTcTuning::overlap: 0 = K3_KDA_TC_OVERLAP, 1 = off, 2 = the state kernel overlapped
// with the intra kernel; chunk 32, bf16 inputs, intra 4 / 5, state 2 / 3, else the sequential launch).
int k3_kda_tc3(const void* seqs, int n_seqs, int N, int H, int D, int chunk, int bf16_in, const void* q, const void* k,
               const void* v, const void* g, const float* beta, float* o, float* chunk_states, int bv, int nbuf,
               int intra, int state, int overlap, void* ws, size_t wsb) {
  return k3::cuda::kda_chunked_tc(static_cast<const KdaSeq*>(seqs), n_seqs, N, H, D, chunk,
                                  bf16_in ? k3::cuda::KdaInType::BF16 : k3::cuda::KdaInType::F32, q, k, v, g, beta, o,
                                  chunk_states, k3::cuda::KdaTcTuning{bv, nbuf, intra, state, overlap}, ws, wsb,
                                  nullptr);
}
// k3_kda_tc3 plus fused (KdaTcTuning::fused: 0 = K3_KDA_TC_FUSED, 1 = off, 2..5 = the fused kernel's variants;
// chunk 32 and bf16 inputs, else the two-kernel path).
int k3_kda_tc4(const void* seqs, int n_seqs, int N, int H, int D, int chunk, int bf16_in, const void* q, const void* k,
               const void* v, const void* g, const float* beta, float* o, float* chunk_states, int bv, int nbuf,
               int intra, int state, int overlap, int fused, void* ws, size_t wsb) {
  return k3::cuda::kda_chunked_tc(static_cast<const KdaSeq*>(seqs), n_seqs, N, H, D, chunk,
                                  bf16_in ? k3::cuda::KdaInType::BF16 : k3::cuda::KdaInType::F32, q, k, v, g, beta, o,
                                  chunk_states, k3::cuda::KdaTcTuning{bv, nbuf, intra, state, overlap, fused}, ws, wsb,
                                  nullptr);
}
}
