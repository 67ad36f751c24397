// The model's weights in device memory: uploaded once from the bound checkpoint (BF16 matrices as
// they are, fp32 ones as fp32, MXFP4 routed experts kept packed, each layer's experts stacked into one
// ExpertBank), or generated on the device for --load-format dummy. Small vectors (norms, conv taps,
// biases) are fp32. Everything lives in a few large allocations (DeviceArena).
#pragma once
#include <cstdint>
#include <vector>

#include "k3/backend/cuda/cuda_util.h"
#include "k3/backend/cuda/linear.h"
#include "k3/backend/cuda/moe_kernels.h"
#include "k3/model/config.h"
#include "k3/model/weights.h"

namespace k3::cuda {

// Bump allocator over 1 GiB chunks (or one larger chunk for a larger tensor); 256-byte alignment.
class DeviceArena {
 public:
  void* alloc(size_t bytes);
  size_t bytes() const { return used_; }

 private:
  std::vector<DeviceBuffer> chunks_;
  size_t off_ = 0, used_ = 0;
};

struct DKda {
  DeviceLinear q, k, v, f_a, f_b, b, g, g_a, g_b, o;
  const float *q_conv = nullptr, *k_conv = nullptr, *v_conv = nullptr, *dt_bias = nullptr, *A_log = nullptr,
              *o_norm = nullptr;
};
struct DMla {
  DeviceLinear q_a, q_b, q, kv_a, o, g;
  const float *q_a_norm = nullptr, *kv_a_norm = nullptr;
  const float* kv_b = nullptr;  // fp32 [nh*(dn+dv)][kr]
};
struct DGlu {
  DeviceLinear gate, up, down;
};
struct DMoe {
  DeviceLinear router;
  const float* bias = nullptr;
  ExpertBank experts;
  DGlu shared;
  DeviceLinear latent_down, latent_up;
  const float* latent_norm = nullptr;
};
struct DLayer {
  bool is_kda = false, is_moe = false;
  const float *input_norm = nullptr, *post_attn_norm = nullptr;
  const float *attn_res = nullptr, *mlp_res = nullptr;  // AttnRes w (null without AttnRes)
  DKda kda;
  DMla mla;
  DGlu mlp;
  DMoe moe;
};

struct DeviceWeights {
  DeviceArena arena;
  const uint16_t* embed = nullptr;  // bf16 [V][H]
  DeviceLinear lm_head;
  const float* final_norm = nullptr;
  const float* out_res = nullptr;
  std::vector<DLayer> layers;
};

// Copies every bound tensor to the device (synchronous). Throws k3::Error on what the backend lacks.
void upload_weights(const ModelWeights& w, DeviceWeights& out);
// Random weights of the config's shapes, generated on the device (deterministic in `seed`).
void dummy_weights(const ModelConfig& cfg, uint64_t seed, DeviceWeights& out);

}  // namespace k3::cuda
