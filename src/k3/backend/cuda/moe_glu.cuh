// The expert GLU activations on the device (cpu::silu_glu / cpu::situ_glu), shared by the MoE kernels.
#pragma once
#include "k3/backend/cuda/moe_kernels.h"

namespace k3::cuda::moe_dev {

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + expf(-g)); }

__device__ __forceinline__ float glu(float g, float u, GluAct act, float beta, float lbeta) {
  if (act == GluAct::SiTU) return beta * tanhf(g / beta) * sigmoid_f(g) * (lbeta * tanhf(u / lbeta));
  return g / (1.0f + expf(-g)) * u;
}

}  // namespace k3::cuda::moe_dev
