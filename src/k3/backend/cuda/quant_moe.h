// Routed experts in GGUF's block formats on the GPU (the Q4_K_M-E3 / -E2 presets requantise experts):
// the stack as uploaded by upload_weights (gate, up [E][I] rows of X; down [E][X] rows of I; each row
// row_data_bytes(format, cols) bytes, no separate scales; ExpertStack::format a GGUF block format, the down
// stack in ExpertStack::down_format where that is a block format too, as llama-quantize mixes them), the
// same contract as moe_experts (moe_kernels.h): out[t] = sum_k topk_w[t][k] * down_e(act(gate_e x_t,
// up_e x_t)), the sum in rank order. `hidden`: scratch of n * K * I floats. fp32
// throughout, the weights decoded exactly (quant_decode.cuh). cudaErrorInvalidValue for another format,
// widths that are not whole blocks, or x / hidden not float-aligned.
#pragma once
#include <cuda_runtime_api.h>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda {

// Whether GGUF block experts take the tensor-core tiles (moe_experts) rather than quant_moe_experts for n
// tokens of K experts each over E: from kTcPairsPerExpert pairs per expert on
// average (quant_moe.cu); K3_QUANT_MOE=tc or =gemv in the environment forces one (comparisons).
bool quant_moe_use_tc(int n, int K, int E);

cudaError_t quant_moe_experts(const ExpertStack& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                              GluAct act, float situ_beta, float situ_linear_beta, float* hidden, float* out, cudaStream_t s);

}  // namespace k3::cuda
