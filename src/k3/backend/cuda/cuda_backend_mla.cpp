// CudaBackend's MLA ops (model-spec 3.3) over the paged latent cache (mla_kernels.h): the absorbed form
// for decode-form tokens (small batches on custom kernels, larger ones on batched SGEMMs; the column-major
// mapping is in docs/kernels-cuda.md), the MHA form per prefill-form sequence on cuBLAS (split bf16 tensor-core
// products by default: mla_prefill_mha).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "k3/backend/cuda/cuda_backend.h"
#include "k3/backend/cuda/dense_kernels.h"

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
  if (N <= kMlaSmallBatch) {
    K3_CUDA_CHECK(cuda::mla_absorb_q(q.f(), w.kv_b.data(), N, nh, dn, dr, dv, kr, ql.f(), stream_));
  } else {
    const float one = 1.f, zero = 0.f;
    check_cublas(cublasSgemmStridedBatched(lin_->cublas(), CUBLAS_OP_N, CUBLAS_OP_N, kr, N, dn, &one, w.kv_b.data(), kr,
                                           static_cast<long long>(dn + dv) * kr, q.f(), nh * qk, qk, &zero, ql.f(), nh * cd, cd,
                                           nh),
                 "q absorption");
  }
  K3_CUDA_CHECK(mla_copy_qpe(q.f(), N, nh, dn, dr, kr, ql.f(), stream_));
  prof_.end(stream_);
}

void CudaBackend::mla_attend_latent(int64_t layer, const graph::MlaDims& d, Tensor ql, float scale, Tensor ol) {
  prof_.begin("mla attn", stream_);
  MlaPaging pg = paging(layer);
  pg.tok_index = sd_.n_dec_tokens == ql.rows ? nullptr : staged<const int32_t>(sd_.dec_tokens);
  K3_CUDA_CHECK(cuda::mla_attend_latent(pg, sd_.n_dec_tokens, static_cast<int>(d.heads), ql.f(), scale, ol.f(),
                                        mla_ws_.get<float>(), stream_, mla_keys_class_));
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

// How the MHA prefill's products run (C = alpha op(A) op(B) + beta C over `batch` strided matrices,
// column-major, cuBLAS's terms):
//   Fp32:  true fp32 (SIMT FFMA): the reference form, K3_MLA_PREFILL=fp32;
//   Tf32:  the tensor cores on TF32-rounded inputs (10-bit mantissa, fp32 accumulation), what
//          `--gemm-precision bf16` asks for (it already rounds the projections' inputs to bf16);
//   Split: the default: each fp32 operand as hi + lo bf16 (to_bf16_split) and three bf16 tensor-core
//          products, lo.hi + hi.lo + hi.hi, accumulated in fp32 -- ~16 mantissa bits per operand, as the
//          projections' bf16x2 GEMMs carry. Why: the fp32 SGEMMs ran at ~20 TFLOP/s and were 21% of a
//          Kimi-Linear-dims pp4096 step (call s40-2, H200).
enum class MhaMath { Fp32, Tf32, Split };

// An operand: the fp32 values, and with Split their bf16 halves in the same layout.
struct MhaOp {
  const float* f;
  const uint16_t* hi;
  const uint16_t* lo;
  int ld;
  long long stride;
};

void mha_gemm(cublasHandle_t h, MhaMath math, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
              const MhaOp& A, const MhaOp& B, float beta, float* C, int ldc, long long sc, int batch, const char* what) {
  switch (math) {
    case MhaMath::Fp32:
      check_cublas(cublasSgemmStridedBatched(h, ta, tb, m, n, k, &alpha, A.f, A.ld, A.stride, B.f, B.ld, B.stride, &beta, C,
                                             ldc, sc, batch),
                   what);
      return;
    case MhaMath::Tf32:
      check_cublas(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A.f, CUDA_R_32F, A.ld, A.stride, B.f, CUDA_R_32F,
                                              B.ld, B.stride, &beta, C, CUDA_R_32F, ldc, sc, batch,
                                              CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT),
                   what);
      return;
    case MhaMath::Split: {
      // The small terms first, so each partial sum is rounded at its own scale.
      const uint16_t* as[3] = {A.lo, A.hi, A.hi};
      const uint16_t* bs[3] = {B.hi, B.lo, B.hi};
      const float one = 1.f;
      for (int i = 0; i < 3; ++i)
        check_cublas(cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, as[i], CUDA_R_16BF, A.ld, A.stride, bs[i],
                                                CUDA_R_16BF, B.ld, B.stride, i == 0 ? &beta : &one, C, CUDA_R_32F, ldc, sc,
                                                batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     what);
      return;
    }
  }
}

// K3_MLA_PREFILL=fp32: the fp32 SGEMM form (A/B switch, and the reference); unset: split bf16 (or TF32 with
// --gemm-precision bf16). Read per prefill (a test switches it in one process).
bool mha_fp32_forced() {
  const char* e = std::getenv("K3_MLA_PREFILL");
  return e != nullptr && std::string(e) == "fp32";
}

// The split form's bf16 copies cost 4 bytes per fp32 value they shadow; above this the step takes fp32
// instead of growing the workspace further (the fp32 workspace itself grows with the context: S x nh x 256 x 4
// bytes of expanded keys / values).
constexpr size_t kMhaSplitMaxBytes = size_t{1} << 31;

}  // namespace

// One sequence's n new tokens at positions past .. past+n-1: k_nope / v for all S = past + n cached tokens
// are expanded from the latents (one product), then per query chunk the scores (two batched products: the
// nope part + the shared rope-slot part), a causal softmax, and P.V (MhaMath above says in which arithmetic;
// the CPU reference uses the same form in fp32). Writes rows [offset, offset + n) of out. A chunk of queries
// ending at position past + t0 + tq - 1 sees only the first past + t0 + tq keys, so its scores, softmax and P.V
// stop there (causal trimming: half the work of a prefill from position 0; the scores are laid out
// [nh][tq][keys seen]).
void CudaBackend::mla_prefill_mha(const MlaWeights& w, const graph::MlaDims& d, const MlaPaging& pg, int seq,
                                  int64_t offset, int64_t n, int64_t past, const float* q, float scale, float* out) {
  const int nh = static_cast<int>(d.heads), dn = static_cast<int>(d.nope), dr = static_cast<int>(d.rope),
            dv = static_cast<int>(d.value), kr = static_cast<int>(d.rank);
  const int qk = dn + dr, cd = kr + dr, Rw = nh * (dn + dv);
  const int64_t S = past + n;
  const int64_t budget = int64_t{64} << 20;  // floats of scores per chunk (256 MiB)
  const int64_t Tq = std::max<int64_t>(1, std::min<int64_t>(n, budget / (int64_t{nh} * S)));
  // fp32: latents, expanded k/v, one chunk's scores; Split adds the bf16 halves of those, of kv_b and of q.
  const int64_t nLc = S * cd, nKV = S * Rw, nSc = int64_t{nh} * Tq * S, nW = int64_t{kr} * Rw, nQ = n * nh * qk;
  const size_t f32_bytes = static_cast<size_t>(nLc + nKV + nSc) * 4;
  const size_t split_bytes = static_cast<size_t>(nLc + nKV + nSc + nW + nQ) * 4 + 6 * 32;  // + the halves' padding
  const MhaMath math = gemm_bf16_            ? MhaMath::Tf32
                       : mha_fp32_forced() || split_bytes > kMhaSplitMaxBytes ? MhaMath::Fp32
                                                                                : MhaMath::Split;
  const size_t need = f32_bytes + (math == MhaMath::Split ? split_bytes : 0);
  if (mha_ws_.bytes() < need) {
    K3_CUDA_CHECK(cudaStreamSynchronize(stream_));  // queued work may still use the old buffer
    mha_ws_ = DeviceBuffer(need + need / 4);
  }
  float* Lc = mha_ws_.get<float>();
  float* KV = Lc + nLc;
  float* sc = KV + nKV;
  // Split only: hi then lo of each operand, from the first 16-byte boundary after the scores
  uint16_t* half = reinterpret_cast<uint16_t*>((reinterpret_cast<uintptr_t>(sc + nSc) + 15) & ~uintptr_t{15});
  auto halves = [&](const float* x, int64_t count) {
    const int64_t padded = (count + 7) / 8 * 8;  // every half 16-byte aligned (cuBLAS's vector loads)
    uint16_t* hi = half;
    uint16_t* lo = half + padded;
    half += 2 * padded;
    K3_CUDA_CHECK(to_bf16_split(x, count, hi, lo, stream_));
    return std::pair<const uint16_t*, const uint16_t*>{hi, lo};
  };
  auto op = [&](const float* f, std::pair<const uint16_t*, const uint16_t*> h, const float* base, int ld, long long st) {
    const ptrdiff_t at = f - base;  // the operand's offset into the split tensor
    return MhaOp{f, h.first ? h.first + at : nullptr, h.second ? h.second + at : nullptr, ld, st};
  };
  const bool split = math == MhaMath::Split;
  using Halves = std::pair<const uint16_t*, const uint16_t*>;
  K3_CUDA_CHECK(mla_gather_latents(pg, seq, static_cast<int>(S), Lc, stream_));
  const Halves hLc = split ? halves(Lc, nLc) : Halves{}, hW = split ? halves(w.kv_b.data(), nW) : Halves{};
  const float* Qs = q + offset * nh * qk;
  const Halves hQ = split ? halves(Qs, nQ) : Halves{};
  cublasHandle_t hb = lin_->cublas();
  mha_gemm(hb, math, CUBLAS_OP_T, CUBLAS_OP_N, Rw, static_cast<int>(S), kr, 1.f, op(w.kv_b.data(), hW, w.kv_b.data(), kr, 0),
           op(Lc, hLc, Lc, cd, 0), 0.f, KV, Rw, 0, 1, "MLA k/v expansion");
  const Halves hKV = split ? halves(KV, nKV) : Halves{};
  uint16_t* const chunk_half = half;  // each chunk's scores split here, reused by the next chunk
  for (int64_t t0 = 0; t0 < n; t0 += Tq) {
    const int tq = static_cast<int>(std::min<int64_t>(Tq, n - t0));
    const int keys = static_cast<int>(past + t0 + tq);  // the keys this chunk's last query sees
    const float* Q = Qs + t0 * nh * qk;
    const long long sstride = static_cast<long long>(tq) * keys;
    mha_gemm(hb, math, CUBLAS_OP_T, CUBLAS_OP_N, keys, tq, dn, scale, op(KV, hKV, KV, Rw, dn + dv), op(Q, hQ, Qs, nh * qk, qk),
             0.f, sc, keys, sstride, nh, "MLA scores (nope)");
    mha_gemm(hb, math, CUBLAS_OP_T, CUBLAS_OP_N, keys, tq, dr, scale, op(Lc + kr, hLc, Lc, cd, 0), op(Q + dn, hQ, Qs, nh * qk, qk),
             1.f, sc, keys, sstride, nh, "MLA scores (rope slot)");
    K3_CUDA_CHECK(mla_causal_softmax(sc, nh, tq, keys, static_cast<int>(past + t0), stream_));
    half = chunk_half;
    const Halves hP = split ? halves(sc, int64_t{nh} * sstride) : Halves{};
    mha_gemm(hb, math, CUBLAS_OP_N, CUBLAS_OP_N, dv, tq, keys, 1.f, op(KV + dn, hKV, KV, Rw, dn + dv), op(sc, hP, sc, keys, sstride),
             0.f, out + (offset + t0) * nh * dv, nh * dv, dv, nh, "MLA P.V");
  }
}

}  // namespace k3::cuda
