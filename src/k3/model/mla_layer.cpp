// Gated MLA layer (model-spec section 3.3): latent projections, cache write, then per sequence either
// the absorbed (decode) form directly over the 576-value latent rows or the MHA (prefill) form with
// k/v expanded from the cached latents. Projections run over the whole batch.
#include <cmath>

#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/thread_pool.h"
#include "k3/model/layers.h"

namespace k3 {

namespace {

// Absorbed form for one sequence: q_lat_h = [W_UK_h^T q_nope_h | q_pe_h], attention over the latent
// rows, o_h = W_UV_h o_lat_h.
void attend_absorbed(const ModelConfig& c, const MlaWeights& w, const float* q, int64_t n, int64_t P,
                     const std::vector<const float*>& rows, float scale, float* o) {
  const int64_t nh = c.mla_heads, dn = c.qk_nope_dim, dr = c.qk_rope_dim, dv = c.v_head_dim, kr = c.kv_lora_rank;
  const int64_t qk = dn + dr, cd = kr + dr;
  const float* kvb = w.kv_b.data();  // [nh*(dn+dv)][kr]
  std::vector<float> ql(static_cast<size_t>(n * nh * cd)), ol(static_cast<size_t>(n * nh * kr));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float* qn = q + (t * nh + h) * qk;
      float* dst = ql.data() + (t * nh + h) * cd;
      for (int64_t j = 0; j < kr; ++j) dst[j] = 0;
      for (int64_t i = 0; i < dn; ++i) {
        const float* row = kvb + (h * (dn + dv) + i) * kr;
        const float qi = qn[i];
        for (int64_t j = 0; j < kr; ++j) dst[j] += qi * row[j];
      }
      for (int64_t j = 0; j < dr; ++j) dst[kr + j] = qn[dn + j];
    }
  cpu::mla_attention_latent_rows(static_cast<int>(n), static_cast<int>(P), static_cast<int>(nh), static_cast<int>(kr),
                                 static_cast<int>(dr), ql.data(), rows.data(), scale, ol.data());
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < nh; ++h) {
      const float* ohl = ol.data() + (t * nh + h) * kr;
      float* oh = o + (t * nh + h) * dv;
      for (int64_t i = 0; i < dv; ++i) {
        const float* row = kvb + (h * (dn + dv) + dn + i) * kr;
        float s = 0;
        for (int64_t j = 0; j < kr; ++j) s += row[j] * ohl[j];
        oh[i] = s;
      }
    }
}

// MHA form for one sequence: expand k_nope / v for every cached token from the latents.
void attend_mha(const ModelConfig& c, const MlaWeights& w, const float* q, int64_t n, int64_t P,
                const std::vector<const float*>& rows, float scale, float* o) {
  const int64_t nh = c.mla_heads, dn = c.qk_nope_dim, dr = c.qk_rope_dim, dv = c.v_head_dim, kr = c.kv_lora_rank;
  const int64_t S = P + n;
  std::vector<float> clat(static_cast<size_t>(S * kr)), kv(static_cast<size_t>(S * nh * (dn + dv)));
  std::vector<float> kn(static_cast<size_t>(S * nh * dn)), vv(static_cast<size_t>(S * nh * dv)), kpe(static_cast<size_t>(S * dr));
  for (int64_t s = 0; s < S; ++s) {
    std::copy(rows[static_cast<size_t>(s)], rows[static_cast<size_t>(s)] + kr, clat.data() + s * kr);
    std::copy(rows[static_cast<size_t>(s)] + kr, rows[static_cast<size_t>(s)] + kr + dr, kpe.data() + s * dr);
  }
  cpu::matmul(w.kv_b_f32, clat.data(), S, kv.data());
  for (int64_t s = 0; s < S; ++s)
    for (int64_t h = 0; h < nh; ++h) {
      const float* src = kv.data() + (s * nh + h) * (dn + dv);
      std::copy(src, src + dn, kn.data() + (s * nh + h) * dn);
      std::copy(src + dn, src + dn + dv, vv.data() + (s * nh + h) * dv);
    }
  cpu::mla_attention_mha(static_cast<int>(n), static_cast<int>(P), static_cast<int>(nh), static_cast<int>(dn),
                         static_cast<int>(dr), static_cast<int>(dv), q, kn.data(), kpe.data(), vv.data(), scale, o);
}

}  // namespace

void mla_layer(const ModelConfig& c, const MlaWeights& w, int64_t mla_index, const float* x, int64_t N,
               const std::vector<SeqSpan>& seqs, float* out) {
  const int64_t nh = c.mla_heads, dn = c.qk_nope_dim, dr = c.qk_rope_dim, dv = c.v_head_dim, kr = c.kv_lora_rank;
  const int64_t qk = dn + dr, cd = kr + dr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));

  std::vector<float> q(static_cast<size_t>(N * nh * qk));
  if (!w.q_a.empty()) {
    std::vector<float> qa(static_cast<size_t>(N * c.q_lora_rank));
    cpu::matmul(w.q_a, x, N, qa.data());
    cpu::rmsnorm(qa.data(), w.q_a_norm.data(), N, c.q_lora_rank, c.mla_norm_eps, qa.data());
    cpu::matmul(w.q_b, qa.data(), N, q.data());
  } else {
    cpu::matmul(w.q, x, N, q.data());
  }
  // New latents [c_kv (normed) | k_pe].
  std::vector<float> lat(static_cast<size_t>(N * cd));
  cpu::matmul(w.kv_a, x, N, lat.data());
  cpu::rmsnorm(lat.data(), w.kv_a_norm.data(), N, kr, c.mla_norm_eps, cd, lat.data());

  std::vector<float> o(static_cast<size_t>(N * nh * dv));
  // Sequences are independent: parallel over them when there are several (see kda_layer.cpp).
  const int64_t n_seqs = static_cast<int64_t>(seqs.size());
  auto one = [&](const SeqSpan& s) {
    std::vector<const float*> rows;
    const int64_t P = s.cache->n_past();
    for (int64_t t = 0; t < s.n; ++t) {
      const float* src = lat.data() + (s.offset + t) * cd;
      std::copy(src, src + cd, s.cache->mla_row(mla_index, P + t));
    }
    rows.resize(static_cast<size_t>(P + s.n));
    for (int64_t p = 0; p < P + s.n; ++p) rows[static_cast<size_t>(p)] = s.cache->mla_row(mla_index, p);
    const float* qs = q.data() + s.offset * nh * qk;
    float* os = o.data() + s.offset * nh * dv;
    if (s.prefill_form)
      attend_mha(c, w, qs, s.n, P, rows, scale, os);
    else
      attend_absorbed(c, w, qs, s.n, P, rows, scale, os);
  };
  if (n_seqs == 1) {
    one(seqs[0]);  // the kernels parallelise inside
  } else {
    ThreadPool::global().parallel_for(n_seqs, 1, [&](int64_t b, int64_t e, int) {
      for (int64_t si = b; si < e; ++si) one(seqs[static_cast<size_t>(si)]);
    });
  }

  if (c.mla_output_gate) {
    std::vector<float> gt(o.size());
    cpu::matmul(w.g, x, N, gt.data());
    for (size_t i = 0; i < o.size(); ++i) o[i] *= cpu::sigmoidf(gt[i]);
  }
  cpu::matmul(w.o, o.data(), N, out);
}

}  // namespace k3
