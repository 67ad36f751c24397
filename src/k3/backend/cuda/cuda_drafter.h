// The block drafter's forward on one GPU (docs/block-drafter.md): drafter_forward (model/drafter) over a
// CudaBackend of its own (its own stream, scratch and staging; sized for hidden_size and the vocabulary, no
// cache), with the drafter's weights uploaded once and the target's token embedding and lm_head shared with
// the target model on the same GPU (`target`: CudaModel::device_weights(); Kimi K3's lm_head alone is 2.3 GB)
// or, without one (a target elsewhere, or those two placed on the host), uploaded as a copy.
#pragma once
#include <memory>

#include "k3/model/drafter/block_drafter.h"
#include "k3/model/weights.h"

namespace k3::cuda {

// A runner for BlockDrafter::set_runner. Throws k3::Error without the device or for a weight format the
// backend lacks (block_attention needs 2 * block_size * head_dim + block_size^2 floats <= 48 KiB).
std::unique_ptr<drafter::DrafterRunner> make_cuda_drafter_runner(const drafter::DrafterConfig& c,
                                                                const drafter::DrafterWeights& host, int device,
                                                                const ModelWeights* target = nullptr);

}  // namespace k3::cuda
