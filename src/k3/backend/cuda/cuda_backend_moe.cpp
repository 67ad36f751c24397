// CudaBackend's MoE ops (model-spec 3.4): routing on the GPU and the grouped expert kernels over the
// layer's stacked experts (moe_kernels.h).
#include "k3/backend/cuda/cuda_backend.h"
#include "k3/core/error.h"

namespace k3::cuda {

using graph::Tensor;

void CudaBackend::moe_route(Tensor logits, const float* bias, const graph::RouteParams& p, Tensor idx, Tensor wts) {
  prof_.begin("moe route", stream_);
  K3_CUDA_CHECK(cuda::moe_route(static_cast<int>(logits.rows), static_cast<int>(logits.cols), static_cast<int>(p.top_k),
                                logits.f(), bias, p.renormalize, p.scale, idx.i(), wts.f(), stream_));
  prof_.end(stream_);
}

void CudaBackend::moe_experts(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& p,
                              Tensor out) {
  if (w.stacked.empty()) {  // placed on the host (--cpu-moe): streamed to the GPU, or computed there
    if (stream_host_experts(w, x, idx, wts, p, out)) return;
    host_moe_start(w, x, idx, wts, p, out);
    return host_moe_finish();
  }
  prof_.begin("moe experts", stream_);
  // GGUF block experts too: moe_experts picks their kernels (quant_moe.h quant_moe_choice)
  K3_CUDA_CHECK(cuda::moe_experts(w.stacked, static_cast<int>(x.rows), static_cast<int>(idx.cols), x.f(), idx.i(), wts.f(),
                                  p.situ ? GluAct::SiTU : GluAct::SiLU, p.beta, p.linear_beta, out.f(), *moe_ws_, stream_,
                                  gemm_bf16_ ? MoePrecision::Bf16 : MoePrecision::Bf16x2));
  prof_.end(stream_);
}

}  // namespace k3::cuda
