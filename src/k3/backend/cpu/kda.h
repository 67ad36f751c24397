// KDA (Kimi Delta Attention) recurrence cores on the CPU: the token-by-token gated delta rule
// (decode) and the chunked form (prefill). Both must give the same outputs and final state.
// model-spec.md section 3.2. Everything fp32.
//
// Layouts (row-major, contiguous):
//   q, k, v, g : [T][H][D]   q already L2-normalised and multiplied by 1/sqrt(D); k L2-normalised;
//                           g = per-key-channel log-decay (<= 0) of each token.
//   beta       : [T][H]      in (0, 1)
//   state      : [H][D][D]   S[h][dk][dv]; read as the state before token 0, overwritten with the
//                           state after token T-1.
//   out        : [T][H][D]   o_t = S_t^T q_t
#pragma once
#include "k3/core/cache_dtype.h"

namespace k3::cpu {

void kda_recurrent(int T, int H, int D, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, float* state, float* out);

// Head h of kda_recurrent (what it runs per head: the same bits). S: that head's [D][D] state; scratch: 3 D floats.
void kda_recurrent_head(int T, int H, int D, int h, const float* q, const float* k, const float* v, const float* g,
                        const float* beta, float* S, float* out, float* scratch);

// Chunked (WY / UT-transform) form with chunks of `chunk` tokens; the last chunk may be partial.
void kda_chunked(int T, int H, int D, int chunk, const float* q, const float* k, const float* v,
                 const float* g, const float* beta, float* state, float* out);

// The same two with the state stored as `state_dtype` (--mamba-ssm-cache-dtype: F32 or BF16; FP8 throws
// k3::Error); the recurrence runs in fp32. The token-by-token form rounds the state (to nearest even) after
// every token, as a bf16 cache holds it, so its results do not depend on how tokens are split into calls
// (batch invariance, prefix caching); the chunked form loads the state once and rounds it once at the end
// of the call (the prefill form is not split-invariant anyway). F32 is the fp32 function (bit-identical).
void kda_recurrent_typed(int T, int H, int D, const float* q, const float* k, const float* v, const float* g,
                         const float* beta, void* state, CacheDType state_dtype, float* out);
void kda_chunked_typed(int T, int H, int D, int chunk, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, void* state, CacheDType state_dtype, float* out);

// Head h of kda_recurrent_typed, `state` the whole [H][D][D] state as stored; scratch: 3 D + D * D floats.
void kda_recurrent_head_typed(int T, int H, int D, int h, const float* q, const float* k, const float* v,
                              const float* g, const float* beta, void* state, CacheDType state_dtype, float* out,
                              float* scratch);

// Causal depthwise conv (kernel W, no bias) followed by SiLU, for one projection of C channels.
//   x     : [T][C]  new inputs
//   w     : [C][W]  weights as stored in HF (`*_conv1d.weight` [C,1,W] squeezed), tap W-1 = current token
//   cstate: [C][W-1] the previous W-1 inputs (oldest first); read, then updated to the last W-1 inputs
//   y     : [T][C]
void short_conv_silu(int T, int C, int W, const float* x, const float* w, float* cstate, float* y);
// The few-token form (T <= kShortConvFewTokens) of short_conv_silu over channels [c0, c1) only (c0 a multiple of
// 8): what short_conv_silu runs per chunk of kShortConvChunk channels, so a caller can put several convs' chunks
// (a KDA layer's q, k, v) and per-chunk work after them in one parallel pass; the same bits.
inline constexpr int kShortConvFewTokens = 4, kShortConvChunk = 256;
void short_conv_silu_channels(int T, int C, int W, const float* x, const float* w, float* cstate, float* y, int c0, int c1);

}  // namespace k3::cpu
