#include "k3/model/drafter/drafter_weights.h"

#include <string>

#include "k3/model/weight_binder.h"

namespace k3::drafter {

DrafterWeights bind_drafter_weights(const DrafterConfig& c, const Checkpoint& ckpt) {
  DrafterWeights w;
  WeightBinder b(ckpt, w.aligned_copies);
  const int64_t H = c.hidden_size, A = c.attn_dim(), I = c.intermediate_size;
  w.context_proj = b.mat("context_proj.weight", H, c.ctx_dim());
  w.context_norm = b.vec("context_norm.weight", H);
  w.embed_norm = b.vec("embed_norm.weight", H);
  // Vectors a trainer may save with a leading 1 (an nn.Parameter of shape [1, H]) are accepted either way.
  w.mask_embedding = b.vec("mask_embedding", {{H}, {1, H}});
  w.input_proj = b.mat("input_proj.weight", H, 2 * H);
  w.position_embedding = b.vec("position_embedding", {{c.block_size, H}});
  w.final_norm = b.vec("final_norm.weight", H);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    DrafterLayerWeights& L = w.layers[static_cast<size_t>(i)];
    const std::string p = "layers." + std::to_string(i) + ".";
    L.attn_norm = b.vec(p + "attn_norm.weight", H);
    L.q = b.mat(p + "q_proj.weight", A, H);
    L.k = b.mat(p + "k_proj.weight", A, H);
    L.v = b.mat(p + "v_proj.weight", A, H);
    L.o = b.mat(p + "o_proj.weight", H, A);
    L.mlp_norm = b.vec(p + "mlp_norm.weight", H);
    L.gate = b.mat(p + "gate_proj.weight", I, H);
    L.up = b.mat(p + "up_proj.weight", I, H);
    L.down = b.mat(p + "down_proj.weight", H, I);
  }
  b.check();
  return w;
}

}  // namespace k3::drafter
