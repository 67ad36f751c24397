// CudaBackend's MLA ops (model-spec 3.3) over the paged latent cache (mla_kernels.h): the absorbed form
// for decode-form tokens (small batches on custom kernels, larger ones on batched SGEMMs; the column-major
// mapping is in docs/kernels-cuda.md), the MHA form per prefill-form sequence on cuBLAS.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/mla_prefill_flash.h"

namespace k3::cuda {

using graph::Tensor;

void CudaBackend::mla_write_latents(int64_t layer, const graph::MlaDims&, Tensor lat) {
  prof_.begin("mla attn", stream_);
  K3_CUDA_CHECK(mla_write_rows(paging(layer), static_cast<int>(lat.rows), lat.f(), stream_));
  prof_.end(stream_);
}

void CudaBackend::mla_absorb_q(const MlaWeights& w, const graph::MlaDims& d, Tensor q, Tensor ql) {
  const int N = static_cast<int>(q.rows), nh = static_cast<int>(d.heads), dn = static_cast<int>(d.nope),
            dr = static_cast<int>(d.rope), dv = static_cast<int>(d.value), kr = static_cast<int>(d.rank);
  const int qk = dn + dr, cd = kr + dr;
  prof_.begin("mla attn", stream_);
  // q_lat[t][h][0:kr] = W_UK_h^T q_nope[t][h]
  if (N <= kMlaSmallBatch) {  // the rope part too
    K3_CUDA_CHECK(cuda::mla_absorb_q(q.f(), w.kv_b.data(), N, nh, dn, dr, dv, kr, ql.f(), stream_));
  } else {
    const float one = 1.f, zero = 0.f;
    check_cublas(cublasSgemmStridedBatched(lin_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, kr, N, dn, &one, w.kv_b.data(), kr,
                                           static_cast<long long>(dn + dv) * kr, q.f(), nh * qk, qk, &zero, ql.f(), nh * cd, cd,
                                           nh),
                 "q absorption");
    K3_CUDA_CHECK(mla_copy_qpe(q.f(), N, nh, dn, dr, kr, ql.f(), stream_));
  }
  prof_.end(stream_);
}

void CudaBackend::mla_attend_latent(int64_t layer, const graph::MlaDims& d, Tensor ql, float scale, Tensor ol) {
  prof_.begin("mla attn", stream_);
  MlaPaging pg = paging(layer);
  pg.tok_index = sd_.n_dec_tokens == ql.rows ? nullptr : staged<const int32_t>(sd_.dec_tokens);
  K3_CUDA_CHECK(cuda::mla_attend_latent(pg, sd_.n_dec_tokens, static_cast<int>(d.heads), ql.f(), scale, ol.f(),
                                        mla_ws_.get<float>(), stream_));
  prof_.end(stream_);
}

void CudaBackend::mla_up_v(const MlaWeights& w, const graph::MlaDims& d, Tensor ol, Tensor o) {
  const int N = static_cast<int>(ol.rows), nh = static_cast<int>(d.heads), dn = static_cast<int>(d.nope),
            dv = static_cast<int>(d.value), kr = static_cast<int>(d.rank);
  prof_.begin("mla attn", stream_);
  // o[t][h] = W_UV_h o_lat[t][h]
  if (N <= kMlaSmallBatch) {
    K3_CUDA_CHECK(cuda::mla_up_v(ol.f(), w.kv_b.data(), N, nh, dn, dv, kr, o.f(), stream_));
  } else {
    const float one = 1.f, zero = 0.f;
    check_cublas(cublasSgemmStridedBatched(lin_->cublas(), CUBLAS_OP_T, CUBLAS_OP_N, dv, N, kr, &one,
                                           w.kv_b.data() + static_cast<int64_t>(dn) * kr, kr,
                                           static_cast<long long>(dn + dv) * kr, ol.f(), nh * kr, kr, &zero, o.f(), nh * dv, dv,
                                           nh),
                 "v up-projection");
  }
  prof_.end(stream_);
}

void CudaBackend::mla_attend_mha(int64_t layer, const MlaWeights& w, const graph::MlaDims& d, Tensor q, float scale,
                                 Tensor o) {
  prof_.begin("mla attn", stream_);
  const MlaPaging pg = paging(layer);
  for (size_t i = 0; i < plan_->seqs.size(); ++i) {
    const graph::StepSeq& s = plan_->seqs[i];
    if (s.prefill_form) mla_prefill_mha(w, d, pg, static_cast<int>(i), s.offset, s.n, s.past, q.f(), scale, o.f());
  }
  prof_.end(stream_);
}

namespace {

// C = alpha op(A) op(B) + beta C over `batch` strided fp32 matrices (column-major, cuBLAS's terms): true fp32
// (SIMT FFMA) by default; with `tf32` the tensor cores on TF32-rounded inputs (10-bit mantissa, fp32
// accumulation), what `--gemm-precision bf16` asks for: it already rounds the projections' inputs to bf16.
void sgemm_batched(cublasHandle_t h, bool tf32, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* alpha,
                   const float* A, int lda, long long sa, const float* B, int ldb, long long sb, const float* beta, float* C,
                   int ldc, long long sc, int batch, const char* what) {
  if (!tf32) {
    check_cublas(cublasSgemmStridedBatched(h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch), what);
    return;
  }
  check_cublas(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, CUDA_R_32F, lda, sa, B, CUDA_R_32F, ldb, sb, beta, C,
                                          CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
               what);
}

// The fused kernel (mla_prefill_flash.h) for the attention after the expansion, by default: 2.0x the SGEMM form's
// MLA time at Kimi-Linear dims and 2.5x at K3 dims, pp4096 +11% / +6% (call s41-3, H200), rel 4.5e-6 against it.
// K3_MLA_PREFILL=fp32 keeps the SGEMM form (A/B runs; a test switches it per prefill, so it is read each time).
// Under --gemm-precision bf16 the kernel's products are plain bf16 (session 58).
bool mha_flash_wanted() {
  const char* e = std::getenv("K3_MLA_PREFILL");
  return e == nullptr || std::strcmp(e, "fp32") != 0;
}
// K3_MLA_PREFILL=x2 keeps the hi / lo products under --gemm-precision bf16 too (the A/B of the bf16 form).
bool mha_flash_x2_forced() {
  const char* e = std::getenv("K3_MLA_PREFILL");
  return e != nullptr && std::strcmp(e, "x2") == 0;
}

}  // namespace

// One sequence's n new tokens at positions past .. past+n-1: k_nope / v for all S = past + n cached tokens
// are expanded from the latents (one SGEMM), then the fused attention kernel (mla_prefill_flash.h: hi / lo bf16
// tensor-core products, ~16 mantissa bits; plain bf16 products under --gemm-precision bf16) where it supports the
// shape, else per query chunk the scores (two batched SGEMMs: the nope part + the shared rope-slot part), a causal
// softmax, and P.V. That fallback is fp32 throughout
// (the CPU reference uses the same form for prefill; TF32 tensor cores under --gemm-precision bf16). Writes rows
// [offset, offset + n) of out. A chunk of queries ending at position past + t0 + tq - 1 sees only the first
// past + t0 + tq keys, so its scores, softmax and P.V stop there (causal trimming: half the work of a prefill from
// position 0; the scores are laid out [nh][tq][keys seen]).
void CudaBackend::mla_prefill_mha(const MlaWeights& w, const graph::MlaDims& d, const MlaPaging& pg, int seq,
                                  int64_t offset, int64_t n, int64_t past, const float* q, float scale, float* out) {
  const int nh = static_cast<int>(d.heads), dn = static_cast<int>(d.nope), dr = static_cast<int>(d.rope),
            dv = static_cast<int>(d.value), kr = static_cast<int>(d.rank);
  const int qk = dn + dr, cd = kr + dr, Rw = nh * (dn + dv);
  const int64_t S = past + n;
  const int64_t budget = int64_t{64} << 20;  // floats of scores per chunk (256 MiB)
  const bool flash = mha_flash_wanted() && mla_prefill_flash_supports(dn, dr, dv);
  const int64_t Tq = flash ? 0 : std::max<int64_t>(1, std::min<int64_t>(n, budget / (int64_t{nh} * S)));
  const size_t need = static_cast<size_t>(S * cd + S * Rw + int64_t{nh} * Tq * S) * 4;
  if (mha_ws_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued work may still use the old buffer
    mha_ws_ = DeviceBuffer(need + need / 4);
  }
  float* Lc = mha_ws_.get<float>();
  float* KV = Lc + S * cd;
  float* sc = KV + S * Rw;
  K3_CUDA_CHECK(mla_gather_latents(pg, seq, static_cast<int>(S), Lc, stream_));
  const float one = 1.f, zero = 0.f;
  cublasHandle_t hb = lin_->cublas();
  const bool tf32 = gemm_bf16_;
  sgemm_batched(hb, tf32, CUBLAS_OP_T, CUBLAS_OP_N, Rw, static_cast<int>(S), kr, &one, w.kv_b.data(), kr, 0, Lc, cd, 0, &zero, KV, Rw,
                0, 1, "MLA k/v expansion");
  if (flash) {
    K3_CUDA_CHECK(mla_prefill_flash(q, KV, Lc + kr, cd, nh, dn, dr, dv, offset, n, past, scale, out, stream_,
                                    gemm_bf16_ && !mha_flash_x2_forced()));
    return;
  }
  for (int64_t t0 = 0; t0 < n; t0 += Tq) {
    const int tq = static_cast<int>(std::min<int64_t>(Tq, n - t0));
    const int keys = static_cast<int>(past + t0 + tq);  // the keys this chunk's last query sees
    const float* Q = q + (offset + t0) * nh * qk;
    const long long sstride = static_cast<long long>(tq) * keys;
    sgemm_batched(hb, tf32, CUBLAS_OP_T, CUBLAS_OP_N, keys, tq, dn, &scale, KV, Rw, dn + dv, Q, nh * qk, qk, &zero, sc, keys, sstride,
                  nh, "MLA scores (nope)");
    sgemm_batched(hb, tf32, CUBLAS_OP_T, CUBLAS_OP_N, keys, tq, dr, &scale, Lc + kr, cd, 0, Q + dn, nh * qk, qk, &one, sc, keys,
                  sstride, nh, "MLA scores (rope slot)");
    K3_CUDA_CHECK(mla_causal_softmax(sc, nh, tq, keys, static_cast<int>(past + t0), stream_));
    sgemm_batched(hb, tf32, CUBLAS_OP_N, CUBLAS_OP_N, dv, tq, keys, &one, KV + dn, Rw, dn + dv, sc, keys, sstride, &zero,
                  out + (offset + t0) * nh * dv, nh * dv, dv, nh, "MLA P.V");
  }
}

}  // namespace k3::cuda
