// State kernel v2 of the chunked KDA prefill on tensor cores (kda_tc_state2.cu), called by kda_chunked_tc.cu's
// run_tc after the intra-chunk kernel. Internal to those two files.
#pragma once
#include <cuda_runtime_api.h>

#include "k3/backend/cuda/kda_kernels.h"

namespace k3::cuda {

// Chunk 32, D = 128 only. warps: 8 (one block per sequence and head, all 128 value columns) or 4 (two blocks
// per head, 64 columns each). workspace: kda_chunked_tc's (its layout for chunk 32), filled by the table and
// intra-chunk kernels earlier on `stream`. o, chunk_states, the states in seqs: as kda_chunked_tc.
cudaError_t kda_tc_state2_launch(int warps, const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H,
                                 void* workspace, float* o, float* chunk_states, cudaStream_t stream);

}  // namespace k3::cuda
