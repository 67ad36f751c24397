#include "k3/model/weights.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>

#include "k3/backend/cpu/ops.h"
#include "k3/core/error.h"
#include "k3/io/page_cache.h"

namespace k3 {

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Looks tensors up, checks them, and collects every problem before failing once.
class Binder {
 public:
  Binder(const Checkpoint& ck, std::vector<std::vector<uint8_t>>& copies, const Placement* placement, int model_device)
      : ck_(ck), copies_(copies), placement_(placement), model_device_(model_device) {}

  // The home of matrix `name` (model/placement.h).
  int device_for(const std::string& name) const {
    return placement_ ? placement_->device_of(name, model_device_) : model_device_;
  }

  WeightMatrix mat(const std::string& name, int64_t rows, int64_t cols) {
    const TensorInfo* t = get(name, "F32/BF16/F16 " + shape_str({rows, cols}));
    if (!t) return {};
    if (t->block_format) return block_matrix(name, t, *t->block_format, rows, cols);
    if (!is_float_dtype(t->dtype)) return bad(name, t, "dtype " + std::string(dtype_name(t->dtype)) + ", expected F32/BF16/F16");
    if (t->shape != std::vector<int64_t>{rows, cols}) return bad(name, t, "shape " + t->shape_str() + ", expected " + shape_str({rows, cols}));
    WeightMatrix w;
    float_weight_format(t->dtype, &w.format);
    w.data = aligned(t);
    w.rows = rows;
    w.cols = cols;
    w.device = device_for(name);
    bytes_ += static_cast<int64_t>(t->nbytes);
    return w;
  }

  // A matrix a GGUF stores in a block format with in-block scales (TensorInfo::block_format).
  WeightMatrix block_matrix(const std::string& name, const TensorInfo* t, WeightFormat f, int64_t rows, int64_t cols) {
    const int64_t be = weight_layout(f).block_elems;
    if (cols % be != 0)
      return bad(name, t, std::string(weight_format_name(f)) + " with " + std::to_string(cols) + " columns, not a multiple of its " +
                              std::to_string(be) + "-element blocks");
    const std::vector<int64_t> want{rows, row_data_bytes(f, cols)};
    if (t->dtype != DType::U8 || t->shape != want)
      return bad(name, t, std::string(weight_format_name(f)) + " blocks " + t->shape_str() + ", expected " + shape_str(want) +
                              " for " + shape_str({rows, cols}));
    WeightMatrix w;
    w.format = f;
    w.data = t->data;
    w.rows = rows;
    w.cols = cols;
    w.device = device_for(name);
    bytes_ += static_cast<int64_t>(t->nbytes);
    return w;
  }

  // A block format as a compressed-tensors pair (MXFP4: mxfp4-pack-quantized): <base>.weight_packed U8
  // [rows, row_data_bytes] + <base>.weight_scale U8 [rows, row_scale_bytes] (core/weight_format.h).
  // A format with its scales inside the blocks (MXFP4_GGML from a GGUF) is one tensor: <base>.weight U8
  // [rows, row_data_bytes].
  WeightMatrix packed(const std::string& base, WeightFormat format, int64_t rows, int64_t cols) {
    // A GGUF's stacked experts may mix block formats across gate / up / down (k3 quantize keeps a matrix
    // whose width is not whole blocks of the target type as shipped): the tensor's own format wins.
    if (const TensorInfo* t = ck_.find(base + ".weight"); t && t->block_format) format = *t->block_format;
    const std::vector<int64_t> pshape{rows, row_data_bytes(format, cols)}, sshape{rows, row_scale_bytes(format, cols)};
    if (weight_layout(format).scale_bytes == 0) {
      const TensorInfo* p = get(base + ".weight", std::string(weight_format_name(format)) + " blocks, U8 " + shape_str(pshape));
      if (!p) return {};
      if (p->dtype != DType::U8 || p->shape != pshape)
        return bad(base + ".weight", p, std::string(dtype_name(p->dtype)) + " " + p->shape_str() + ", expected U8 " + shape_str(pshape));
      WeightMatrix w;
      w.format = format;
      w.device = device_for(base + ".weight");
      w.data = p->data;
      w.rows = rows;
      w.cols = cols;
      bytes_ += static_cast<int64_t>(p->nbytes);
      return w;
    }
    const TensorInfo* p = get(base + ".weight_packed", "U8 " + shape_str(pshape));
    const TensorInfo* s = get(base + ".weight_scale", "U8 " + shape_str(sshape));
    if (!p || !s) return {};
    bool ok = true;
    if (p->dtype != DType::U8 || p->shape != pshape) {
      bad(base + ".weight_packed", p, std::string(dtype_name(p->dtype)) + " " + p->shape_str() + ", expected U8 " + shape_str(pshape));
      ok = false;
    }
    if (s->dtype != DType::U8 || s->shape != sshape) {
      bad(base + ".weight_scale", s, std::string(dtype_name(s->dtype)) + " " + s->shape_str() + ", expected U8 " + shape_str(sshape));
      ok = false;
    }
    if (!ok) return {};
    if (format == WeightFormat::MXFP4 && !scales_are_finite(base + ".weight_scale", s, sshape[1])) return {};
    WeightMatrix w;
    w.format = format;
    w.device = device_for(base + ".weight");
    w.data = p->data;
    w.scales = s->data;
    w.rows = rows;
    w.cols = cols;
    bytes_ += static_cast<int64_t>(p->nbytes + s->nbytes);
    return w;
  }

  // Starts reading tensor `name` (if present) into the page cache: the scale checks of a layer's experts
  // then wait for exactly their bytes, issued together, instead of faulting one at a time with the
  // kernel's read-around, which on a large read_ahead_kb reads the whole checkpoint (docs/bigger-than-ram.md).
  bool has(const std::string& name) const { return ck_.find(name) != nullptr; }

  void prefetch(const std::string& name) {
    if (const TensorInfo* t = ck_.find(name)) prefetch_mapped(t->data, t->nbytes);
  }

  // A small float tensor converted to fp32; `shapes` lists the accepted shapes (first is the usual one).
  std::vector<float> vec(const std::string& name, const std::vector<std::vector<int64_t>>& shapes) {
    const TensorInfo* t = get(name, "F32/BF16/F16 " + shape_str(shapes[0]));
    if (!t) return {};
    if (!is_float_dtype(t->dtype)) {
      bad(name, t, "dtype " + std::string(dtype_name(t->dtype)) + ", expected F32/BF16/F16");
      return {};
    }
    bool ok = false;
    for (auto& s : shapes) ok |= (t->shape == s);
    if (!ok) {
      std::string exp;
      for (auto& s : shapes) exp += (exp.empty() ? "" : " or ") + shape_str(s);
      bad(name, t, "shape " + t->shape_str() + ", expected " + exp);
      return {};
    }
    std::vector<float> out(static_cast<size_t>(t->numel()));
    for (size_t i = 0; i < out.size(); ++i) {
      switch (t->dtype) {
        case DType::F32: { float f; std::memcpy(&f, t->data + 4 * i, 4); out[i] = f; break; }
        case DType::BF16: { uint16_t h; std::memcpy(&h, t->data + 2 * i, 2); out[i] = bf16_to_f32(h); break; }
        default: { uint16_t h; std::memcpy(&h, t->data + 2 * i, 2); out[i] = f16_to_f32(h); }
      }
    }
    bytes_ += static_cast<int64_t>(t->nbytes);
    return out;
  }
  std::vector<float> vec(const std::string& name, int64_t n) { return vec(name, {{n}}); }

  void finish(const std::string& prefix, const std::string& lm_head, ModelWeights& mw) {
    if (n_problems_ > 0) {
      std::ostringstream os;
      os << "checkpoint '" << ck_.dir() << "' does not match its config (" << n_problems_ << " problem"
         << (n_problems_ > 1 ? "s" : "") << "):";
      for (auto& p : problems_) os << "\n  " << p;
      if (n_problems_ > problems_.size()) os << "\n  ... and " << n_problems_ - problems_.size() << " more";
      throw Error(os.str());
    }
    int64_t unused = 0;
    for (auto& [name, t] : ck_.all())
      if (!used_.count(name)) ++unused;
    (void)prefix;
    (void)lm_head;
    mw.bound_bytes = bytes_;
    mw.unused_tensors = unused;
  }

 private:
  const TensorInfo* get(const std::string& name, const std::string& expect) {
    const TensorInfo* t = ck_.find(name);
    if (!t) {
      note("missing tensor '" + name + "'" + ck_.name_note(name) + " (expected " + expect + ")");
      return nullptr;
    }
    used_.insert(name);
    return t;
  }
  WeightMatrix bad(const std::string& name, const TensorInfo* t, const std::string& what) {
    note("tensor '" + name + "'" + ck_.name_note(name) + " in '" + t->file + "': " + what);
    return {};
  }
  // Keeps the first 20 problems for the message and counts the rest.
  void note(std::string problem) {
    if (problems_.size() < 20) problems_.push_back(std::move(problem));
    ++n_problems_;
  }

  // E8M0 0xFF is NaN in the OCP MX spec (v1.0, 5.4): every element of its block would decode to NaN
  // and turn the whole forward pass into NaN logits, silently. One memchr over the scale bytes
  // (1/17 of an MXFP4 matrix; measured in docs/testing.md) rejects it at load, naming the block.
  // On a full K3 (~85 GB of scales, read from disk the first time) this takes a while: a progress line
  // every 8 GB, so a long load does not look hung.
  bool scales_are_finite(const std::string& name, const TensorInfo* s, int64_t row_scale_bytes) {
    constexpr uint64_t kProgressBytes = uint64_t{8} << 30;
    if ((scanned_ + s->nbytes) / kProgressBytes > scanned_ / kProgressBytes)
      std::fprintf(stderr, "k3: checking MXFP4 scales: %.0f GB so far\n", double(scanned_ + s->nbytes) / 1e9);
    scanned_ += s->nbytes;
    const void* hit = std::memchr(s->data, 0xFF, s->nbytes);
    if (!hit) return true;
    const auto at = static_cast<int64_t>(static_cast<const uint8_t*>(hit) - s->data);
    bad(name, s, "E8M0 scale 255 (NaN in OCP MX) at row " + std::to_string(at / row_scale_bytes) + ", block " +
                     std::to_string(at % row_scale_bytes));
    return false;
  }

  // The tensor's data, or an aligned copy when the file places it at an address that is not a
  // multiple of its element size (reading it in place would be undefined behaviour).
  const void* aligned(const TensorInfo* t) {
    const size_t a = dtype_size(t->dtype);
    if (a <= 1 || reinterpret_cast<uintptr_t>(t->data) % a == 0) return t->data;
    copies_.emplace_back(t->data, t->data + t->nbytes);
    return copies_.back().data();
  }

  const Checkpoint& ck_;
  std::vector<std::vector<uint8_t>>& copies_;
  const Placement* placement_;
  int model_device_;
  std::vector<std::string> problems_;
  size_t n_problems_ = 0;
  uint64_t scanned_ = 0;  // MXFP4 scale bytes checked so far (progress line)
  std::set<std::string> used_;
  int64_t bytes_ = 0;
};

AttnResWeights bind_attn_res(Binder& b, const std::string& p, const std::string& stem, int64_t H) {
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

GluMlp bind_glu(Binder& b, const std::string& p, int64_t in, int64_t inter) {
  return {b.mat(p + "gate_proj.weight", inter, in), b.mat(p + "up_proj.weight", inter, in),
          b.mat(p + "down_proj.weight", in, inter)};
}

void bind_kda(Binder& b, const ModelConfig& c, const std::string& p, KdaWeights& w) {
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

void bind_mla(Binder& b, const ModelConfig& c, const std::string& p, MlaWeights& w) {
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
  w.o = b.mat(p + "o_proj.weight", H, nh * dv);
  if (c.mla_output_gate) w.g = b.mat(p + "g_proj.weight", nh * dv, H);
}

void bind_moe(Binder& b, const ModelConfig& c, const std::string& p, MoeWeights& w) {
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
  Binder b(ckpt, mw.aligned_copies, placement, model_device);
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
  b.finish(P, c.lm_head_name, mw);
  return mw;
}

void for_each_matrix(const ModelWeights& w, const std::function<void(const WeightMatrix&)>& fn) {
  auto glu = [&](const GluMlp& g) {
    fn(g.gate);
    fn(g.up);
    fn(g.down);
  };
  fn(w.embed);
  if (w.lm_head.data != w.embed.data) fn(w.lm_head);
  for (const LayerWeights& L : w.layers) {
    if (L.is_kda) {
      for (const WeightMatrix* m : {&L.kda.q, &L.kda.k, &L.kda.v, &L.kda.f_a, &L.kda.f_b, &L.kda.b, &L.kda.g, &L.kda.g_a,
                                    &L.kda.g_b, &L.kda.o})
        fn(*m);
    } else {
      for (const WeightMatrix* m : {&L.mla.q_a, &L.mla.q_b, &L.mla.q, &L.mla.kv_a, &L.mla.o, &L.mla.g}) fn(*m);
    }
    if (L.is_moe) {
      fn(L.moe.router);
      for (const GluMlp& e : L.moe.experts) glu(e);
      glu(L.moe.shared);
      fn(L.moe.latent_down);
      fn(L.moe.latent_up);
    } else {
      glu(L.mlp);
    }
  }
}

int64_t matrix_bytes_on(const ModelWeights& w, int device) {
  int64_t b = 0;
  for_each_matrix(w, [&](const WeightMatrix& m) {
    if (!m.empty() && m.device == device) b += m.bytes();
  });
  return b;
}

}  // namespace k3
