// The weights of one model, bound by name from a checkpoint and validated against the config:
// every tensor the config implies must exist with the right shape and dtype, or loading fails
// with a list of what is wrong. Large matrices stay views into the mapped files; small vectors
// (norms, biases, conv taps) are converted to fp32 once.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "k3/core/weight.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/placement.h"

namespace k3 {

struct KdaWeights {
  WeightMatrix q, k, v, f_a, f_b, b, g, g_a, g_b, o;
  WeightVector q_conv, k_conv, v_conv;  // [C][W]
  WeightVector dt_bias;                 // [C]
  WeightVector A_log;                   // [Hk]
  WeightVector A_exp;                   // [Hk] exp(A_log): what the CPU's gate reads (a GGUF stores -exp(A_log))
  WeightVector o_norm;                  // [head_dim]
};

// The name under which a checkpoint adapter offers a KDA layer's -exp(A_log) when that is what it holds
// (GGUF's ssm_a): <layer prefix>self_attn.A_log.neg_exp, [Hk] fp32; the binder then takes exp(A_log) from it
// exactly and A_log = log(-value) for backends that want the logarithm.
inline constexpr const char* kNegExpALogName = "A_log.neg_exp";

struct MlaWeights {
  WeightMatrix q_a, q_b, q, kv_a, o, g;
  WeightVector q_a_norm, kv_a_norm;
  WeightVector kv_b;      // fp32 copy [heads*(nope+v)][kv_lora_rank]: used by both attention forms
  WeightMatrix kv_b_f32;  // view over kv_b
  WeightMatrix kv_b_stored;  // the checkpoint's kv_b (bf16 on K3): what the CPU's absorbed decode form reads
  // A GGUF's quantised kv_b halves as stored (kv_b above is then their fp32 rebuild), else empty: attn_k_b
  // [heads * kv_lora_rank][nope] (each head's key rows transposed), attn_v_b [heads * v][kv_lora_rank]. The CPU's
  // absorbed decode reads these (3-4x fewer bytes than the fp32 copy); `k3 convert` writes them back as stored.
  WeightMatrix k_b_blocks, v_b_blocks;
};

// The names under which a GGUF adapter offers the quantised kv_b halves, after a layer's "self_attn." prefix.
inline constexpr const char* kKvbKeyBlocksName = "attn_k_b.weight";
inline constexpr const char* kKvbValueBlocksName = "attn_v_b.weight";

struct GluMlp {
  WeightMatrix gate, up, down;
};

struct MoeWeights {
  WeightMatrix router;
  WeightVector correction_bias;  // [E]
  std::vector<GluMlp> experts;   // w1 = gate, w3 = up, w2 = down (may be empty where `stacked` is set)
  ExpertStack stacked;           // the same experts stacked, where a backend prepared them (CUDA)
  GluMlp shared;                       // empty when num_shared_experts == 0
  WeightMatrix latent_down, latent_up;  // K3 LatentMoE
  WeightVector latent_norm;
};

struct AttnResWeights {
  WeightVector w;  // w_norm * w_proj, precombined (model-spec 3.1)
  bool empty() const { return w.empty(); }
};

struct LayerWeights {
  bool is_kda = false, is_moe = false;
  WeightVector input_norm, post_attn_norm;
  AttnResWeights attn_res, mlp_res;
  KdaWeights kda;
  MlaWeights mla;
  GluMlp mlp;
  MoeWeights moe;
};

struct ModelWeights {
  WeightMatrix embed;  // [V][H]
  WeightMatrix lm_head;
  WeightVector final_norm;
  AttnResWeights out_res;
  std::vector<LayerWeights> layers;
  // Copies of float tensors whose data is not aligned to their element size in the file (safetensors
  // does not require alignment); everything else stays a view into the mapping.
  std::vector<std::vector<uint8_t>> aligned_copies;
  int64_t bound_bytes = 0;   // bytes of all bound tensors
  int64_t unused_tensors = 0;  // tensors in the checkpoint the text model does not use (vision etc.)
};

// Calls fn(matrix) for every matrix of the model (embeddings, head, projections, experts).
void for_each_matrix(const ModelWeights& w, const std::function<void(const WeightMatrix&)>& fn);
// Every matrix but the routed experts' (the token table and the head included), mutable: for a backend's second
// copies in its own layout (backend/cpu/decode_layout.h).
void for_each_dense_matrix(ModelWeights& w, const std::function<void(WeightMatrix&)>& fn);
// The same walk, read-only (a head tied to the token table visited as a matrix of its own here too).
void for_each_dense_matrix(const ModelWeights& w, const std::function<void(const WeightMatrix&)>& fn);
// Bytes of the matrices whose home is `device` (kHostDevice: the host).
int64_t matrix_bytes_on(const ModelWeights& w, int device);

// Throws k3::Error listing every missing / mis-shaped / mis-typed tensor (with file names). Every matrix's
// `device` is its home: `placement`'s answer for its name (model/placement.h), else `model_device`; the
// views still point into the host mapping (a backend's upload moves what it owns).
ModelWeights bind_weights(const ModelConfig& cfg, const Checkpoint& ckpt, const Placement* placement = nullptr,
                          int model_device = kHostDevice);

}  // namespace k3
