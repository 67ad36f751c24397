// The CPU backend's ops as plain functions over host vectors: the references the kernel tests (CPU and
// CUDA) compare with, run through the same graph builders and CpuBackend ops as the model.
#pragma once
#include <cstdint>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/model/graph/blocks.h"

namespace k3test {

// Block Attention Residuals over m sources [n][H] (the last is the partial sum).
inline void cpu_attn_res_mix(const std::vector<const float*>& sources, const k3::WeightVector& w, int64_t n, int64_t H,
                             float eps, float* out) {
  const int64_t nb = static_cast<int64_t>(sources.size()) - 1;
  std::vector<float> blocks(static_cast<size_t>(std::max<int64_t>(nb, 1) * n * H));
  for (int64_t b = 0; b < nb; ++b)
    std::copy(sources[static_cast<size_t>(b)], sources[static_cast<size_t>(b)] + n * H, blocks.data() + b * n * H);
  std::vector<float> partial(sources.back(), sources.back() + n * H);
  k3::cpu::CpuBackend be;
  be.attn_res_mix(k3::graph::Tensor::f32(blocks.data(), nb * n, H), nb, k3::graph::Tensor::f32(partial.data(), n, H),
                  w.data(), eps, k3::graph::Tensor::f32(out, n, H));
}

// The MoE FFN (routing, routed experts, latent projections, shared experts) for n tokens x [n][H].
// `act`: the routed experts' activation precision (--moe-activation-dtype).
inline void cpu_moe_layer(const k3::ModelConfig& c, const k3::MoeWeights& w, const float* x, int64_t n, float* out,
                          k3::MoeActivationDType act = k3::MoeActivationDType::F32) {
  k3::graph::StepPlan plan;
  k3::cpu::CpuBackend be;
  be.set_moe_activation_dtype(act);
  be.begin_step(plan);
  std::vector<float> xin(x, x + n * c.hidden_size);
  k3::graph::moe_block(k3::graph::Ctx{be, c, plan}, w, k3::graph::Tensor::f32(xin.data(), n, c.hidden_size),
                       k3::graph::Tensor::f32(out, n, c.hidden_size));
}

}  // namespace k3test
