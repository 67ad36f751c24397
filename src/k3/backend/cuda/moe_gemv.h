// The GEMV expert path for decode batches of a few (token, expert) pairs (MoePath::Gemv), internal to
// moe_kernels.cu. See moe_gemv.cu for the kernels and why.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda {

// out[t] = sum over k in rank order of topk_w[t][k] * down_e(act(gate_e(x_t)) * up_e(x_t)), e = topk_idx[t][k];
// pairs with an id outside [0, E) add nothing. h: scratch [n * K][I] floats; d: scratch [n * K][X] floats (the bf16
// down kernel's pairs forms). mx: MXFP4 experts, else bf16 (moe_experts checked formats, alignment and shapes). out
// [n][X] overwritten. Two launches (three with a pairs form).
cudaError_t moe_gemv_experts(const ExpertBank& w, bool mx, int n, int K, const float* x, const int32_t* topk_idx,
                             const float* topk_w, GluAct act, float beta, float lbeta, float* h, float* d, float* out,
                             cudaStream_t stream);
// A shared expert of the same shape as the routed ones (gate / up [I][X], down [X][I], bf16 on the device).
struct SharedGluBf16 {
  const uint16_t* gate = nullptr;
  const uint16_t* up = nullptr;
  const uint16_t* down = nullptr;
};
// moe_gemv_experts (bf16 experts) plus the shared expert in the same two launches: its gate / up as one more pair
// per token (h rows n * K .. n * K + n - 1: h holds (n * K + n) x I floats), its down as one more item of the down
// kernel, added after the routed sum: out[t] = routed(t) + shared(t), what the graph's separate MLP and add give up
// to the order of the shared dots' sums. At batch 1 this saves the shared MLP's four launches (call s42-1: gate/up
// GEMV, GLU, down GEMV and add, ~15 us a layer for ~14 MB). cudaErrorInvalidValue for MXFP4 experts or a missing
// matrix.
cudaError_t moe_gemv_experts_shared(const ExpertBank& w, const SharedGluBf16& sh, int n, int K, const float* x,
                                    const int32_t* topk_idx, const float* topk_w, GluAct act, float beta, float lbeta,
                                    float* h, float* d, float* out, cudaStream_t stream);
// The bf16 path stores h permuted within 256-value chunks where I % 256 == 0 so that the down kernel's activation
// loads are contiguous (moe_gemv.cu h_perm; the same bits). K3_MOE_HPERM=0 keeps column order; tests force either
// form (nullopt: back to the environment's).
void force_moe_h_perm_for_testing(std::optional<bool> on);
// The bf16 down kernel's forms (moe_gemv.cu): Items, 4 rows a block as (row, k) items 2 a warp (session 41; 48-50% of
// DRAM, ncu s48-2); Pairs, a warp per 4 rows of one pair's expert, blocks pair-major, then a combine launch (session 48;
// 64%, ncu s48-3; the default). The MXFP4 down kernel the same way (its quads). The same bits. K3_MOE_DOWN=items for
// the old forms; tests force one (nullopt: back to the environment's).
enum class MoeDownForm { Items, Pairs };
void force_moe_down_form_for_testing(std::optional<MoeDownForm> form);
// false when K3_MOE_GEMV=0 is set in the environment: Auto then keeps the session-8 rule (A/B in one binary).
bool moe_gemv_enabled();
// K3_MOE_GEMV: 0 off, 1 (default) bf16 experts only, 2 MXFP4 experts too (measurement).
int moe_gemv_mode();

}  // namespace k3::cuda
