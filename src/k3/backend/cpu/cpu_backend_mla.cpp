// CpuBackend's MLA ops (model-spec 3.3): the latent cache write, the absorbed (decode) form as absorb /
// attend / up-projection over decode-form sequences, and the MHA (prefill) form per prefill-form sequence.
#include <algorithm>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/mla_cache_rows.h"
#include "k3/backend/cpu/ops.h"
#include "k3/backend/cpu/weight_kernels.h"

namespace k3::cpu {

using graph::Tensor;

namespace {
bool decode_form(const graph::StepSeq& s) { return !s.prefill_form; }
bool prefill_form(const graph::StepSeq& s) { return s.prefill_form; }
}  // namespace

std::vector<const void*> CpuBackend::latent_rows(const graph::StepSeq& s, int64_t layer) {
  const MlaPageTable pt = s.cache->mla_pages();
  std::vector<const void*> rows(static_cast<size_t>(s.past + s.n));
  for (int64_t p = 0; p < s.past + s.n; ++p) rows[static_cast<size_t>(p)] = pt.row(layer, p);
  return rows;
}

void CpuBackend::mla_write_latents(int64_t layer, const graph::MlaDims& d, Tensor lat) {
  std::vector<void*> rows;
  for (const graph::StepSeq& s : plan_->seqs) {
    const MlaPageTable pt = s.cache->mla_pages();
    rows.clear();
    for (int64_t t = 0; t < s.n; ++t) rows.push_back(pt.row(layer, s.past + t));
    mla_write_rows(s.cache->spec().mla_dtype, static_cast<int>(s.n), static_cast<int>(d.rank), static_cast<int>(d.rope),
                   lat.row(s.offset), rows.data());
  }
}

// Both absorbed-form projections read kv_b (fp32, 4 MB per layer on k3-1b): parallel over (token, head)
// so a batch-1 step streams it with every thread; each (token, head) is computed the same way on any thread.
void CpuBackend::mla_absorb_q(const MlaWeights& w, const graph::MlaDims& dm, Tensor q, Tensor ql) {
  const int64_t nh = dm.heads, dn = dm.nope, dr = dm.rope, dv = dm.value, kr = dm.rank, qk = dm.qk(), cd = dm.row();
  const float* kvb = w.kv_b.data();  // [nh*(dn+dv)][kr]
  for_seqs(decode_form, [&](const graph::StepSeq& s) {
    parallel_for(s.n * nh, s.n * nh > 1, [&](int64_t i) {
      const int64_t t = s.offset + i / nh, h = i % nh;
      const float* qn = q.f() + (t * nh + h) * qk;
      float* dst = ql.f() + (t * nh + h) * cd;
      for (int64_t j = 0; j < kr; ++j) dst[j] = 0;
      for (int64_t d = 0; d < dn; ++d) {
        const float* row = kvb + (h * (dn + dv) + d) * kr;
        const float qd = qn[d];
        for (int64_t j = 0; j < kr; ++j) dst[j] += qd * row[j];
      }
      for (int64_t j = 0; j < dr; ++j) dst[kr + j] = qn[dn + j];
    });
  });
}

void CpuBackend::mla_attend_latent(int64_t layer, const graph::MlaDims& dm, Tensor ql, float scale, Tensor ol) {
  const int64_t nh = dm.heads, kr = dm.rank, cd = dm.row();
  for_seqs(decode_form, [&](const graph::StepSeq& s) {
    const std::vector<const void*> rows = latent_rows(s, layer);
    mla_attention_latent_rows_typed(static_cast<int>(s.n), static_cast<int>(s.past), static_cast<int>(nh),
                                    static_cast<int>(kr), static_cast<int>(dm.rope), ql.f() + s.offset * nh * cd, rows.data(),
                                    s.cache->spec().mla_dtype, scale, ol.f() + s.offset * nh * kr);
  });
}

// Each output is the f32 format's dot (8-lane FMA, as the prefill form's matmul over kv_b), not a scalar
// chain: 128 x 512 dependent adds per head were the op's whole cost.
void CpuBackend::mla_up_v(const MlaWeights& w, const graph::MlaDims& dm, Tensor ol, Tensor o) {
  const int64_t nh = dm.heads, dn = dm.nope, dv = dm.value, kr = dm.rank;
  const float* kvb = w.kv_b.data();
  for_seqs(decode_form, [&](const graph::StepSeq& s) {
    parallel_for(s.n * nh, s.n * nh > 1, [&](int64_t i) {
      const int64_t t = s.offset + i / nh, h = i % nh;
      const float* ohl = ol.f() + (t * nh + h) * kr;
      float* oh = o.f() + (t * nh + h) * dv;
      for (int64_t d = 0; d < dv; ++d) oh[d] = dot_f32(kvb + (h * (dn + dv) + dn + d) * kr, ohl, kr);
    });
  });
}

// MHA form for one sequence: expand k_nope / v for every cached token from the latents.
void CpuBackend::mla_attend_mha(int64_t layer, const MlaWeights& w, const graph::MlaDims& dm, Tensor q, float scale,
                                Tensor o) {
  const int64_t nh = dm.heads, dn = dm.nope, dr = dm.rope, dv = dm.value, kr = dm.rank, qk = dm.qk();
  for_seqs(prefill_form, [&](const graph::StepSeq& s) {
    const int64_t S = s.past + s.n;
    const std::vector<const void*> rows = latent_rows(s, layer);
    std::vector<float> lat(static_cast<size_t>(S * (kr + dr)));
    mla_gather_rows(s.cache->spec().mla_dtype, static_cast<int>(S), static_cast<int>(kr), static_cast<int>(dr), rows.data(),
                    lat.data());
    std::vector<float> clat(static_cast<size_t>(S * kr)), kv(static_cast<size_t>(S * nh * (dn + dv)));
    std::vector<float> kn(static_cast<size_t>(S * nh * dn)), vv(static_cast<size_t>(S * nh * dv)),
        kpe(static_cast<size_t>(S * dr));
    for (int64_t p = 0; p < S; ++p) {
      const float* r = lat.data() + p * (kr + dr);
      std::copy(r, r + kr, clat.data() + p * kr);
      std::copy(r + kr, r + kr + dr, kpe.data() + p * dr);
    }
    matmul(w.kv_b_f32, clat.data(), S, kv.data());
    for (int64_t p = 0; p < S; ++p)
      for (int64_t h = 0; h < nh; ++h) {
        const float* src = kv.data() + (p * nh + h) * (dn + dv);
        std::copy(src, src + dn, kn.data() + (p * nh + h) * dn);
        std::copy(src + dn, src + dn + dv, vv.data() + (p * nh + h) * dv);
      }
    mla_attention_mha(static_cast<int>(s.n), static_cast<int>(s.past), static_cast<int>(nh), static_cast<int>(dn),
                      static_cast<int>(dr), static_cast<int>(dv), q.f() + s.offset * nh * qk, kn.data(), kpe.data(),
                      vv.data(), scale, o.f() + s.offset * nh * dv);
  });
}

}  // namespace k3::cpu
