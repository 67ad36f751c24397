// Tensor parallel's collectives in the plan's decode bounds (docs/multi-gpu.md, "Collectives per layer" and
// "A model of decode step time"): one fp32 all-reduce after every row-parallel linear, each costing a
// latency (inside a CUDA graph) plus a ring's 2 (P-1)/P x payload over the bus bandwidth. Issue 20's runs
// check this model; `k3 plan --measured FILE` replaces the assumed latency and bandwidth with measured ones.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "k3/model/config.h"
#include "k3/plan/plan.h"

namespace k3::plan {

// All-reduces of one decode step and their payload per token (bytes, fp32): the vocab-parallel embedding,
// every layer's attention o_proj, every dense MLP's down, every MoE's shared + routed sum (and K3's latent
// routed sum before the latent norm). K3: 279 and 6.68 MB; Kimi-Linear-48B: 55 and 0.51 MB.
struct TpCollectives {
  int64_t allreduces = 0;
  double bytes_per_token = 0;
};
TpCollectives tp_collectives(const ModelConfig& c);

// One all-reduce's latency (s) and the ring's bus bandwidth (B/s), and where they came from.
struct CollectiveCosts {
  double latency_s = 0, busbw = 0;
  std::string origin;
};
// Assumed from the device: over NVLink 8 us and 0.4 x the NVLink figure (NCCL's ring on H200 NVLink, ~360
// GB/s); over PCIe 20 us and 0.8 x one direction of the link (25 GB/s when the table has no figure).
CollectiveCosts assumed_collective_costs(const Hardware& hw);

// Seconds of one decode step's all-reduces at TP size P for `tokens` tokens per TP group (0 when P == 1).
double collectives_seconds(const TpCollectives& t, const CollectiveCosts& k, int P, double tokens);

}  // namespace k3::plan
