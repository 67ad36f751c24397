// The expert residency manager (runtime/expert_residency.h) over a model's host-resident routed experts: the
// CPU model's every expert, or a GPU model's experts placed on the host (--cpu-moe, --n-cpu-moe, -ot), whose
// CPU jobs (cuda_backend_host.cpp) then count hits, prefetch and pin exactly as the CPU model's do.
#pragma once
#include <memory>

#include "k3/io/safetensors.h"
#include "k3/model/weights.h"
#include "k3/runtime/expert_residency.h"

namespace k3 {

// Null when `opt` turns it off or no routed expert's stored bytes are read on the host. Layers whose experts live on
// a device, or are read wholly from the CPU's copies (WeightMatrix::tiled, backend/cpu/decode_layout.h: their stored
// pages released), are not registered; a copied matrix's bytes are not counted as an expert's. The automatic hot-set
// budget pins nothing when the host-resident part of the checkpoint fits in half the available memory: the page cache
// keeps all of it anyway.
std::unique_ptr<ExpertResidency> make_expert_residency(const ModelWeights& w, const Checkpoint& ck,
                                                       ExpertResidencyOptions opt);

}  // namespace k3
