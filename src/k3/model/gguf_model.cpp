#include "k3/model/gguf_model.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/model/gguf_names.h"
#include "k3/model/weights.h"
#include "k3/quant/gguf_quant.h"

namespace k3 {

using nlohmann::json;

namespace {

constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlBf16 = 30;

// Typed access to the metadata with messages naming the file and the key.
class Meta {
 public:
  Meta(const Gguf& g, std::string source) : g_(g), source_(std::move(source)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error("'" + source_ + "': GGUF metadata key '" + key + "': " + why);
  }
  bool has(const std::string& key) const { return g_.metadata.contains(key); }
  int type(const std::string& key) const { return g_.metadata_types.at(key).get<int>(); }
  int64_t integer(const std::string& key) const {
    if (!has(key)) fail(key, "required key is missing");
    const json& v = g_.metadata.at(key);
    if (!v.is_number_integer() || type(key) == 7) fail(key, "must be an integer, got " + type_name(key));
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{1} << 40) fail(key, "out of range: " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < 0 || x > int64_t{1} << 40) fail(key, "out of range: " + v.dump());
    return x;
  }
  int64_t integer_or(const std::string& key, int64_t dflt) const { return has(key) ? integer(key) : dflt; }
  double real(const std::string& key) const {
    if (!has(key)) fail(key, "required key is missing");
    if (type(key) != 6 && type(key) != 12) fail(key, "must be a float, got " + type_name(key));
    return g_.metadata.at(key).get<double>();
  }
  bool boolean_or(const std::string& key, bool dflt) const {
    if (!has(key)) return dflt;
    if (type(key) != 7) fail(key, "must be a bool, got " + type_name(key));
    return g_.metadata.at(key).get<bool>();
  }
  std::string string(const std::string& key) const {
    if (!has(key)) fail(key, "required key is missing");
    if (type(key) != 8) fail(key, "must be a string, got " + type_name(key));
    return g_.metadata.at(key).get<std::string>();
  }
  // An integer per layer (an array) or one for all (a scalar).
  std::vector<int64_t> per_layer(const std::string& key, int64_t layers) const {
    if (!has(key)) fail(key, "required key is missing");
    const json& v = g_.metadata.at(key);
    if (!v.is_array()) return std::vector<int64_t>(static_cast<size_t>(layers), integer(key));
    if (static_cast<int64_t>(v.size()) != layers)
      fail(key, "has " + std::to_string(v.size()) + " entries, block_count is " + std::to_string(layers));
    std::vector<int64_t> out;
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0) fail(key, "entries must be integers >= 0");
      out.push_back(e.get<int64_t>());
    }
    return out;
  }

 private:
  std::string type_name(const std::string& key) const {
    static const char* names[] = {"UINT8", "INT8",  "UINT16", "INT16", "UINT32", "INT32", "FLOAT32",
                                  "BOOL",  "STRING", "ARRAY", "UINT64", "INT64", "FLOAT64"};
    const int t = type(key);
    return t >= 0 && t <= 12 ? names[t] : "?";
  }
  const Gguf& g_;
  std::string source_;
};

bool has_tensor(const Gguf& g, const std::string& name) { return g.find(name) != nullptr; }

// The first layer of a kind (KDA / MLA / MoE), -1 if none.
int64_t first_layer(const std::vector<bool>& is_kda, bool kda) {
  for (size_t l = 0; l < is_kda.size(); ++l)
    if (is_kda[l] == kda) return static_cast<int64_t>(l);
  return -1;
}

}  // namespace

ModelConfig gguf_model_config(const Gguf& g, const std::string& source) {
  const Meta m(g, source);
  const std::string arch = m.string("general.architecture");
  if (arch != "kimi-k3" && arch != "kimi-linear")
    m.fail("general.architecture", "unknown architecture '" + arch + "' (supported: kimi-k3, kimi-linear)");
  const bool k3 = arch == "kimi-k3";
  const std::string A = arch + ".";
  json t;
  const int64_t layers = m.integer(A + "block_count");
  if (layers < 1 || layers > 4096) m.fail(A + "block_count", "must be in 1..4096, got " + std::to_string(layers));
  if (m.has(A + "vocab_size")) {
    t["vocab_size"] = m.integer(A + "vocab_size");
  } else if (const GgufTensor* e = g.find("token_embd.weight"); e && e->dims.size() == 2) {
    t["vocab_size"] = e->dims[1];
  } else {
    m.fail(A + "vocab_size", "required key is missing (and no 2-D token_embd.weight to read it from)");
  }
  t["hidden_size"] = m.integer(A + "embedding_length");
  t["num_hidden_layers"] = layers;
  if (m.has(A + "attention.head_count") && g.metadata.at(A + "attention.head_count").is_array())
    m.fail(A + "attention.head_count", "per-layer head counts are not supported");
  const int64_t heads = m.integer(A + "attention.head_count");
  t["num_attention_heads"] = heads;
  t["intermediate_size"] = m.integer(A + "feed_forward_length");
  t["rms_norm_eps"] = m.real(A + "attention.layer_norm_rms_epsilon");
  t["tie_word_embeddings"] = !has_tensor(g, "output.weight");
  if (k3) {
    t["hidden_act"] = "situ";
    t["activation_situ_beta"] = m.real(A + "activation.situ_beta");
    t["activation_situ_linear_beta"] = m.real(A + "activation.situ_linear_beta");
  } else {
    t["hidden_act"] = "silu";
  }
  // MLA
  t["q_lora_rank"] = m.integer_or(A + "attention.q_lora_rank", 0);
  t["kv_lora_rank"] = m.integer(A + "attention.kv_lora_rank");
  const int64_t rope = m.integer(A + "rope.dimension_count"), kmla = m.integer(A + "attention.key_length_mla");
  if (kmla <= rope)
    m.fail(A + "attention.key_length_mla", "must exceed rope.dimension_count (" + std::to_string(rope) + "), got " +
                                               std::to_string(kmla));
  t["qk_rope_head_dim"] = rope;
  t["qk_nope_head_dim"] = kmla - rope;
  t["v_head_dim"] = m.integer(A + "attention.value_length_mla");
  t["mla_use_nope"] = true;
  if (m.has(A + "attention.mla_norm_epsilon")) t["mla_norm_eps"] = m.real(A + "attention.mla_norm_epsilon");  // k3's own key
  // Layer kinds: n_head_kv 0 marks a KDA layer (llama.cpp's convention); lists are 1-based as in config.json.
  const std::vector<int64_t> kv = m.per_layer(A + "attention.head_count_kv", layers);
  std::vector<bool> is_kda;
  json kda = json::array(), full = json::array();
  for (int64_t l = 0; l < layers; ++l) {
    is_kda.push_back(kv[static_cast<size_t>(l)] == 0);
    (is_kda.back() ? kda : full).push_back(l + 1);
  }
  json la;
  la["kda_layers"] = kda;
  la["full_attn_layers"] = full;
  la["num_heads"] = m.integer_or(A + "kda.head_count", heads);  // k3's own key; llama.cpp uses head_count
  la["head_dim"] = m.integer(A + "kda.head_dim");
  la["short_conv_kernel_size"] = m.integer(A + "ssm.conv_kernel");
  if (k3 || m.has(A + "kda.gate_lower_bound")) la["gate_lower_bound"] = m.real(A + "kda.gate_lower_bound");
  const int64_t first_kda = first_layer(is_kda, true), first_mla = first_layer(is_kda, false);
  const auto blk = [](int64_t l, const char* n) { return "blk." + std::to_string(l) + "." + n; };
  if (k3) {
    la["use_full_rank_gate"] = first_kda >= 0 && has_tensor(g, blk(first_kda, "ssm_g.weight"));
    t["mla_use_output_gate"] = first_mla >= 0 && has_tensor(g, blk(first_mla, "attn_gate.weight"));
  }
  t["linear_attn_config"] = la;
  // MoE
  const int64_t dense = m.integer_or(A + "leading_dense_block_count", 0);
  t["first_k_dense_replace"] = dense;
  t["moe_layer_freq"] = m.integer_or(A + "moe_layer_freq", 1);  // k3's own key (llama.cpp: every layer after the dense ones)
  t["num_experts"] = m.integer(A + "expert_count");
  t["num_experts_per_token"] = m.integer(A + "expert_used_count");
  t["num_shared_experts"] = m.integer(A + "expert_shared_count");
  t["moe_intermediate_size"] = m.integer(A + "expert_feed_forward_length");
  t["routed_scaling_factor"] = m.real(A + "expert_weights_scale");
  t["moe_renormalize"] = m.boolean_or(A + "expert_weights_norm", true);
  if (const int64_t f = m.integer(A + "expert_gating_func"); f != 2)
    m.fail(A + "expert_gating_func", "unsupported gating function " + std::to_string(f) + " (supported: 2, sigmoid)");
  if (k3) {
    t["routed_expert_hidden_size"] = m.integer_or(A + "expert_latent_length", 0);
    t["latent_moe_use_norm"] = dense < layers && has_tensor(g, blk(dense, "ffn_routed_norm.weight"));
    t["attn_res_block_size"] = m.integer(A + "attn_res.block_size");
  }
  if (m.has(A + "context_length")) t["max_position_embeddings"] = m.integer(A + "context_length");
  json top = json::object();
  json& ids = k3 ? top : t;
  for (const auto& [key, hf] : {std::pair{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                std::pair{"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                std::pair{"tokenizer.ggml.padding_token_id", "pad_token_id"}})
    if (m.has(key)) ids[hf] = m.integer(key);
  if (k3) {
    top["model_type"] = "kimi_k3";
    top["text_config"] = t;
  } else {
    top = t;
    top["model_type"] = "kimi_linear";
  }
  // The hyper-parameters' ranges and consistency are config.json's rules (model/config.cpp); its messages
  // name config.json keys, so the source says where they came from.
  ModelConfig c = parse_model_config(top.dump(), source + " (metadata as config.json keys: docs/gguf.md)");
  c.source = source;
  // Routed experts: as their GGUF type says (MXFP4 in ggml's block, or floats bound as stored). The gate's
  // format stands for the stack; up and down may differ (llama-quantize falls back to Q5_0 / Q8_0 for a down
  // projection whose intermediate width is not whole 256-blocks), and each stacked tensor's width is checked
  // against its own format where the tensors are adapted.
  if (dense < layers) {
    const GgufTensor* e = g.find(blk(dense, "ffn_gate_exps.weight"));
    if (const auto f = e ? block_format_of_ggml_type(e->type) : std::nullopt) {
      c.expert_quant_format = *f;
      const int64_t be = weight_layout(*f).block_elems;
      if (c.expert_in_dim() % be)
        throw Error("'" + source + "': " + weight_format_name(*f) + " expert gates need an expert input size divisible by " +
                    std::to_string(be));
    }
  }
  return c;
}

namespace {

// What the adapted checkpoint owns: the small tensors rebuilt from the file (and, through open_gguf_model,
// the mapped file itself).
struct Owner {
  std::vector<std::vector<uint8_t>>& buffers;
  const uint8_t* keep(std::vector<uint8_t> b) {
    buffers.push_back(std::move(b));
    return buffers.back().data();
  }
};
struct FileOwner {
  std::unique_ptr<GgufFile> file;
  std::vector<std::vector<uint8_t>> buffers;
};

std::optional<DType> float_dtype(uint32_t ggml_type) {
  switch (ggml_type) {
    case kGgmlF32: return DType::F32;
    case kGgmlF16: return DType::F16;
    case kGgmlBf16: return DType::BF16;
    default: return std::nullopt;
  }
}

std::string type_name(uint32_t ggml_type) {
  const auto info = ggml_type_info(ggml_type);
  std::string n = info ? info->name : "type " + std::to_string(ggml_type);
  std::transform(n.begin(), n.end(), n.begin(), ::toupper);
  return n;
}

std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "ne [";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

// A vector-like tensor (every dimension but one is 1) as a 1-D shape; anything else reversed as is.
std::vector<int64_t> hf_shape(const GgufTensor& t, bool flatten_vector) {
  std::vector<int64_t> s(t.dims.rbegin(), t.dims.rend());
  if (flatten_vector && std::count_if(s.begin(), s.end(), [](int64_t d) { return d != 1; }) <= 1) return {t.elements()};
  return s;
}

class Adapter {
 public:
  Adapter(const ModelConfig& c, const Gguf& g, const std::string& path, Owner& own)
      : c_(c), g_(g), path_(path), own_(own) {}

  std::vector<TensorInfo> run() {
    for (const GgufTensor& t : g_.tensors) {
      const auto m = gguf_to_hf(c_, t.name);
      if (!m) {
        add(t.name, t, DType::U8, {static_cast<int64_t>(t.bytes)});  // unused by the model: counted as such
        continue;
      }
      if (m->kind == GgufTensorKind::Experts) {
        experts(t, m->hf);
        continue;
      }
      const auto dt = float_dtype(t.type);
      if (!dt) {
        const auto bf = block_format_of_ggml_type(t.type);
        if (bf && m->kind == GgufTensorKind::Rename && t.dims.size() == 2) {  // a quantised matrix: bound as stored
          add_raw(m->hf, DType::U8, {t.dims[1], static_cast<int64_t>(t.bytes) / t.dims[1]}, t.data, t.bytes, bf);
          continue;
        }
        if (bf && (m->kind == GgufTensorKind::KvbK || m->kind == GgufTensorKind::KvbV) && quant::is_gguf_block_format(*bf)) {
          (m->kind == GgufTensorKind::KvbK ? kvb_[m->hf].first : kvb_[m->hf].second) = &t;
          continue;
        }
        problem("tensor '" + t.name + "' is " + type_name(t.type) +
                ", which k3 cannot load there yet (vectors and conv taps: F32, F16, BF16)");
        continue;
      }
      switch (m->kind) {
        case GgufTensorKind::ConvTaps: add(m->hf, t, *dt, conv_shape(t)); break;
        case GgufTensorKind::NegExpALog:
          add(m->hf.substr(0, m->hf.size() - 5) + kNegExpALogName, t, *dt, hf_shape(t, true));
          break;
        case GgufTensorKind::ResScore: res_score(t, *dt, m->hf, m->hf_extra); break;
        case GgufTensorKind::KvbK: kvb_[m->hf].first = &t; break;
        case GgufTensorKind::KvbV: kvb_[m->hf].second = &t; break;
        default: add(m->hf, t, *dt, hf_shape(t, t.dims.size() == 1)); break;
      }
    }
    for (const auto& [name, kv] : kvb_) kv_b(name, kv.first, kv.second);
    if (!problems_.empty()) {
      std::ostringstream os;
      os << "'" << path_ << "': cannot load this GGUF (" << problems_.size() << " problem" << (problems_.size() > 1 ? "s" : "") << "):";
      for (size_t i = 0; i < problems_.size() && i < 20; ++i) os << "\n  " << problems_[i];
      if (problems_.size() > 20) os << "\n  ... and " << problems_.size() - 20 << " more";
      throw Error(os.str());
    }
    return std::move(out_);
  }

 private:
  void problem(std::string p) { problems_.push_back(std::move(p)); }
  void add(const std::string& name, const GgufTensor& t, DType dt, std::vector<int64_t> shape) {
    add_raw(name, dt, std::move(shape), t.data, t.bytes);
  }
  void add_raw(const std::string& name, DType dt, std::vector<int64_t> shape, const uint8_t* data, uint64_t bytes,
               std::optional<WeightFormat> block = std::nullopt) {
    TensorInfo i;
    i.block_format = block;
    i.name = name;
    i.dtype = dt;
    i.shape = std::move(shape);
    i.data = data;
    i.nbytes = static_cast<size_t>(bytes);
    i.file = path_;
    out_.push_back(std::move(i));
  }

  // ggml ne [W, 1, C, 1] (or [W, 1, C], [W, C]) -> [C][W], the taps of a channel contiguous in both.
  static std::vector<int64_t> conv_shape(const GgufTensor& t) {
    const auto& d = t.dims;
    const bool ok = (d.size() == 2) || (d.size() == 3 && d[1] == 1) || (d.size() == 4 && d[1] == 1 && d[3] == 1);
    if (!ok) return hf_shape(t, false);
    return {t.elements() / d[0], d[0]};
  }

  // The fused AttnRes vector as the norm half and ones as the proj half: the binder's norm * proj is then
  // the fused value times 1.0f, the same bits.
  void res_score(const GgufTensor& t, DType dt, const std::string& norm, const std::string& proj) {
    add(norm, t, dt, hf_shape(t, true));
    std::vector<uint8_t> ones(static_cast<size_t>(t.elements()) * 4);
    for (size_t i = 0; i < ones.size(); i += 4) {
      const float one = 1.0f;
      std::memcpy(ones.data() + i, &one, 4);
    }
    const size_t n = ones.size();
    add_raw(proj, DType::F32, {t.elements()}, own_.keep(std::move(ones)), n);
  }

  // Stacked experts ne [cols, rows, E]: one view per expert, as the binder names them.
  void experts(const GgufTensor& t, const std::string& pattern) {
    const int64_t E = c_.num_experts;
    if (t.dims.size() != 3 || t.dims[2] != E) {
      problem("tensor '" + t.name + "': " + dims_str(t.dims) + ", expected 3 dimensions with " + std::to_string(E) +
              " experts last (expert_count)");
      return;
    }
    const int64_t rows = t.dims[1], cols = t.dims[0];
    const uint64_t per = t.bytes / static_cast<uint64_t>(E);
    const size_t at = pattern.find("{e}");
    DType dt = DType::U8;
    std::vector<int64_t> shape;
    if (const auto bf = block_format_of_ggml_type(t.type)) {
      if (cols % weight_layout(*bf).block_elems) {
        problem("tensor '" + t.name + "': " + dims_str(t.dims) + " in " + weight_format_name(*bf) + " blocks of " +
                std::to_string(weight_layout(*bf).block_elems));
        return;
      }
      shape = {rows, row_data_bytes(*bf, cols)};
    } else if (const auto f = float_dtype(t.type)) {
      dt = *f;
      shape = {rows, cols};
    } else {
      problem("tensor '" + t.name + "' is " + type_name(t.type) +
              ", which k3 cannot load yet (routed experts: F32, F16, BF16, MXFP4 and the GGUF block formats)");
      return;
    }
    const auto bf = block_format_of_ggml_type(t.type);
    for (int64_t e = 0; e < E; ++e) {
      const std::string name = pattern.substr(0, at) + std::to_string(e) + pattern.substr(at + 3);
      add_raw(name, dt, shape, t.data + static_cast<uint64_t>(e) * per, per, bf);
    }
  }

  // One half of kv_b as fp32 values in its stored order (block formats through their decoders; F32 / F16 /
  // BF16 widened exactly).
  static std::vector<float> half_as_f32(const GgufTensor& t) {
    std::vector<float> out(static_cast<size_t>(t.elements()));
    if (const auto bf = block_format_of_ggml_type(t.type)) {
      quant::dequantize_row(*bf, t.data, t.elements(), out.data());
      return out;
    }
    const DType dt = *float_dtype(t.type);
    for (size_t i = 0; i < out.size(); ++i) {
      if (dt == DType::F32) {
        std::memcpy(&out[i], t.data + 4 * i, 4);
      } else {
        uint16_t h;
        std::memcpy(&h, t.data + 2 * i, 2);
        out[i] = dt == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
    }
    return out;
  }

  // kv_b [heads * (nope + v)][kv_lora] from attn_k_b [heads][kv_lora][nope] (transposed per head) and attn_v_b
  // [heads][v][kv_lora]: an element copy in the stored type (kv_b is small and the binder copies it anyway).
  void kv_b(const std::string& name, const GgufTensor* k, const GgufTensor* v) {
    const std::string blk = hf_to_gguf(c_, name).value_or(name);
    const std::string lp = blk.substr(0, blk.size() - std::string("attn_k_b.weight").size());
    if (!k || !v) {
      problem("tensor '" + lp + (k ? "attn_v_b" : "attn_k_b") + ".weight' is missing (attn_k_b and attn_v_b together are kv_b)");
      return;
    }
    const int64_t nh = c_.mla_heads, kr = c_.kv_lora_rank, dn = c_.qk_nope_dim, dv = c_.v_head_dim;
    const std::vector<int64_t> kd{dn, kr, nh}, vd{kr, dv, nh};
    const auto loadable = [](const GgufTensor* t) { return block_format_of_ggml_type(t->type) || float_dtype(t->type); };
    if (k->dims != kd || v->dims != vd || !loadable(k) || !loadable(v)) {
      problem("tensors '" + k->name + "' " + type_name(k->type) + " " + dims_str(k->dims) + " and '" + v->name + "' " +
              type_name(v->type) + " " + dims_str(v->dims) + ": expected " + dims_str(kd) + ", " + dims_str(vd) +
              " (nope, kv_lora_rank, heads / kv_lora_rank, v_head, heads) in float or block formats");
      return;
    }
    // Halves of one float type are copied as stored. Otherwise (quantised halves, or two types: llama-quantize's
    // Q4_K_M writes attn_k_b, whose rows are 128 wide, as Q5_0 / Q8_0 beside a Q4_K attn_v_b) each half is
    // dequantised to F32: kv_b is small, and the binder keeps an fp32 copy of it anyway.
    std::vector<float> kf, vf;
    const uint8_t* kdata = k->data;
    const uint8_t* vdata = v->data;
    DType dt = DType::F32;
    if (k->type == v->type && !block_format_of_ggml_type(k->type)) {
      dt = *float_dtype(k->type);
    } else {
      kf = half_as_f32(*k);
      vf = half_as_f32(*v);
      kdata = reinterpret_cast<const uint8_t*>(kf.data());
      vdata = reinterpret_cast<const uint8_t*>(vf.data());
    }
    const size_t es = dtype_size(dt);
    std::vector<uint8_t> out(static_cast<size_t>(nh * (dn + dv) * kr) * es);
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < dn; ++i)
        for (int64_t col = 0; col < kr; ++col)
          std::memcpy(&out[static_cast<size_t>((h * (dn + dv) + i) * kr + col) * es],
                      kdata + static_cast<size_t>((h * kr + col) * dn + i) * es, es);
      std::memcpy(&out[static_cast<size_t>((h * (dn + dv) + dn) * kr) * es], vdata + static_cast<size_t>(h * dv * kr) * es,
                  static_cast<size_t>(dv * kr) * es);
    }
    const size_t n = out.size();
    add_raw(name, dt, {nh * (dn + dv), kr}, own_.keep(std::move(out)), n);
    // Quantised halves are also offered as stored (MlaWeights::k_b_blocks / v_b_blocks): the CPU's absorbed decode
    // reads them instead of the fp32 rebuild, and `k3 convert` writes them back unchanged.
    const auto bk = block_format_of_ggml_type(k->type), bv = block_format_of_ggml_type(v->type);
    if (bk && bv) {
      const std::string sp = name.substr(0, name.size() - std::string("kv_b_proj.weight").size());
      add_raw(sp + kKvbKeyBlocksName, DType::U8, {nh * kr, static_cast<int64_t>(k->bytes) / (nh * kr)}, k->data, k->bytes, bk);
      add_raw(sp + kKvbValueBlocksName, DType::U8, {nh * dv, static_cast<int64_t>(v->bytes) / (nh * dv)}, v->data, v->bytes, bv);
    }
  }

  const ModelConfig& c_;
  const Gguf& g_;
  std::string path_;
  Owner& own_;
  std::vector<TensorInfo> out_;
  std::vector<std::string> problems_;
  std::map<std::string, std::pair<const GgufTensor*, const GgufTensor*>> kvb_;
};

}  // namespace

std::vector<TensorInfo> gguf_tensors_as_hf(const ModelConfig& c, const Gguf& g, const std::string& source,
                                           std::vector<std::vector<uint8_t>>& keep) {
  Owner own{keep};
  return Adapter(c, g, source, own).run();
}

GgufModel open_gguf_model(const std::string& path) {
  auto own = std::make_shared<FileOwner>();
  own->file = std::make_unique<GgufFile>(path);
  const Gguf& g = own->file->gguf();
  GgufModel m;
  m.config = gguf_model_config(g, path);
  if (g.metadata.contains("general.name") && g.metadata["general.name"].is_string()) m.name = g.metadata["general.name"];
  std::vector<TensorInfo> tensors = gguf_tensors_as_hf(m.config, g, path, own->buffers);
  const ModelConfig cfg = m.config;
  m.checkpoint = std::make_unique<Checkpoint>(
      path, std::move(tensors), std::vector<const MappedFile*>{&own->file->mapping()}, own,
      [cfg](const std::string& hf) {
        const auto n = hf_to_gguf(cfg, hf);
        return n ? " (GGUF '" + *n + "')" : std::string();
      });
  return m;
}

bool is_gguf_path(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

}  // namespace k3
