// The fused chunked KDA prefill on tensor cores (kda_tc_fused.cu): one warp-specialised kernel per call, called by
// kda_chunked_tc (kda_chunked_tc.cu) when KdaTcTuning::fused / K3_KDA_TC_FUSED asks for it. Internal to those files.
#pragma once
#include <cuda_runtime_api.h>

#include "k3/backend/cuda/kda_kernels.h"

namespace k3::cuda {

// Chunk 32, D = 128, q / k / v / g bf16 [N][H * 128], beta fp32 [N][H]; o, chunk_states and the states in seqs as
// kda_chunked_tc. variant (KdaTcTuning::fused): 2 = two ring buffers between the producer and consumer warps, 3 =
// three, 4 = two with every exponential in the ftz form (not bit-identical to the two-kernel path: values below
// ~1e-38 flush to zero). Needs no workspace. Asynchronous; graph-capturable.
cudaError_t kda_tc_fused_launch(int variant, const KdaSeq* seqs, int n_seqs, int H, const void* q, const void* k,
                                const void* v, const void* g, const float* beta, float* o, float* chunk_states,
                                cudaStream_t stream);

}  // namespace k3::cuda
