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

// One sequence's tokens inside a batch: rows [offset, offset+n) of the activations.
struct SeqSpan {
  int64_t offset = 0, n = 0;
  SequenceCache* cache = nullptr;
  bool prefill_form = false;  // chunked KDA + MHA MLA; else recurrent KDA + absorbed MLA
};

// KDA layer over a batch; `kda_index` picks the state in each sequence's cache. The chunked form
// (chunk size `chunk`) is used for sequences with prefill_form, else the token-by-token recurrence.
void kda_layer(const ModelConfig& c, const KdaWeights& w, int64_t kda_index, const float* x, int64_t N,
               const std::vector<SeqSpan>& seqs, int chunk, float* out);

// MLA layer over a batch. Writes the new tokens' latents to each cache (rows n_past .. n_past+n-1),
// then attends: absorbed form over the latent rows, or the MHA form with k/v expanded from them.
void mla_layer(const ModelConfig& c, const MlaWeights& w, int64_t mla_index, const float* x, int64_t N,
               const std::vector<SeqSpan>& seqs, float* out);

// Dense GLU MLP (first layers, shared experts).
void glu_mlp(const ModelConfig& c, const GluMlp& w, const float* x, int64_t n, float* out);

// MoE FFN: sigmoid routing with correction bias, renormalisation and scaling, routed experts
// (in K3's latent space when configured) plus shared experts.
void moe_layer(const ModelConfig& c, const MoeWeights& w, const float* x, int64_t n, float* out);

}  // namespace k3
