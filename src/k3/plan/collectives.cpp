#include "k3/plan/collectives.h"

namespace k3::plan {

TpCollectives tp_collectives(const ModelConfig& c) {
  TpCollectives t;
  const double H = static_cast<double>(c.hidden_size) * 4, X = static_cast<double>(c.routed_hidden_size) * 4;
  t.allreduces = 1 + c.num_layers;  // embedding, o_proj
  t.bytes_per_token = H * static_cast<double>(1 + c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    ++t.allreduces;  // the dense MLP's down, or the MoE's output (routed + shared)
    t.bytes_per_token += H;
    if (c.is_moe_layer(l) && c.routed_hidden_size > 0) {  // K3's latent MoE: the routed sum before its norm
      ++t.allreduces;
      t.bytes_per_token += X;
    }
  }
  return t;
}

CollectiveCosts assumed_collective_costs(const Hardware& hw) {
  if (hw.nvlink_gb_s && *hw.nvlink_gb_s > 0)
    return {8e-6, 0.4 * *hw.nvlink_gb_s * 1e9, "assumed: 8 us per all-reduce, bus 0.4 x NVLink"};
  const double link = hw.pcie_gb_s && *hw.pcie_gb_s > 0 ? 0.8 * *hw.pcie_gb_s : 25.0;
  return {20e-6, link * 1e9, "assumed: 20 us per all-reduce, bus 0.8 x PCIe"};
}

double collectives_seconds(const TpCollectives& t, const CollectiveCosts& k, int P, double tokens) {
  if (P <= 1 || !(k.busbw > 0)) return 0;
  return static_cast<double>(t.allreduces) * k.latency_s +
         2.0 * (P - 1) / P * t.bytes_per_token * tokens / k.busbw;
}

}  // namespace k3::plan
