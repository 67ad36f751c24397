// Gated MLA attention kernels over the paged latent cache (model-spec section 3.3; CPU reference:
// model/mla_layer.cpp and backend/cpu/mla_attention.cpp). NoPE: no rotation anywhere.
// Device pointers; enqueued on `stream`; each returns the launch status.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "k3/backend/cuda/mla_cache_rows.h"
#include "k3/backend/cuda/mla_paging.h"

namespace k3::cuda {

// The paging (MlaPaging, one description for every MLA kernel) is in mla_paging.h; writing rows and the
// MHA form's gather are in mla_cache_rows.h.

// Copies q_pe (the last dr of each head's q [N][nh][dn+dr]) into q_lat [N][nh][kr+dr] at offset kr.
cudaError_t mla_copy_qpe(const float* q, int N, int nh, int dn, int dr, int kr, float* q_lat, cudaStream_t s);

// Absorbed attention over the rows of layer pg.layer: for each token t (tok_index[i] for i < N when given)
// and head h, softmax over the cached rows 0..tok_pos[t] of (q_lat[t][h] . row) * scale, then
// o_lat[t][h] = sum softmax * c_kv (the first kr values of each row). Rows of any pg.dtype are read as
// stored (no up-conversion pass; FP8 c_kv = code * the row's scale, k_pe bf16), the same values as
// cpu::mla_attention_latent_rows_typed. q_lat [N][nh][kr+dr], o_lat [N][nh][kr]. kr <= 512.
// Three kernels behind one entry point:
//  - wgmma (sm_90a, sm90a/mla_decode_wgmma.cu) for BF16 rows, kr = 512, dr = 64 where mla_wgmma_preferred (>= 32
//    heads): blocks of 64 heads (FlashMLA's shape), rows copied to shared memory as stored by a producer
//    warpgroup, S = QK^T and O = PV as warpgroup MMAs on alternate tiles with fp32 accumulation and softmax;
//  - tensor cores (mma.sync, mla_decode_tc.cu) for kr = 512, dr = 64 and nh >= kMlaTensorCoreMinHeads, any
//    dtype: blocks of 32 heads, rows converted to bf16 in shared memory (relative error ~3e-3 against fp32
//    for both tensor-core kernels; tests/cuda/test_mla_decode.cpp);
//  - SIMT fp32 (the reference path, <= 1.5e-6): 8 heads of one token per block.
// K3_MLA_DECODE=simt|tc|wgmma forces one (where the shape and dtype allow; else the next one down). All
// split the keys of a token over several blocks (flash-decoding, so that batch-1 decode fills the GPU) and
// merge the partial results through `ws` (mla_attend_workspace_floats(N, nh, kr) floats; null: no split).
// Split counts depend on N, nh and the cache dtype only, never on the context length, so a captured CUDA
// graph stays valid as sequences grow; the kernel choice depends on N, nh and the dtype only (session 50: the
// wgmma kernel no longer needs a length class to pick it).
constexpr int kMlaTensorCoreMinHeads = 16;
enum class MlaDecodeKernel { Simt, MmaSync, Wgmma };
// The kernel mla_attend_latent runs for N tokens of nh heads over rows of `dtype` (K3_MLA_DECODE included).
MlaDecodeKernel mla_attend_kernel(int N, int nh, int kr, int dr, CacheDType dtype);
// The measured dispatch rule between the wgmma and mma.sync kernels for BF16 rows: since session 50 the head
// count alone (the wgmma kernel is at least level with the mma.sync one at every measured batch and length).
bool mla_wgmma_preferred(int nh);
// Whether F32 rows take a tensor-core kernel (the mma.sync one).
bool mla_attend_uses_tensor_cores(int nh, int kr, int dr);
int mla_attend_splits(int N, int nh);  // the SIMT kernel's
// Fits every path and every cache dtype (the tensor-core split counts follow each kernel's occupancy,
// which differs per dtype), so a model sizes it without knowing the dtype.
size_t mla_attend_workspace_floats(int N, int nh, int kr);
// The largest workspace any N' in 1..max_n needs (what a model sizes once).
size_t mla_attend_workspace_floats_max(int max_n, int nh, int kr);
cudaError_t mla_attend_latent(const MlaPaging& pg, int N, int nh, const float* q_lat, float scale, float* o_lat,
                              float* ws, cudaStream_t s);

// Absorption for decode-sized batches (the model uses batched SGEMMs beyond kMlaSmallBatch tokens):
//   q_lat[t][h][0:kr] = sum_i q[t][h][i] * kv_b[h*(dn+dv) + i][:]      (i < dn; q [N][nh][dn+dr])
//   q_lat[t][h][kr:]  = q[t][h][dn:]  (mla_absorb_q only: the rope part, which mla_copy_qpe copies beside the SGEMMs)
//   o[t][h][i]        = sum_j kv_b[h*(dn+dv) + dn + i][j] * o_lat[t][h][j]   (o [N][nh][dv])
constexpr int kMlaSmallBatch = 64;
cudaError_t mla_absorb_q(const float* q, const float* kv_b, int N, int nh, int dn, int dr, int dv, int kr, float* q_lat,
                         cudaStream_t s);
cudaError_t mla_up_v(const float* o_lat, const float* kv_b, int N, int nh, int dn, int dv, int kr, float* o,
                     cudaStream_t s);

// MHA (prefill) form helpers (with mla_gather_latents); the projections and the attention products run on cuBLAS.
// In place over scores [nh][Tq][S]: row (h, t) is a causal softmax over s <= first_pos + t (later
// columns become 0).
cudaError_t mla_causal_softmax(float* scores, int nh, int Tq, int S, int first_pos, cudaStream_t s);

}  // namespace k3::cuda
