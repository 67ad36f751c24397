#include "k3/model/weights.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/io/page_cache.h"
#include "k3/model/weight_binder.h"

namespace k3 {

namespace {

AttnResWeights bind_attn_res(WeightBinder& b, const std::string& p, const std::string& stem, int64_t H) {
  AttnResWeights r;
  auto norm = b.vec(p + stem + "_norm.weight", H);
  auto proj = b.vec(p + stem + "_proj.weight", {{1, H}, {H}});
  if (norm.size() == static_cast<size_t>(H) && proj.size() == static_cast<size_t>(H)) {
    std::vector<float> w(static_cast<size_t>(H));
    for (int64_t i = 0; i < H; ++i) w[static_cast<size_t>(i)] = norm[static_cast<size_t>(i)] * proj[static_cast<size_t>(i)];
    r.w = std::move(w);
  }
  return r;
}

GluMlp bind_glu(WeightBinder& b, const std::string& p, int64_t in, int64_t inter) {
  return {b.mat(p + "gate_proj.weight", inter, in), b.mat(p + "up_proj.weight", inter, in),
          b.mat(p + "down_proj.weight", in, inter)};
}

void bind_kda(WeightBinder& b, const ModelConfig& c, const std::string& p, KdaWeights& w) {
  const int64_t H = c.hidden_size, Hk = c.kda_heads, D = c.kda_head_dim, C = Hk * D, W = c.conv_kernel;
  const int64_t r = c.kda_gate_rank;
  w.q = b.mat(p + "q_proj.weight", C, H);
  w.k = b.mat(p + "k_proj.weight", C, H);
  w.v = b.mat(p + "v_proj.weight", C, H);
  w.q_conv = b.vec(p + "q_conv1d.weight", {{C, 1, W}, {C, W}});
  w.k_conv = b.vec(p + "k_conv1d.weight", {{C, 1, W}, {C, W}});
  w.v_conv = b.vec(p + "v_conv1d.weight", {{C, 1, W}, {C, W}});
  w.f_a = b.mat(p + "f_a_proj.weight", r, H);
  w.f_b = b.mat(p + "f_b_proj.weight", C, r);
  w.dt_bias = b.vec(p + "dt_bias", {{C}});
  // K3 stores A_log as a zero-padded [head_dim] (or longer) vector; Kimi-Linear as [1,1,Hk,1].
  std::vector<std::vector<int64_t>> a_shapes = {{1, 1, Hk, 1}, {Hk}};
  if (D > Hk) a_shapes.push_back({D});
  if (Hk < 128 && D != 128) a_shapes.push_back({128});
  if (b.has(p + kNegExpALogName)) {
    // -exp(A_log) as stored (a GGUF): exp(A_log) exactly by negation; the logarithm only for backends that take it.
    auto na = b.vec(p + kNegExpALogName, {{Hk}});
    if (!na.empty()) {
      std::vector<float> ae(static_cast<size_t>(Hk)), al(static_cast<size_t>(Hk));
      for (size_t h = 0; h < ae.size(); ++h) ae[h] = -na[h], al[h] = std::log(ae[h]);
      w.A_exp = std::move(ae);
      w.A_log = std::move(al);
    }
  } else {
    auto a = b.vec(p + "A_log", a_shapes);
    if (!a.empty()) {
      w.A_log = std::vector<float>(a.begin(), a.begin() + Hk);
      std::vector<float> ae(static_cast<size_t>(Hk));
      for (size_t h = 0; h < ae.size(); ++h) ae[h] = std::exp(w.A_log[h]);  // the CPU gate's exp (cpu_backend_kda.cpp)
      w.A_exp = std::move(ae);
    }
  }
  w.b = b.mat(p + "b_proj.weight", Hk, H);
  if (c.kda_full_rank_gate) {
    w.g = b.mat(p + "g_proj.weight", C, H);
  } else {
    w.g_a = b.mat(p + "g_a_proj.weight", r, H);
    w.g_b = b.mat(p + "g_b_proj.weight", C, r);
  }
  w.o_norm = b.vec(p + "o_norm.weight", D);
  w.o = b.mat(p + "o_proj.weight", H, C);
}

void bind_mla(WeightBinder& b, const ModelConfig& c, const std::string& p, MlaWeights& w) {
  const int64_t H = c.hidden_size, nh = c.mla_heads, qk = c.mla_qk_dim(), kr = c.kv_lora_rank;
  const int64_t dn = c.qk_nope_dim, dv = c.v_head_dim;
  if (c.q_lora_rank > 0) {
    w.q_a = b.mat(p + "q_a_proj.weight", c.q_lora_rank, H);
    w.q_a_norm = b.vec(p + "q_a_layernorm.weight", c.q_lora_rank);
    w.q_b = b.mat(p + "q_b_proj.weight", nh * qk, c.q_lora_rank);
  } else {
    w.q = b.mat(p + "q_proj.weight", nh * qk, H);
  }
  w.kv_a = b.mat(p + "kv_a_proj_with_mqa.weight", kr + c.qk_rope_dim, H);
  w.kv_a_norm = b.vec(p + "kv_a_layernorm.weight", kr);
  WeightMatrix kvb = b.mat(p + "kv_b_proj.weight", nh * (dn + dv), kr);
  if (!kvb.empty()) {
    std::vector<float> kv_b(static_cast<size_t>(kvb.rows * kvb.cols));
    for (int64_t r = 0; r < kvb.rows; ++r) cpu::dequant_row(kvb, r, kv_b.data() + r * kr);
    w.kv_b = std::move(kv_b);
    w.kv_b_stored = kvb;
    w.kv_b_f32 = kvb;
    w.kv_b_f32.format = WeightFormat::F32;
    w.kv_b_f32.data = w.kv_b.data();
  }
  if (b.has(p + kKvbKeyBlocksName) || b.has(p + kKvbValueBlocksName)) {
    w.k_b_blocks = b.mat(p + kKvbKeyBlocksName, nh * kr, dn);
    w.v_b_blocks = b.mat(p + kKvbValueBlocksName, nh * dv, kr);
  }
  w.o = b.mat(p + "o_proj.weight", H, nh * dv);
  if (c.mla_output_gate) w.g = b.mat(p + "g_proj.weight", nh * dv, H);
}

void bind_moe(WeightBinder& b, const ModelConfig& c, const std::string& p, MoeWeights& w) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size, X = c.expert_in_dim();
  w.router = b.mat(p + "gate.weight", E, H);
  w.correction_bias = b.vec(p + "gate.e_score_correction_bias", E);
  w.experts.resize(static_cast<size_t>(E));
  if (c.expert_quant_format && weight_layout(*c.expert_quant_format).scale_bytes > 0)
    for (int64_t e = 0; e < E; ++e)
      for (const char* wn : {"w1", "w3", "w2"}) b.prefetch(p + "experts." + std::to_string(e) + "." + wn + ".weight_scale");
  for (int64_t e = 0; e < E; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    GluMlp& x = w.experts[static_cast<size_t>(e)];
    if (c.expert_quant_format) {
      x.gate = b.packed(ep + "w1", *c.expert_quant_format, I, X);
      x.up = b.packed(ep + "w3", *c.expert_quant_format, I, X);
      x.down = b.packed(ep + "w2", *c.expert_quant_format, X, I);
    } else {
      x.gate = b.mat(ep + "w1.weight", I, X);
      x.up = b.mat(ep + "w3.weight", I, X);
      x.down = b.mat(ep + "w2.weight", X, I);
    }
  }
  if (c.num_shared_experts > 0) w.shared = bind_glu(b, p + "shared_experts.", H, I * c.num_shared_experts);
  if (c.routed_hidden_size > 0) {
    w.latent_down = b.mat(p + "routed_expert_down_proj.weight", X, H);
    w.latent_up = b.mat(p + "routed_expert_up_proj.weight", H, X);
    if (c.latent_moe_norm) w.latent_norm = b.vec(p + "routed_expert_norm.weight", X);
  }
}

// A lower bound on the number of tensors the config implies (per layer: two norms, at least five
// attention tensors, and three per expert or dense MLP).
int64_t min_tensor_count(const ModelConfig& c) {
  int64_t n = 2;  // embeddings, final norm
  for (int64_t l = 0; l < c.num_layers; ++l) n += 2 + 5 + (c.is_moe_layer(l) ? 2 + 3 * c.num_experts : 3);
  return n;
}

}  // namespace

ModelWeights bind_weights(const ModelConfig& c, const Checkpoint& ckpt, const Placement* placement, int model_device) {
  // The config's sizes against the files before anything proportional to them is allocated: a
  // config claiming 4096 layers of 65536 experts for a small checkpoint fails here, in microseconds,
  // instead of allocating per-expert slots and a problem line per missing tensor. Small mismatches
  // (within 2x) go on to the binder, whose report lists the missing tensors by name.
  const int64_t implied = min_tensor_count(c);
  if (implied > 2 * static_cast<int64_t>(ckpt.all().size()) + 64)
    throw Error("checkpoint '" + ckpt.dir() + "' does not match its config: " + c.source + " (num_hidden_layers " +
                std::to_string(c.num_layers) + ", num_experts " + std::to_string(c.num_experts) +
                ") implies at least " + std::to_string(implied) + " tensors but the checkpoint holds " +
                std::to_string(ckpt.all().size()));
  ModelWeights mw;
  WeightBinder b(ckpt, mw.aligned_copies, placement, model_device);
  const std::string& P = c.tensor_prefix;
  const int64_t H = c.hidden_size;
  const bool attn_res = c.attn_res_block_size > 0;
  mw.embed = b.mat(P + "embed_tokens.weight", c.vocab_size, H);
  mw.lm_head = c.tie_word_embeddings ? mw.embed : b.mat(c.lm_head_name, c.vocab_size, H);
  mw.final_norm = b.vec(P + "norm.weight", H);
  if (attn_res) mw.out_res = bind_attn_res(b, P, "output_attn_res", H);
  mw.layers.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = mw.layers[static_cast<size_t>(l)];
    const std::string lp = P + "layers." + std::to_string(l) + ".";
    L.is_kda = c.is_kda[static_cast<size_t>(l)];
    L.is_moe = c.is_moe_layer(l);
    L.input_norm = b.vec(lp + "input_layernorm.weight", H);
    L.post_attn_norm = b.vec(lp + "post_attention_layernorm.weight", H);
    if (attn_res) {
      L.attn_res = bind_attn_res(b, lp, "self_attention_res", H);
      L.mlp_res = bind_attn_res(b, lp, "mlp_res", H);
    }
    if (L.is_kda)
      bind_kda(b, c, lp + "self_attn.", L.kda);
    else
      bind_mla(b, c, lp + "self_attn.", L.mla);
    if (L.is_moe)
      bind_moe(b, c, lp + "block_sparse_moe.", L.moe);
    else
      L.mlp = bind_glu(b, lp + "mlp.", H, c.intermediate_size);
  }
  b.check();
  mw.bound_bytes = b.bytes();
  mw.unused_tensors = b.unused_tensors();
  return mw;
}

namespace {
// The matrices of w (const or not), the routed experts' only when `routed`. A head tied to the token table is
// visited once in the full walk (the bytes it counts), as a matrix of its own in the dense one (its own second copy).
template <class Weights, class Fn>
void walk_matrices(Weights& w, bool routed, Fn&& fn) {
  auto glu = [&](auto& g) {
    fn(g.gate);
    fn(g.up);
    fn(g.down);
  };
  fn(w.embed);
  if (w.lm_head.data != w.embed.data || !routed) fn(w.lm_head);
  for (auto& L : w.layers) {
    if (L.is_kda) {
      for (auto* m : {&L.kda.q, &L.kda.k, &L.kda.v, &L.kda.f_a, &L.kda.f_b, &L.kda.b, &L.kda.g, &L.kda.g_a, &L.kda.g_b,
                      &L.kda.o})
        fn(*m);
    } else {
      for (auto* m : {&L.mla.q_a, &L.mla.q_b, &L.mla.q, &L.mla.kv_a, &L.mla.o, &L.mla.g}) fn(*m);
    }
    if (L.is_moe) {
      fn(L.moe.router);
      if (routed)
        for (auto& e : L.moe.experts) glu(e);
      glu(L.moe.shared);
      fn(L.moe.latent_down);
      fn(L.moe.latent_up);
    } else {
      glu(L.mlp);
    }
  }
}
}  // namespace

void for_each_matrix(const ModelWeights& w, const std::function<void(const WeightMatrix&)>& fn) { walk_matrices(w, true, fn); }

void for_each_dense_matrix(ModelWeights& w, const std::function<void(WeightMatrix&)>& fn) { walk_matrices(w, false, fn); }

void for_each_dense_matrix(const ModelWeights& w, const std::function<void(const WeightMatrix&)>& fn) {
  walk_matrices(w, false, fn);
}

int64_t matrix_bytes_on(const ModelWeights& w, int device) {
  int64_t b = 0;
  for_each_matrix(w, [&](const WeightMatrix& m) {
    if (!m.empty() && m.device == device) b += m.bytes();
  });
  return b;
}

}  // namespace k3
