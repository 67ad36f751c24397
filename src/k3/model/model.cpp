#include "k3/model/model.h"

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/model/layers.h"

namespace k3 {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  auto m = std::unique_ptr<Model>(new Model());
  m->cfg_ = load_model_config(dir);
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  m->w_ = bind_weights(m->cfg_, *m->ckpt_);
  return m;
}

SequenceState Model::new_sequence() const {
  SequenceState s;
  s.kda.resize(static_cast<size_t>(cfg_.num_layers));
  s.mla.resize(static_cast<size_t>(cfg_.num_layers));
  return s;
}

void Model::forward(std::span<const int32_t> tokens, SequenceState& st, std::vector<float>& logits,
                    const ForwardOptions& opt) const {
  const int64_t n = static_cast<int64_t>(tokens.size()), H = cfg_.hidden_size, V = cfg_.vocab_size;
  if (n == 0) throw Error("forward: no tokens");
  for (int32_t t : tokens)
    if (t < 0 || t >= V) throw Error("token id " + std::to_string(t) + " out of range [0, " + std::to_string(V) + ")");
  if (st.kda.size() != static_cast<size_t>(cfg_.num_layers)) st = new_sequence();
  const bool prefill_form = opt.path == AttnPath::Prefill || (opt.path == AttnPath::Auto && n > 1);
  const size_t nH = static_cast<size_t>(n * H);
  const float eps = cfg_.rms_norm_eps;

  // P: the running partial sum of the current block (or the whole residual without AttnRes).
  std::vector<float> P(nH), h(nH), xin(nH), tmp(nH);
  for (int64_t t = 0; t < n; ++t) cpu::dequant_row(w_.embed, tokens[static_cast<size_t>(t)], P.data() + t * H);

  const bool attn_res = cfg_.attn_res_block_size > 0;
  std::vector<std::vector<float>> blocks;  // completed block summaries B
  auto sources = [&](const std::vector<float>& cur) {
    std::vector<const float*> v;
    for (auto& b : blocks) v.push_back(b.data());
    v.push_back(cur.data());
    return v;
  };

  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    bool p_empty = false;
    if (attn_res) {
      if (!blocks.empty())
        attn_res_mix(sources(P), L.attn_res, n, H, eps, h.data());
      else
        h = P;
      if (l % cfg_.attn_res_block_size == 0) {
        blocks.push_back(P);
        p_empty = true;
      }
    } else {
      h = P;
    }
    cpu::rmsnorm(h.data(), L.input_norm.data(), n, H, eps, xin.data());
    if (L.is_kda)
      kda_layer(cfg_, L.kda, xin.data(), n, st.kda[static_cast<size_t>(l)], prefill_form, opt.kda_chunk, tmp.data());
    else
      mla_layer(cfg_, L.mla, xin.data(), n, st.mla[static_cast<size_t>(l)], !prefill_form, tmp.data());
    if (p_empty)
      P = tmp;
    else
      for (size_t i = 0; i < nH; ++i) P[i] += tmp[i];

    if (attn_res)
      attn_res_mix(sources(P), L.mlp_res, n, H, eps, h.data());
    else
      h = P;
    cpu::rmsnorm(h.data(), L.post_attn_norm.data(), n, H, eps, xin.data());
    if (L.is_moe)
      moe_layer(cfg_, L.moe, xin.data(), n, tmp.data());
    else
      glu_mlp(cfg_, L.mlp, xin.data(), n, tmp.data());
    for (size_t i = 0; i < nH; ++i) P[i] += tmp[i];
  }
  if (attn_res)
    attn_res_mix(sources(P), w_.out_res, n, H, eps, h.data());
  else
    h = P;

  const int64_t first = opt.all_logits ? 0 : n - 1, rows = n - first;
  cpu::rmsnorm(h.data() + first * H, w_.final_norm.data(), rows, H, eps, xin.data());
  logits.resize(static_cast<size_t>(rows * V));
  cpu::matmul(w_.lm_head, xin.data(), rows, logits.data());
  st.n_past += n;
}

}  // namespace k3
