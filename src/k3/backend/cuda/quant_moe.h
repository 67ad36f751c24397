// Routed experts in GGUF's block formats on the GPU (the Q4_K_M-E3 / -E2 presets requantise experts; llama-quantize's
// mixes quantise them all): the stack as uploaded by upload_weights (gate, up [E][I] rows of X; down [E][X] rows of I;
// each row row_data_bytes(format, cols) bytes, no separate scales; ExpertStack::format a GGUF block format, the down
// stack in ExpertStack::down_format where that is a block format too, as llama-quantize mixes them), the same
// contract as moe_experts (moe_kernels.h): out[t] = sum_k topk_w[t][k] * down_e(act(gate_e x_t, up_e x_t)), the sum
// in rank order. Three kernel sets, one entry point (moe_experts, which picks by quant_moe_choice):
//   PerPair  quant_moe_experts (quant_moe.cu): one warp per output value, every pair reads its expert; every format.
//   Grouped  quant_moe_grouped (quant_moe_grouped.cu): the plan's tiles of up to 2 pairs of one expert read its rows
//            once with wide loads (the formats with a quant_part.cuh decoder: Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0).
//   Tiles    moe_experts' tensor-core tiles (moe_tc_tile.cuh; prefill): weights decoded exactly, rounded to bf16.
// PerPair and Grouped are fp32 throughout with the weights decoded exactly (quant_decode.cuh / quant_part.cuh).
#pragma once
#include <cuda_runtime_api.h>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda {

enum class QuantMoeKernels : int { PerPair = 0, Grouped = 1, Tiles = 2, Mma = 3 };

// The kernels for n tokens of K experts each over w: Mma (quant_moe_mma) from 1 to 12 (token, expert) pairs per expert
// on average where quant_moe_mma_supported(w), else Tiles from 2.5 pairs per expert (quant_moe.cu, measured), else
// Grouped where quant_moe_grouped_supported(w), else PerPair. K3_QUANT_MOE=tc | grouped | gemv | mma in the environment
// forces one (comparisons; grouped falls back to PerPair for formats it cannot run, mma to the rule); so does
// quant_moe_mma_override.
QuantMoeKernels quant_moe_choice(const ExpertStack& w, int n, int K);

// hidden: scratch of n * K * I floats. cudaErrorInvalidValue for another format, widths that are not whole blocks,
// or x / hidden not float-aligned.
cudaError_t quant_moe_experts(const ExpertStack& w, int n, int K, const float* x, const int32_t* topk_idx, const float* topk_w,
                              GluAct act, float situ_beta, float situ_linear_beta, float* hidden, float* out, cudaStream_t s);

// Whether quant_moe_grouped runs w: gate/up and down formats with a part decoder, whole blocks, X % 4 == 0, and
// every row at its decoder's alignment.
bool quant_moe_grouped_supported(const ExpertStack& w);
// The plan tile size quant_moe_grouped takes (pairs of one expert per tile).
int quant_moe_grouped_tile_pairs();
// After moe_experts' plan kernel cut tiles of quant_moe_grouped_tile_pairs() pairs (slot_of, tiles, num_tiles,
// tiles_bound as there): xs [n K][X], hidden [n K][I] and y [n K][X] floats of scratch (by slot, 16-byte aligned).
cudaError_t quant_moe_grouped(const ExpertStack& w, int n, int K, const float* x, const int32_t* slot_of, const int4* tiles,
                              const int32_t* num_tiles, int tiles_bound, const float* topk_w, GluAct act, float beta,
                              float lbeta, float* xs, float* hidden, float* y, float* out, cudaStream_t s);

// Tensor cores for the same decode tiles (quant_moe_mma.cu; quant_mma.h's block GEMV per tile): gate and up of one
// expert in one pass with the GLU fused, then down; x as bf16 hi + lo (split) or hi. Where it runs (Q4_K / Q5_K / Q6_K
// gate / up and down, X and I whole 256-blocks, rows at the decoders' alignment) moe_experts takes it as
// quant_moe_choice says.
constexpr int kQuantMoeMmaTilePairs = 8;  // the plan's tile size for it (one n8 MMA column block)
bool quant_moe_mma_supported(const ExpertStack& w);
// Tests and A/B timing: 1 = Mma wherever supported (and moe_experts' forced TcDecode path takes it), 0 = never, -1 = the
// rule of quant_moe_choice (and a forced TcDecode takes Grouped). Also K3_QUANT_MOE_MMA=1 / 0.
void quant_moe_mma_override(int on);
int quant_moe_mma_mode();
// After moe_experts' plan kernel cut tiles of kQuantMoeMmaTilePairs pairs (sorted, slot_of, tiles, num_tiles, tiles_bound
// as there). Scratch: xb 2 n X bf16, hb 2 n K I bf16, sums max(X / 32 (n + 8), I / 32 (n K + 8)) floats, hidden [n K][I]
// and y [n K][X] floats (16-byte aligned).
cudaError_t quant_moe_mma(const ExpertStack& w, int n, int K, const float* x, const int32_t* sorted, const int32_t* slot_of,
                          const int4* tiles, const int32_t* num_tiles, int tiles_bound, const float* topk_w, GluAct act,
                          float beta, float lbeta, bool split, uint16_t* xb, uint16_t* hb, float* sums, float* hidden,
                          float* y, float* out, cudaStream_t s);

}  // namespace k3::cuda
