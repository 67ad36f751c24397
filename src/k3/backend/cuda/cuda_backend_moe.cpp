// CudaBackend's MoE ops (model-spec 3.4): routing on the GPU and the grouped expert kernels over the
// layer's stacked experts (moe_kernels.h).
#include "k3/backend/cuda/cuda_backend.h"
#include "k3/core/error.h"

#include <limits>

namespace k3::cuda {

using graph::Tensor;

void CudaBackend::set_moe_activation_dtype(MoeActivationDType t) {
  if (t == MoeActivationDType::Q8)
    throw Error("--moe-activation-dtype q8: the CUDA backend has no q8 expert kernels yet (the CPU backend runs it; "
                "float32 or mxfp8 on the GPU)");
  moe_act_ = t;
}

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
                                  moe_precision()));
  prof_.end(stream_);
}

// The shared expert as one more pair of the routed experts' batch-1 GEMV kernels (moe_kernels.h): bf16 shared
// matrices of the experts' shape, every weight on this device (not --cpu-moe), the GEMV path for n tokens.
bool CudaBackend::moe_fuses_shared(const MoeWeights& w, int64_t n) const {
  const GluMlp& s = w.shared;
  // (Not under --moe-activation-dtype mxfp8: the fused GEMVs read x as it is.)
  if (w.stacked.empty() || !moe_ws_ || n > std::numeric_limits<int>::max() || moe_act_ != MoeActivationDType::F32) return false;
  for (const WeightMatrix* m : {&s.gate, &s.up, &s.down})
    if (m->empty() || m->format != WeightFormat::BF16 || m->device == kHostDevice) return false;
  if (s.up.rows != s.gate.rows || s.up.cols != s.gate.cols) return false;
  return moe_shared_fusable(w.stacked, s.gate.rows, s.gate.cols, s.down.rows, s.down.cols, static_cast<int>(n), *moe_ws_);
}

void CudaBackend::moe_experts_with_shared(const MoeWeights& w, Tensor x, Tensor idx, Tensor wts, const graph::GluParams& p,
                                          Tensor out) {
  prof_.begin("moe experts", stream_);
  K3_CUDA_CHECK(cuda::moe_experts_with_shared(w.stacked, w.shared.gate.data, w.shared.up.data, w.shared.down.data,
                                              static_cast<int>(x.rows), static_cast<int>(idx.cols), x.f(), idx.i(),
                                              wts.f(), p.situ ? GluAct::SiTU : GluAct::SiLU, p.beta, p.linear_beta,
                                              out.f(), *moe_ws_, stream_));
  prof_.end(stream_);
}

}  // namespace k3::cuda
