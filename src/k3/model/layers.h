// The layer functions of the Kimi K3 / Kimi-Linear forward pass (model-spec section 3), on the CPU
// backend. Activations are fp32 [n][width]; each function writes its output and touches no other
// layer's data.
#pragma once
#include <cstdint>
#include <vector>

#include "k3/model/config.h"
#include "k3/model/sequence_state.h"
#include "k3/model/weights.h"

namespace k3 {

// Block Attention Residuals: softmax over sources of (RMSNorm_noweight(v_i) . w), mixing raw v_i.
void attn_res_mix(const std::vector<const float*>& sources, const AttnResWeights& w, int64_t n, int64_t H, float eps,
                  float* out);

// KDA layer. chunked: chunked (prefill) form with chunk size `chunk`; otherwise token-by-token recurrence.
void kda_layer(const ModelConfig& c, const KdaWeights& w, const float* x, int64_t n, KdaLayerState& st, bool chunked,
               int chunk, float* out);

// MLA layer. Appends the n new tokens' latents to st.cache. absorbed: attention over the latent
// cache (decode form); otherwise the MHA form with k/v expanded from the latents (prefill form).
void mla_layer(const ModelConfig& c, const MlaWeights& w, const float* x, int64_t n, MlaLayerState& st, bool absorbed,
               float* out);

// Dense GLU MLP (first layers, shared experts).
void glu_mlp(const ModelConfig& c, const GluMlp& w, const float* x, int64_t n, float* out);

// MoE FFN: sigmoid routing with correction bias, renormalisation and scaling, routed experts
// (in K3's latent space when configured) plus shared experts.
void moe_layer(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t n, float* out);

}  // namespace k3
