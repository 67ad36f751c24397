// Absorbed MLA decode on Hopper's warpgroup MMA (wgmma, sm_90a; kernel in sm90a/mla_decode_wgmma.cu),
// used by mla_attend_latent (mla_kernels.cu) for BF16 latent rows; not a public entry point.
// Shapes: kv_lora_rank 512, rope 64 only; bf16 operands, fp32 softmax and accumulators.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "k3/backend/cuda/mla_paging.h"

namespace k3::cuda::mla_wg {

constexpr int kHeadsPerBlock = 64;  // wgmma's M: heads 64 b .. 64 b + 63 of one token per block
constexpr int kKeys = 64;           // keys per tile (and the split granularity)
constexpr int kMinSplitKeys = 128;

// kr 512, dr 64, BF16 rows (the only dtype whose rows go to shared memory as they are stored).
bool supports(int kr, int dr, CacheDType dtype);
// Key splits for N tokens of nh heads (one resident block per SM): depends on N and nh only.
int splits(int N, int nh);
size_t workspace_floats(int N, int nh, int kr);
cudaError_t attend(const MlaPaging& pg, int N, int nh, const float* q_lat, float scale, float* o_lat, float* ws,
                   cudaStream_t s);

}  // namespace k3::cuda::mla_wg
