// The block drafter's tensors (docs/block-drafter.md, "Files"), bound by name from its model.safetensors
// and checked against its config: matrices stay views into the mapping (BF16, F16 or F32), norm weights
// and embeddings become fp32 vectors. The target's token embedding and lm_head, which the drafter reuses,
// are views of the target's weights, set by the loader (block_drafter.h).
#pragma once
#include <cstdint>
#include <vector>

#include "k3/core/weight.h"
#include "k3/io/safetensors.h"
#include "k3/model/drafter/drafter_config.h"

namespace k3::drafter {

struct DrafterLayerWeights {
  WeightVector attn_norm, mlp_norm;         // [H]
  WeightMatrix q, k, v;                     // [nh * hd][H]
  WeightMatrix o;                           // [H][nh * hd]
  WeightMatrix gate, up;                    // [I][H]
  WeightMatrix down;                        // [H][I]
};

struct DrafterWeights {
  WeightMatrix context_proj;                // [H][T * H]
  WeightMatrix input_proj;                  // [H][2H]
  WeightVector context_norm, embed_norm, final_norm;  // [H]
  WeightVector mask_embedding;              // [H]
  WeightVector position_embedding;          // [block_size * H]
  std::vector<DrafterLayerWeights> layers;
  WeightMatrix target_embed, target_lm_head;  // the target's [V][H] (views; set by the loader)
  std::vector<std::vector<uint8_t>> aligned_copies;  // WeightBinder's copies of misaligned tensors
};

// Throws k3::Error listing every missing / mis-shaped / mis-typed tensor (with the file's name).
DrafterWeights bind_drafter_weights(const DrafterConfig& c, const Checkpoint& ckpt);

}  // namespace k3::drafter
