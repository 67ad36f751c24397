// Gated MLA layer (model-spec section 3.3): latent projections, cache append, then either the MHA
// (prefill) form with k/v expanded from the cached latents or the absorbed (decode) form directly
// over the 576-value latent cache.
#include <cmath>

#include "k3/backend/cpu/mla_attention.h"
#include "k3/backend/cpu/ops.h"
#include "k3/model/layers.h"

namespace k3 {

void mla_layer(const ModelConfig& c, const MlaWeights& w, const float* x, int64_t n, MlaLayerState& st, bool absorbed,
               float* out) {
  const int64_t nh = c.mla_heads, dn = c.qk_nope_dim, dr = c.qk_rope_dim, dv = c.v_head_dim, kr = c.kv_lora_rank;
  const int64_t qk = dn + dr, cd = kr + dr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(qk));

  std::vector<float> q(static_cast<size_t>(n * nh * qk));
  if (!w.q_a.empty()) {
    std::vector<float> qa(static_cast<size_t>(n * c.q_lora_rank));
    cpu::matmul(w.q_a, x, n, qa.data());
    cpu::rmsnorm(qa.data(), w.q_a_norm.data(), n, c.q_lora_rank, c.mla_norm_eps, qa.data());
    cpu::matmul(w.q_b, qa.data(), n, q.data());
  } else {
    cpu::matmul(w.q, x, n, q.data());
  }

  // New latents [c_kv (normed) | k_pe] appended to the cache.
  const int64_t P = static_cast<int64_t>(st.cache.size()) / cd, S = P + n;
  st.cache.resize(static_cast<size_t>(S * cd));
  float* fresh = st.cache.data() + P * cd;
  cpu::matmul(w.kv_a, x, n, fresh);
  for (int64_t t = 0; t < n; ++t) cpu::rmsnorm(fresh + t * cd, w.kv_a_norm.data(), 1, kr, c.mla_norm_eps, fresh + t * cd);

  std::vector<float> o(static_cast<size_t>(n * nh * dv));
  const float* kvb = w.kv_b.data();  // [nh*(dn+dv)][kr]
  if (absorbed) {
    // q_lat_h = [W_UK_h^T q_nope_h | q_pe_h]
    std::vector<float> ql(static_cast<size_t>(n * nh * cd)), ol(static_cast<size_t>(n * nh * kr));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const float* qn = q.data() + (t * nh + h) * qk;
        float* dst = ql.data() + (t * nh + h) * cd;
        for (int64_t j = 0; j < kr; ++j) dst[j] = 0;
        for (int64_t i = 0; i < dn; ++i) {
          const float* row = kvb + (h * (dn + dv) + i) * kr;
          const float qi = qn[i];
          for (int64_t j = 0; j < kr; ++j) dst[j] += qi * row[j];
        }
        for (int64_t j = 0; j < dr; ++j) dst[kr + j] = qn[dn + j];
      }
    cpu::mla_attention_latent(static_cast<int>(n), static_cast<int>(P), static_cast<int>(nh), static_cast<int>(kr), static_cast<int>(dr), ql.data(), st.cache.data(), scale, ol.data());
    // o_h = W_UV_h o_lat_h
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < nh; ++h) {
        const float* ohl = ol.data() + (t * nh + h) * kr;
        float* oh = o.data() + (t * nh + h) * dv;
        for (int64_t i = 0; i < dv; ++i) {
          const float* row = kvb + (h * (dn + dv) + dn + i) * kr;
          float s = 0;
          for (int64_t j = 0; j < kr; ++j) s += row[j] * ohl[j];
          oh[i] = s;
        }
      }
  } else {
    // Expand k_nope / v for every cached token from the latents.
    std::vector<float> clat(static_cast<size_t>(S * kr)), kv(static_cast<size_t>(S * nh * (dn + dv)));
    std::vector<float> kn(static_cast<size_t>(S * nh * dn)), vv(static_cast<size_t>(S * nh * dv)), kpe(static_cast<size_t>(S * dr));
    for (int64_t s = 0; s < S; ++s) {
      const float* src = st.cache.data() + s * cd;
      std::copy(src, src + kr, clat.data() + s * kr);
      std::copy(src + kr, src + cd, kpe.data() + s * dr);
    }
    cpu::matmul(w.kv_b_f32, clat.data(), S, kv.data());
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < nh; ++h) {
        const float* src = kv.data() + (s * nh + h) * (dn + dv);
        std::copy(src, src + dn, kn.data() + (s * nh + h) * dn);
        std::copy(src + dn, src + dn + dv, vv.data() + (s * nh + h) * dv);
      }
    cpu::mla_attention_mha(static_cast<int>(n), static_cast<int>(P), static_cast<int>(nh), static_cast<int>(dn), static_cast<int>(dr), static_cast<int>(dv), q.data(), kn.data(), kpe.data(), vv.data(), scale, o.data());
  }

  if (c.mla_output_gate) {
    std::vector<float> gt(o.size());
    cpu::matmul(w.g, x, n, gt.data());
    for (size_t i = 0; i < o.size(); ++i) o[i] *= cpu::sigmoidf(gt[i]);
  }
  cpu::matmul(w.o, o.data(), n, out);
}

}  // namespace k3
