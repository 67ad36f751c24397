// CudaBackend's KDA ops (model-spec 3.2) over kda_kernels.h; a decode step takes the fused kernel.
#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/kda_chunked_tc.h"
#include "k3/backend/cuda/kda_kernels.h"

namespace k3::cuda {

using graph::Tensor;

void CudaBackend::kda_conv_l2norm(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, Tensor pq, Tensor pk,
                                  Tensor pv, Tensor q, Tensor k, Tensor v) {
  K3_CUDA_CHECK(cuda::kda_conv_l2norm(staged<const KdaSeq>(sd_.kda_all[static_cast<size_t>(layer)]), static_cast<int>(n_seqs_),
                                      static_cast<int>(pq.rows), static_cast<int>(d.heads), static_cast<int>(d.head_dim),
                                      static_cast<int>(d.conv), pq.f(), pk.f(), pv.f(), w.q_conv.data(), w.k_conv.data(),
                                      w.v_conv.data(), q.f(), k.f(), v.f(), stream_));
}

void CudaBackend::kda_gates(const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate, Tensor g,
                            Tensor beta) {
  K3_CUDA_CHECK(cuda::kda_gates(static_cast<int>(g.rows), static_cast<int>(d.heads), static_cast<int>(d.head_dim), g.f(),
                                w.dt_bias.data(), w.A_log.data(), gate.bounded, gate.lower_bound, beta.f(), stream_));
}

void CudaBackend::kda_recurrence(int64_t layer, const graph::KdaDims& d, Tensor q, Tensor k, Tensor v, Tensor g,
                                 Tensor beta, Tensor o) {
  const size_t li = static_cast<size_t>(layer);
  const int Hk = static_cast<int>(d.heads), D = static_cast<int>(d.head_dim);
  if (sd_.n_rec > 0)
    K3_CUDA_CHECK(cuda::kda_recurrent_typed(staged<const KdaSeq>(sd_.kda_rec[li]), sd_.n_rec, Hk, D, q.f(), k.f(), v.f(),
                                            g.f(), beta.f(), o.f(), spec_.kda_state_dtype, stream_));
  if (sd_.n_chk > 0 && kda_tc_)  // bf16 GEMM mode: tensor cores (chunk 32 or 64)
    K3_CUDA_CHECK(cuda::kda_chunked_tc(staged<const KdaSeq>(sd_.kda_chk[li]), sd_.n_chk, static_cast<int>(q.rows), Hk, D,
                                       sd_.kda_chunk == 64 ? 64 : 32, KdaInType::F32, q.f(), k.f(), v.f(), g.f(), beta.f(),
                                       o.f(), nullptr, KdaTcTuning{}, kda_ws_.get(), kda_ws_.bytes(), stream_));
  else if (sd_.n_chk > 0)
    K3_CUDA_CHECK(cuda::kda_chunked(staged<const KdaSeq>(sd_.kda_chk[li]), sd_.n_chk, static_cast<int>(q.rows), Hk, D,
                                    sd_.kda_chunk, q.f(), k.f(), v.f(), g.f(), beta.f(), o.f(), kda_ws_.get(),
                                    kda_ws_.bytes(), stream_));
}

void CudaBackend::kda_output_gate(const KdaWeights& w, const graph::KdaDims& d, float eps, Tensor o, Tensor gate) {
  K3_CUDA_CHECK(cuda::kda_output_gate(static_cast<int>(o.rows), static_cast<int>(d.heads), static_cast<int>(d.head_dim), o.f(),
                                      w.o_norm.data(), eps, gate.f(), stream_));
}

void CudaBackend::kda_mix(int64_t layer, const KdaWeights& w, const graph::KdaDims& d, const graph::KdaGate& gate,
                          float eps, Tensor pq, Tensor pk, Tensor pv, Tensor graw, Tensor braw, Tensor gate_proj,
                          Tensor o) {
  prof_.begin("kda core", stream_);
  if (plan_->all_decode()) {
    K3_CUDA_CHECK(kda_decode_fused_typed(staged<const KdaSeq>(sd_.kda_all[static_cast<size_t>(layer)]), static_cast<int>(n_seqs_),
                                   static_cast<int>(d.heads), static_cast<int>(d.head_dim), static_cast<int>(d.conv), pq.f(),
                                   pk.f(), pv.f(), w.q_conv.data(), w.k_conv.data(), w.v_conv.data(), graw.f(),
                                   w.dt_bias.data(), w.A_log.data(), gate.bounded, gate.lower_bound, braw.f(), gate_proj.f(),
                                   w.o_norm.data(), eps, o.f(), spec_.kda_state_dtype, stream_));
  } else {
    Backend::kda_mix(layer, w, d, gate, eps, pq, pk, pv, graw, braw, gate_proj, o);
  }
  prof_.end(stream_);
}

}  // namespace k3::cuda
