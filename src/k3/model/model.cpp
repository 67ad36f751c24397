#include "k3/model/model.h"

#include <unistd.h>

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/model/layers.h"

namespace k3 {

int64_t Model::memory_available() const {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
}

std::unique_ptr<Model> Model::load(const std::string& dir) {
  auto m = std::unique_ptr<Model>(new Model());
  m->cfg_ = load_model_config(dir);
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  m->w_ = bind_weights(m->cfg_, *m->ckpt_);
  return m;
}

void Model::forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                          const ForwardOptions& opt) const {
  const int64_t H = cfg_.hidden_size, V = cfg_.vocab_size;
  std::vector<SeqSpan> seqs;
  std::vector<int32_t> tokens;
  for (const BatchItem& it : items) {
    check_batch_tokens(it, V);
    const int64_t n = static_cast<int64_t>(it.tokens.size());
    const bool prefill = takes_prefill_form(opt.path, n);
    seqs.push_back(SeqSpan{static_cast<int64_t>(tokens.size()), n, it.cache, prefill});
    tokens.insert(tokens.end(), it.tokens.begin(), it.tokens.end());
  }
  if (seqs.empty()) throw Error("forward: empty batch");
  for (const SeqSpan& s : seqs) s.cache->reserve(s.n);

  const int64_t N = static_cast<int64_t>(tokens.size());
  const size_t NH = static_cast<size_t>(N * H);
  const float eps = cfg_.rms_norm_eps;

  // P: the running partial sum of the current block (or the whole residual without AttnRes).
  std::vector<float> P(NH), h(NH), xin(NH), tmp(NH);
  for (int64_t t = 0; t < N; ++t) cpu::dequant_row(w_.embed, tokens[static_cast<size_t>(t)], P.data() + t * H);

  const bool attn_res = cfg_.attn_res_block_size > 0;
  std::vector<std::vector<float>> blocks;  // completed block summaries B
  auto sources = [&](const std::vector<float>& cur) {
    std::vector<const float*> v;
    for (auto& b : blocks) v.push_back(b.data());
    v.push_back(cur.data());
    return v;
  };

  int64_t kda_index = 0, mla_index = 0;
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerWeights& L = w_.layers[static_cast<size_t>(l)];
    bool p_empty = false;
    if (attn_res) {
      if (!blocks.empty())
        attn_res_mix(sources(P), L.attn_res, N, H, eps, h.data());
      else
        h = P;
      if (l % cfg_.attn_res_block_size == 0) {
        blocks.push_back(P);
        p_empty = true;
      }
    } else {
      h = P;
    }
    cpu::rmsnorm(h.data(), L.input_norm.data(), N, H, eps, xin.data());
    if (L.is_kda)
      kda_layer(cfg_, L.kda, kda_index++, xin.data(), N, seqs, opt.kda_chunk > 0 ? opt.kda_chunk : 64, tmp.data());
    else
      mla_layer(cfg_, L.mla, mla_index++, xin.data(), N, seqs, tmp.data());
    if (p_empty)
      P = tmp;
    else
      for (size_t i = 0; i < NH; ++i) P[i] += tmp[i];

    if (attn_res)
      attn_res_mix(sources(P), L.mlp_res, N, H, eps, h.data());
    else
      h = P;
    cpu::rmsnorm(h.data(), L.post_attn_norm.data(), N, H, eps, xin.data());
    if (L.is_moe)
      moe_layer(cfg_, L.moe, xin.data(), N, tmp.data());
    else
      glu_mlp(cfg_, L.mlp, xin.data(), N, tmp.data());
    for (size_t i = 0; i < NH; ++i) P[i] += tmp[i];
  }
  if (attn_res)
    attn_res_mix(sources(P), w_.out_res, N, H, eps, h.data());
  else
    h = P;
  for (const SeqSpan& s : seqs) s.cache->advance(s.n);

  // Final norm + lm_head only on the rows whose logits are wanted.
  std::vector<int64_t> rows;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].want_logits) continue;
    const SeqSpan& s = seqs[i];
    for (int64_t t = opt.all_logits ? 0 : s.n - 1; t < s.n; ++t) rows.push_back(s.offset + t);
  }
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> hs(static_cast<size_t>(R * H));
  for (int64_t r = 0; r < R; ++r) std::copy(h.data() + rows[static_cast<size_t>(r)] * H, h.data() + (rows[static_cast<size_t>(r)] + 1) * H, hs.data() + r * H);
  cpu::rmsnorm(hs.data(), w_.final_norm.data(), R, H, eps, hs.data());
  logits.resize(static_cast<size_t>(R * V));
  if (R > 0) cpu::matmul(w_.lm_head, hs.data(), R, logits.data());
}

}  // namespace k3
