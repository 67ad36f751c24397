// Tensor-core expert kernels for decode-sized MoE batches (few pairs per expert), internal to
// moe_kernels.cu: W4A16 (MXFP4) or W16A16 (bf16) grouped GLU on mma.sync m16n8k16, weights streamed from
// HBM straight into A fragments (no shared memory), the tile's tokens as the n8 side. See moe_decode.cu.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda {

// Scratch the decode path needs, carved from MoeWorkspace's allocation.
struct DecodeScratch {
  int max_pairs = 0;          // (token, expert) pairs the buffers below hold (P <= this)
  int max_tokens = 0;         // tokens xb holds
  uint16_t* xb = nullptr;     // [2][max_tokens][X] bf16 activations (hi, lo), columns permuted for MXFP4
  uint16_t* hb = nullptr;     // [2][max_pairs][I] bf16 GLU outputs by slot (hi, lo), same permutation
  float* part = nullptr;      // split-K partial sums: [splits][P][2I] (gate | up), then [splits][P][X] (down)
  int64_t part_floats = 0;
};

// Bytes DecodeScratch needs for a workspace of max_tokens tokens (0 when the decode path is off).
size_t decode_scratch_bytes(int max_tokens, int K, int E, int I, int X, int& max_pairs, int& dec_tokens);

// Which MXFP4 kernel moe_decode_experts runs (bf16 experts always take the register one); all give the same
// bits. Reg: dec_kernel, the next chunk's weights double-buffered in registers (128 registers at 8 pairs per
// tile: 2 blocks per SM). Ring / Ring4: dec_ring_kernel, half the rows per warp and the next chunks' weights in
// a shared-memory cp.async ring: 2 chunks ahead in 3 blocks per SM, or 1 ahead in 4. The default comes from
// K3_MOE_DEC_VARIANT=reg|ring|ring4 in the environment, read once (Ring when unset or unknown).
enum class DecVariant : int { Reg = 0, Ring = 1, Ring4 = 2 };
DecVariant moe_decode_variant();
// Overrides the environment for the whole process from the next launch on (tests, A/B timing in one binary).
void moe_decode_set_variant(DecVariant v);

// The folded launches (session 49; the default): the gate/up kernel converts x to its bf16 halves while staging it (no
// act_prep launch), and the down kernel sums the gate/up partials and applies the GLU while staging h (no glu_finish
// launch) where moe_dec_folds_glu says so and the scratch holds both kernels' partials (the down kernel's then sit
// after the gate/up ones; else the GLU launch stays). The same steps in the same order: the same bits
// (CudaMoe.DecodeFoldGivesTheSameBits). K3_MOE_DEC_FOLD=0 keeps the separate launches; tests force either (nullopt:
// back to the environment's).
bool moe_dec_fold_enabled();
// Whether the fold covers the GLU for `pairs` (token, expert) pairs of experts I wide into X: while pairs x I x the
// down kernel's row blocks <= 131072 GLU evaluations -- each down row block redoes its K range's GLU (Kimi-Linear at
// one token, not K3). The row blocks counted are the ring kernel's (the MXFP4 rule); dec_kernel has half as many.
bool moe_dec_folds_glu(int pairs, int I, int X);
void force_moe_dec_fold_for_testing(std::optional<bool> on);

// Runs the experts of n tokens after plan_kernel cut tiles of `tok` (8 or 16) pairs. out [n][X] overwritten.
// mx: w holds MXFP4 experts (else bf16), as moe_experts decided from w.format.
cudaError_t moe_decode_experts(const ExpertBank& w, bool mx, int n, int K, int tok, const float* x, const int32_t* sorted,
                               const int32_t* slot_of, const int4* tiles, const int32_t* num_tiles, int tiles_bound,
                               const float* topk_w, GluAct act, float beta, float lbeta, bool split, float* out,
                               const DecodeScratch& s, cudaStream_t stream);

// The bf16 experts' decode path since session 8 (moe_skinny.cu): per tile of `tok` (8 or 16) pairs of one
// expert, the 8 warps of a block split K and finish their rows (GLU fused into gate/up), no split-K
// partials; same arguments and scratch as moe_decode_experts. K3_MOE_SKINNY=0 in the environment keeps the
// session-4 kernels and Auto rule for bf16 (A/B in one binary).
bool moe_skinny_supported(const ExpertBank& w, int tok);
bool moe_skinny_enabled();
cudaError_t moe_skinny_experts(const ExpertBank& w, int n, int K, int tok, const float* x, const int32_t* sorted,
                               const int32_t* slot_of, const int4* tiles, const int32_t* num_tiles, int tiles_bound,
                               const float* topk_w, GluAct act, float beta, float lbeta, bool split, float* out,
                               const DecodeScratch& s, cudaStream_t stream);

// out[t] = sum over k in rank order of topk_w[t][k] * (sum over `splits` partials of y[slot_of[t][k]]), each
// partial [P][X] at part + split * split_stride; slot < 0 skipped. The one combine of both MoE paths (the
// tiled path passes splits = 1). X % 4 == 0, K <= 32. Two kernels, the same bits: a block per (token, 128 columns)
// for decode-sized n, a block per token with 8 slots' loads in flight a thread from kCombineRowsMinTokens tokens
// (prefill: 1.6x the bandwidth there).
constexpr int kCombineRowsMinTokens = 512;
cudaError_t moe_combine(int n, int X, int K, const float* part, int64_t split_stride, int splits, const int32_t* slot_of,
                        const float* topk_w, float* out, cudaStream_t stream);
// The same for CUTLASS's merged Bf16x2 rows (moe_grouped_gemm.h): slot s of expert e (off[e] <= s < off[e + 1]) has its
// two partials at rows s + off[e] and s + off[e + 1] of `part` ([2 P][X]); summed as moe_combine's two splits (the same
// bits). off: the plan's [E + 1] expert offsets.
cudaError_t moe_combine_merged(int n, int X, int K, int E, const float* part, const int32_t* off, const int32_t* slot_of,
                               const float* topk_w, float* out, cudaStream_t stream);
// One split of bf16 partials (bf16 bits [P][X], X % 8 == 0), each widened to fp32 and summed as moe_combine's.
cudaError_t moe_combine_bf16(int n, int X, int K, const uint16_t* part, const int32_t* slot_of, const float* topk_w,
                             float* out, cudaStream_t stream);

}  // namespace k3::cuda
