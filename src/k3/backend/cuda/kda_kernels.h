// KDA (Kimi Delta Attention) kernels for the CUDA backend (model-spec section 3.2). The CPU versions in
// backend/cpu/kda.h and model/kda_layer.cpp are the reference each kernel is checked against.
// Everything fp32; all pointers are device pointers; kernels are enqueued on `stream`, and every call
// returns the launch status (cudaErrorInvalidValue for shapes the kernels do not support).
// Supported head dims D: 32, 64, 128 (the real models use 128). C = H * D channels.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "k3/core/cache_dtype.h"

namespace k3::cuda {

// One sequence's part of a batch: rows [offset, offset + n) of the [N][...] activations, and its state.
// A device array of these is passed to the kernels (built by the caller once per step).
struct KdaSeq {
  float* S;                         // [H][D][D]  S[h][dk][dv], read then overwritten with the new state
                                    // (the *_typed calls with a BF16 state: bf16 bits, cast to float*)
  float* conv_q, *conv_k, *conv_v;  // [C][W-1]   previous W-1 inputs of each short conv, oldest first
  int32_t offset, n;
};

// Short causal depthwise conv + SiLU on the q/k/v projections (cpu::short_conv_silu semantics, conv state
// read and updated per sequence), then per-head L2 normalisation of q (times 1/sqrt(D)) and of k
// (x / sqrt(sum x^2 + 1e-6), as model/kda_layer.cpp). v gets conv + SiLU only.
//   xq, xk, xv: [N][C] projections;  wq, wk, wv: [C][W] conv taps (tap W-1 = current token)
//   q, k, v:    [N][C] outputs (may not alias the inputs)
cudaError_t kda_conv_l2norm(const KdaSeq* seqs, int n_seqs, int N, int H, int D, int W, const float* xq,
                            const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                            float* q, float* k, float* v, cudaStream_t stream);
// The same with q, k, v written as bf16 bits (round to nearest even): kda_chunked_tc's KdaInType::BF16 inputs.
cudaError_t kda_conv_l2norm_bf16(const KdaSeq* seqs, int n_seqs, int N, int H, int D, int W, const float* xq,
                                 const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                                 uint16_t* q, uint16_t* k, uint16_t* v, cudaStream_t stream);

// Gates, in place. g: [N][C] f_b_proj output -> per-channel log decay:
//   z = g + dt_bias[c];  bounded: lower_bound * sigmoid(exp(A_log[h]) * z);  else -exp(A_log[h]) * softplus(z)
//   (softplus(z) = z for z > 20, else log1p(exp(z)))
// beta: [N][H] b_proj output -> sigmoid(beta). g_bf16 (optional, [N][C]): also receives each decay as bf16 bits.
// D a multiple of 4; g (and g_bf16) 16-byte (8-byte) aligned rows.
cudaError_t kda_gates(int N, int H, int D, float* g, const float* dt_bias, const float* A_log, bool bounded,
                      float lower_bound, float* beta, cudaStream_t stream, uint16_t* g_bf16 = nullptr);

// The gated delta rule, token by token over each sequence's rows (cpu::kda_recurrent semantics):
//   S = diag(exp(g_t)) S;  u = beta_t (v_t - S^T k_t);  S += k_t u^T;  o_t = S^T q_t
// q, k, v, g: [N][C]; beta: [N][H]; o: [N][C].
cudaError_t kda_recurrent(const KdaSeq* seqs, int n_seqs, int H, int D, const float* q, const float* k,
                          const float* v, const float* g, const float* beta, float* o, cudaStream_t stream);

// The same with the state stored as `state_dtype` (--mamba-ssm-cache-dtype: F32 or BF16, else
// cudaErrorInvalidValue): each seqs[i].S then points at bf16 bits. The state is widened to fp32 when the
// kernel loads it, the recurrence runs in fp32 exactly as with an fp32 state, and it is rounded to nearest
// even once when stored at the end of the call (cpu::kda_recurrent_typed semantics). F32 = kda_recurrent.
// (kda_chunked has no bf16 variant yet: a prefill with a bf16 state runs kda_recurrent_typed.)
cudaError_t kda_recurrent_typed(const KdaSeq* seqs, int n_seqs, int H, int D, const float* q, const float* k,
                                const float* v, const float* g, const float* beta, float* o, CacheDType state_dtype,
                                cudaStream_t stream);

// Chunked (WY / UT transform) form of the same recurrence for prefill: chunks of `chunk` tokens
// (16, 32 or 64; the last may be partial); same inputs, outputs and final state as kda_recurrent.
// Parallel over chunks (three kernels) with a caller-provided device workspace of at least
// kda_chunked_workspace_bytes(n_total_tokens, n_seqs, H, D, chunk) bytes (16-byte aligned; about
// (4 C + H chunk) floats per row). n_total_tokens = N, the rows of q/k/v/g/o; every sequence's rows lie in
// [0, N) and sequences do not share rows; q, k, v, g, o 16-byte aligned (else cudaErrorInvalidValue).
// Asynchronous; graph-capturable. (kda_chunked_tc.h: the same on tensor cores with bf16-rounded operands,
// taken in --gemm-precision bf16 mode.)
size_t kda_chunked_workspace_bytes(int n_total_tokens, int n_seqs, int H, int D, int chunk);
cudaError_t kda_chunked(const KdaSeq* seqs, int n_seqs, int n_total_tokens, int H, int D, int chunk, const float* q,
                        const float* k, const float* v, const float* g, const float* beta, float* o, void* workspace,
                        size_t workspace_bytes, cudaStream_t stream);

// Output: o = RMSNorm_D(o) * norm_w * sigmoid(gate), per head of D values (eps), in place.
// o, gate: [N][C]; norm_w: [D].
cudaError_t kda_output_gate(int N, int H, int D, float* o, const float* norm_w, float eps, const float* gate,
                            cudaStream_t stream);

// Fused decode step: every sequence has exactly one new token (seqs[i].n == 1, offset == i, N == n_seqs).
// Conv update + SiLU + L2 norm, gates, recurrence and the gated output norm in one launch per layer.
// Inputs are the raw projections (xq, xk, xv, graw = f_b_proj output, braw = b_proj output,
// gate = output-gate projection); writes o [N][C] ready for o_proj. Same results as the unfused kernels.
cudaError_t kda_decode_fused(const KdaSeq* seqs, int n_seqs, int H, int D, int W, const float* xq, const float* xk,
                             const float* xv, const float* wq, const float* wk, const float* wv, const float* graw,
                             const float* dt_bias, const float* A_log, bool bounded, float lower_bound,
                             const float* braw, const float* gate, const float* norm_w, float eps, float* o,
                             cudaStream_t stream);

// The fused kernels' inputs: the raw projections and the layer's weights (as kda_decode_fused's arguments).
struct KdaFusedIn {
  const float *xq, *xk, *xv;             // [N][C] q / k / v projections, before the conv
  const float *wq, *wk, *wv;             // [C][W] conv taps
  const float *graw, *dt_bias, *A_log;   // [N][C] f_b_proj output, [C], [H]
  bool bounded;
  float lower_bound;
  const float *braw, *gate, *norm_w;     // [N][H] b_proj output, [N][C] output-gate projection, [D]
  float eps;
};

// A sequence of a speculative verification step: its rows and live state (seq), and `n_snap` snapshot
// views snaps[first .. first + n_snap) (S and conv tails of the same shapes and dtype; offset / n unused):
// view j receives the state after the sequence's first `after + j` rows (after >= 1, after + n_snap <= n).
struct KdaSnapSeq {
  KdaSeq seq;
  int32_t after, n_snap, first;
};

// kda_decode_fused's arithmetic over each sequence's n >= 1 tokens in order, in one launch per layer: the
// conv tails rolled and the state column kept in registers (rounded to the state dtype after every token,
// as a store and reload between decode steps would), so the outputs, the final state and every snapshot
// are bit-identical to n decode steps of kda_decode_fused_typed (replacing, for a verification step, the
// unfused kernels run piece by piece with state copies between them: 20 launches per layer at k = 4).
cudaError_t kda_verify_fused(const KdaSnapSeq* seqs, int n_seqs, const KdaSeq* snaps, int H, int D, int W,
                             const KdaFusedIn& in, float* o, CacheDType state_dtype, cudaStream_t stream);

// kda_decode_fused with the state stored as `state_dtype` (as kda_recurrent_typed).
cudaError_t kda_decode_fused_typed(const KdaSeq* seqs, int n_seqs, int H, int D, int W, const float* xq,
                                   const float* xk, const float* xv, const float* wq, const float* wk, const float* wv,
                                   const float* graw, const float* dt_bias, const float* A_log, bool bounded,
                                   float lower_bound, const float* braw, const float* gate, const float* norm_w,
                                   float eps, float* o, CacheDType state_dtype, cudaStream_t stream);

}  // namespace k3::cuda
