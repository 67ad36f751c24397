#include "k3/model/gguf_export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <regex>
#include <set>

#include "k3/core/error.h"
#include "k3/core/mxfp4_ggml.h"
#include "k3/model/gguf_names.h"
#include "k3/model/weights.h"
#include "k3/backend/cpu/ops.h"
#include "k3/core/thread_pool.h"
#include "k3/io/gguf.h"
#include "k3/model/imatrix.h"
#include "k3/quant/gguf_quant.h"

namespace k3 {

namespace {

// The 32-element type llama-quantize falls back to for a width that is not whole 256-element blocks.
WeightFormat fallback_format(WeightFormat f) {
  switch (f) {
    case WeightFormat::Q4_K: return WeightFormat::Q5_0;
    case WeightFormat::Q5_K: return WeightFormat::Q5_1;
    case WeightFormat::Q2_K:
    case WeightFormat::Q3_K:
    case WeightFormat::IQ4_XS:
    case WeightFormat::IQ3_S:  // the codebook i-quants: llama-quant.cpp's tensor_type_fallback gives IQ4_NL too
    case WeightFormat::IQ3_XXS:
    case WeightFormat::IQ2_S:
    case WeightFormat::IQ2_XS:
    case WeightFormat::IQ2_XXS:
    case WeightFormat::IQ1_M:
    case WeightFormat::IQ1_S: return WeightFormat::IQ4_NL;
    default: return WeightFormat::Q8_0;  // Q6_K and anything wider
  }
}

constexpr uint32_t kF32 = 0, kF16 = 1, kBf16 = 30, kMxfp4 = 39;

uint32_t ggml_type_of(DType t) {
  switch (t) {
    case DType::F32: return kF32;
    case DType::F16: return kF16;
    case DType::BF16: return kBf16;
    default: throw Error(std::string("k3 convert: no GGUF type for a ") + std::string(dtype_name(t)) + " tensor");
  }
}

// A float tensor's values as fp32 (the binder's conversion: exact widening).
std::vector<float> to_f32(const TensorInfo& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype) {
      case DType::F32: std::memcpy(&out[i], t.data + 4 * i, 4); break;
      case DType::BF16: { uint16_t h; std::memcpy(&h, t.data + 2 * i, 2); out[i] = bf16_to_f32(h); break; }
      case DType::F16: { uint16_t h; std::memcpy(&h, t.data + 2 * i, 2); out[i] = f16_to_f32(h); break; }
      default: throw Error("k3 convert: tensor '" + t.name + "' is not a float tensor");
    }
  }
  return out;
}

void add_f32(GgufWriter& w, const std::string& name, std::vector<int64_t> ne, std::vector<float> v) {
  auto data = std::make_shared<std::vector<float>>(std::move(v));
  w.add_tensor(name, std::move(ne), kF32, [data](GgufSink& s) { s.write(data->data(), data->size() * 4); });
}

// Rows of `src` (any format the CPU reads) quantised to f and written to s, in chunks of rows quantised in
// parallel on the compute pool (a K3-size export is hours on one thread) and written in order; memory is one
// chunk. Each row is the same bytes whatever the thread count (quantize_row is per row).
void write_quantised_rows(GgufSink& s, const WeightMatrix& src, WeightFormat f, const float* importance) {
  const int64_t rows = src.rows, cols = src.cols, rb = row_data_bytes(f, cols);
  const int64_t chunk = std::clamp<int64_t>((int64_t{32} << 20) / std::max<int64_t>(rb, 1), 1, rows);
  std::vector<uint8_t> out(static_cast<size_t>(chunk * rb));
  ThreadPool& pool = ThreadPool::global();
  std::vector<std::vector<float>> scratch(static_cast<size_t>(pool.size()), std::vector<float>(static_cast<size_t>(cols)));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk) {
    const int64_t n = std::min(chunk, rows - r0);
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e, int t) {
      float* row = scratch[static_cast<size_t>(t)].data();
      for (int64_t i = b; i < e; ++i) {
        cpu::dequant_row(src, r0 + i, row);
        quant::quantize_row(f, row, cols, importance, out.data() + i * rb);
      }
    });
    s.write(out.data(), static_cast<size_t>(n * rb));
  }
}

WeightFormat float_format(DType t) {
  return t == DType::BF16 ? WeightFormat::BF16 : t == DType::F16 ? WeightFormat::F16 : WeightFormat::F32;
}

void add_metadata(GgufWriter& w, const ModelConfig& c, const std::string& name, std::optional<uint32_t> file_type) {
  const bool k3 = c.arch == Arch::KimiK3;
  const std::string A = gguf_arch_name(c.arch) + ".";
  w.set_string("general.architecture", gguf_arch_name(c.arch));
  w.set_string("general.type", "model");
  w.set_string("general.name", name);
  w.set_u32(A + "block_count", static_cast<uint32_t>(c.num_layers));
  if (c.max_position_embeddings > 0 && c.max_position_embeddings <= int64_t{0xffffffff})  // a u32 key: never a wrapped value
    w.set_u32(A + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.set_u32(A + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.set_u32(A + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.set_u32(A + "attention.head_count", static_cast<uint32_t>(c.mla_heads));
  std::vector<int64_t> kv;
  for (bool kda : c.is_kda) kv.push_back(kda ? 0 : 1);  // MLA served as MQA (one KV head); 0 marks KDA
  w.set_array_i64(A + "attention.head_count_kv", GgufType::I32, kv);
  w.set_f32(A + "attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.set_u32(A + "expert_count", static_cast<uint32_t>(c.num_experts));
  w.set_u32(A + "expert_used_count", static_cast<uint32_t>(c.top_k));
  w.set_u32(A + "expert_group_used_count", 1);
  w.set_u32(A + "expert_gating_func", 2);  // sigmoid
  const bool mxfp4 = c.expert_quant_format.has_value();
  // A label (llama.cpp's llama_ftype, which its tools print): the preset's, else MOSTLY_MXFP4_MOE / MOSTLY_BF16.
  w.set_u32("general.file_type", file_type.value_or(mxfp4 ? 38 : 32));
  w.set_u32(A + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.set_u32(A + "ssm.conv_kernel", static_cast<uint32_t>(c.conv_kernel));
  w.set_u32(A + "kda.head_dim", static_cast<uint32_t>(c.kda_head_dim));
  if (c.gate_lower_bound) w.set_f32(A + "kda.gate_lower_bound", *c.gate_lower_bound);
  if (c.q_lora_rank > 0) w.set_u32(A + "attention.q_lora_rank", static_cast<uint32_t>(c.q_lora_rank));
  w.set_u32(A + "attention.kv_lora_rank", static_cast<uint32_t>(c.kv_lora_rank));
  w.set_u32(A + "rope.dimension_count", static_cast<uint32_t>(c.qk_rope_dim));
  w.set_u32(A + "attention.key_length", static_cast<uint32_t>(c.kv_lora_rank + c.qk_rope_dim));
  if (k3) w.set_u32(A + "attention.value_length", static_cast<uint32_t>(c.kv_lora_rank));
  w.set_u32(A + "attention.key_length_mla", static_cast<uint32_t>(c.mla_qk_dim()));
  w.set_u32(A + "attention.value_length_mla", static_cast<uint32_t>(c.v_head_dim));
  w.set_u32(A + "expert_feed_forward_length", static_cast<uint32_t>(c.moe_intermediate_size));
  w.set_u32(A + "expert_shared_count", static_cast<uint32_t>(c.num_shared_experts));
  w.set_u32(A + "leading_dense_block_count", static_cast<uint32_t>(c.first_k_dense));
  w.set_f32(A + "expert_weights_scale", c.routed_scaling_factor);
  if (k3 || !c.moe_renormalize) w.set_bool(A + "expert_weights_norm", c.moe_renormalize);
  if (k3) {
    if (c.routed_hidden_size > 0) w.set_u32(A + "expert_latent_length", static_cast<uint32_t>(c.routed_hidden_size));
    w.set_f32(A + "activation.situ_beta", c.situ_beta);
    w.set_f32(A + "activation.situ_linear_beta", c.situ_linear_beta);
    w.set_u32(A + "attn_res.block_size", static_cast<uint32_t>(c.attn_res_block_size));
  }
  // k3's own keys, only where the model differs from what llama.cpp assumes (docs/gguf.md).
  if (c.kda_heads != c.mla_heads) w.set_u32(A + "kda.head_count", static_cast<uint32_t>(c.kda_heads));
  if (c.mla_norm_eps != c.rms_norm_eps) w.set_f32(A + "attention.mla_norm_epsilon", c.mla_norm_eps);
  if (c.moe_layer_freq != 1) w.set_u32(A + "moe_layer_freq", static_cast<uint32_t>(c.moe_layer_freq));
  w.set_u32("general.quantization_version", 2);
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", c.bos_token_id},
                                std::pair{"tokenizer.ggml.eos_token_id", c.eos_token_id},
                                std::pair{"tokenizer.ggml.padding_token_id", c.pad_token_id}})
    if (id >= 0) w.set_u32(key, static_cast<uint32_t>(id));
}

// Writes the tensors; `used` collects the HF names consumed.
class TensorExport {
 public:
  TensorExport(GgufWriter& w, const ModelConfig& c, const Checkpoint& ck, const std::vector<TensorTypeRule>& rules,
               const Imatrix* im)
      : w_(w), c_(c), ck_(ck), im_(im) {
    for (const TensorTypeRule& r : rules) {
      try {
        rules_.emplace_back(std::regex(r.pattern), r.format);
        patterns_.push_back(r.pattern);
      } catch (const std::regex_error& e) {
        throw Error("--tensor-type '" + r.pattern + "': not a regular expression (" + e.what() + ")");
      }
    }
    rule_hits_.assign(rules.size(), 0);
  }

  void run() {
    const auto ends = [](const std::string& s, const std::string& e) {
      return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
    };
    for (const auto& [name, t] : ck_.all()) {
      if (used_.count(name)) continue;
      // MXFP4 experts are <base>.weight_packed + .weight_scale; their GGUF name is that of <base>.weight.
      std::string canonical = name;
      for (const char* sfx : {".weight_packed", ".weight_scale"})
        if (ends(name, sfx)) canonical = name.substr(0, name.size() - std::string(sfx).size()) + ".weight";
      // A GGUF input's ssm_a is -exp(A_log) already (weights.h kNegExpALogName): named for its A_log.
      const bool neg_exp = ends(name, kNegExpALogName);
      if (neg_exp) canonical = name.substr(0, name.size() - std::string(kNegExpALogName).size()) + "A_log";
      const auto g = hf_to_gguf(c_, canonical);
      if (!g) continue;
      if (name.find(".experts.") != std::string::npos) experts_of(*g, name);
      else if (ends(name, "conv1d.weight")) conv(*g, *t);
      else if (neg_exp) neg_exp_a(*g, *t);
      else if (ends(name, ".A_log")) a_log(*g, *t);
      else if (name.find("_res_norm.") != std::string::npos || name.find("_res_proj.") != std::string::npos) res(*g, name);
      else if (ends(name, "kv_b_proj.weight")) kv_b(*g, *t);
      else plain(*g, *t);
    }
  }
  const std::set<std::string>& used() const { return used_; }
  int64_t tensors() const { return tensors_; }
  int64_t quantised() const { return quantised_; }
  int64_t fallbacks() const { return fallbacks_; }
  int64_t with_importance() const { return with_importance_; }
  const std::vector<int64_t>& rule_hits() const { return rule_hits_; }

 private:
  const TensorInfo& need(const std::string& name) {
    const TensorInfo* t = ck_.find(name);
    if (!t) throw Error("k3 convert: '" + ck_.dir() + "' has no tensor '" + name + "'");
    used_.insert(name);
    return *t;
  }
  // A rename: ne = the HF shape reversed; vectors (one non-unit dimension) as F32, as the converter writes them.
  void plain(const std::string& g, const TensorInfo& t) {
    used_.insert(t.name);
    ++tensors_;
    std::vector<int64_t> ne(t.shape.rbegin(), t.shape.rend());
    int64_t non_unit = 0;
    for (int64_t d : t.shape) non_unit += d != 1;
    if (non_unit <= 1) return add_f32(w_, g, {t.numel()}, to_f32(t));
    // The router is written F32 as the converter does (its "always F32" list; llama.cpp's graph reads it so).
    // Exact widening; on the CPU the F32 and BF16 kernels give the same bits for the same values
    // (one loop, weight_simd.h), outside the opt-in avx512bf16 tier.
    if (g.size() >= 19 && g.compare(g.size() - 19, 19, "ffn_gate_inp.weight") == 0) return add_f32(w_, g, ne, to_f32(t));
    const TensorInfo* tp = &t;
    if (t.block_format) return stored_blocks(g, t, rule_for(g));
    if (const auto f = rule_for(g)) return quantised(g, t, ne, *f);
    w_.add_tensor(g, ne, ggml_type_of(t.dtype), [tp](GgufSink& s) { s.write(tp->data, tp->nbytes); });
  }
  // A dense matrix that a GGUF input already holds in a block format: written as stored (ne [cols, rows]).
  // Requantising it would compound two roundings, so a rule naming another type is an error (as
  // llama-quantize without --allow-requantize); quantise from the BF16 GGUF or the HF directory instead.
  static void refuse_requantise(const std::string& g, WeightFormat bf, std::optional<WeightFormat> wanted) {
    if (wanted && *wanted != bf)
      throw Error("--tensor-type: '" + g + "' is already " + weight_format_name(bf) + " in the input; k3 does not requantise (" +
                  "quantise from a BF16 GGUF or the HF directory, or keep it with '" + g + "=keep')");
  }
  void stored_blocks(const std::string& g, const TensorInfo& t, std::optional<WeightFormat> wanted) {
    const WeightFormat bf = *t.block_format;
    refuse_requantise(g, bf, wanted);
    const int64_t cols = t.shape[1] / weight_layout(bf).block_bytes * weight_layout(bf).block_elems;
    const TensorInfo* tp = &t;
    w_.add_tensor(g, {cols, t.shape[0]}, *ggml_type_of_block_format(bf), [tp](GgufSink& s) { s.write(tp->data, tp->nbytes); });
  }
  // Routed experts are quantised only by a rule whose pattern names them ("exps"): a catch-all like ".*"
  // must not requantise the experts' shipped MXFP4 (their QAT format) into something no better.
  std::optional<WeightFormat> expert_rule_for(const std::string& g) {
    for (size_t i = 0; i < rules_.size(); ++i)
      if (patterns_[i].find("exps") != std::string::npos && std::regex_search(g, rules_[i].first)) {
        ++rule_hits_[i];
        return rules_[i].second;
      }
    return std::nullopt;
  }
  // A layer's stacked experts, each row dequantised from the stored format and quantised to f (per-expert
  // imatrix weights when given), expert by expert as the file is written.
  void quantised_experts(const std::string& g, std::vector<const TensorInfo*> data, std::vector<const TensorInfo*> scales,
                         int64_t rows, int64_t cols, WeightFormat f) {
    ++quantised_;
    std::vector<WeightMatrix> mats;
    for (size_t e = 0; e < data.size(); ++e) {
      WeightMatrix m;
      m.format = c_.expert_quant_format ? *c_.expert_quant_format : float_format(data[e]->dtype);
      m.data = data[e]->data;
      m.scales = scales.empty() ? nullptr : scales[e]->data;
      m.rows = rows;
      m.cols = cols;
      mats.push_back(m);
    }
    std::vector<std::vector<float>> imp;
    for (size_t e = 0; e < mats.size(); ++e) imp.push_back(im_ ? im_->importance(g, static_cast<int64_t>(e), cols) : std::vector<float>{});
    with_importance_ += !imp.empty() && !imp[0].empty();
    auto shared = std::make_shared<std::pair<std::vector<WeightMatrix>, std::vector<std::vector<float>>>>(std::move(mats), std::move(imp));
    w_.add_tensor(g, {cols, rows, static_cast<int64_t>(data.size())}, *ggml_type_of_block_format(f), [shared, f](GgufSink& s) {
      for (size_t e = 0; e < shared->first.size(); ++e)
        write_quantised_rows(s, shared->first[e], f, shared->second[e].empty() ? nullptr : shared->second[e].data());
    });
  }
  // The first rule whose regex finds the GGUF name.
  std::optional<WeightFormat> rule_for(const std::string& g) {
    for (size_t i = 0; i < rules_.size(); ++i)
      if (std::regex_search(g, rules_[i].first)) {
        ++rule_hits_[i];
        return rules_[i].second;
      }
    return std::nullopt;
  }
  // A [rows][cols] float matrix quantised row by row as it is written (memory: one row).
  void quantised(const std::string& g, const TensorInfo& t, const std::vector<int64_t>& ne, WeightFormat f) {
    // As llama-quantize does: a width that is not whole 256-element blocks falls back to a 32-element type
    // of about the same size (llama.cpp's table: Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, the 2-3-bit and
    // IQ4 types -> IQ4_NL), so a preset means the same size class in both tools.
    if (t.shape.size() == 2 && t.shape[1] % weight_layout(f).block_elems != 0 && t.shape[1] % 32 == 0) {
      ++fallbacks_;
      f = fallback_format(f);
    }
    const int64_t be = weight_layout(f).block_elems;
    const int64_t rows = t.shape.size() == 2 ? t.shape[0] : 0, cols = t.shape.size() == 2 ? t.shape[1] : 0;
    if (t.shape.size() != 2 || cols % be != 0)
      throw Error("--tensor-type: '" + g + "' " + t.shape_str() + " cannot be " + weight_format_name(f) + " (rows of " +
                  std::to_string(be) + "-element blocks)");
    ++quantised_;
    const TensorInfo* tp = &t;
    auto imp = std::make_shared<std::vector<float>>(im_ ? im_->importance(g, 0, cols) : std::vector<float>{});
    with_importance_ += !imp->empty();
    WeightMatrix src;
    src.format = float_format(tp->dtype);
    src.data = tp->data;
    src.rows = rows;
    src.cols = cols;
    w_.add_tensor(g, ne, *ggml_type_of_block_format(f), [src, f, imp](GgufSink& s) {
      write_quantised_rows(s, src, f, imp->empty() ? nullptr : imp->data());
    });
  }
  void conv(const std::string& g, const TensorInfo& t) {  // [C][1][W] -> ne [W, 1, C, 1]
    used_.insert(t.name);
    ++tensors_;
    const int64_t W = t.shape.back(), C = t.numel() / W;
    add_f32(w_, g, {W, 1, C, 1}, to_f32(t));
  }
  void a_log(const std::string& g, const TensorInfo& t) {  // ssm_a = -exp(A_log[:heads]), the binder's exp
    used_.insert(t.name);
    ++tensors_;
    std::vector<float> a = to_f32(t);
    a.resize(static_cast<size_t>(c_.kda_heads));
    for (float& x : a) x = -std::exp(x);
    const int64_t H = c_.kda_heads;
    add_f32(w_, g, c_.arch == Arch::KimiK3 ? std::vector<int64_t>{H} : std::vector<int64_t>{1, H, 1, 1}, std::move(a));
  }
  void neg_exp_a(const std::string& g, const TensorInfo& t) {  // ssm_a as stored in a GGUF input
    used_.insert(t.name);
    ++tensors_;
    const int64_t H = c_.kda_heads;
    add_f32(w_, g, c_.arch == Arch::KimiK3 ? std::vector<int64_t>{H} : std::vector<int64_t>{1, H, 1, 1}, to_f32(t));
  }
  void res(const std::string& g, const std::string& name) {  // norm * proj in fp32, as the binder multiplies
    const bool is_norm = name.find("_res_norm.") != std::string::npos;
    std::string norm = name, proj = name;
    const std::string a = is_norm ? "_res_norm." : "_res_proj.";
    norm.replace(name.find(a), a.size(), "_res_norm.");
    proj.replace(name.find(a), a.size(), "_res_proj.");
    const std::vector<float> n = to_f32(need(norm)), p = to_f32(need(proj));
    if (n.size() != p.size()) throw Error("k3 convert: '" + norm + "' and '" + proj + "' differ in size");
    std::vector<float> f(n.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = n[i] * p[i];
    ++tensors_;
    const auto n_f = static_cast<int64_t>(f.size());  // before the move (argument order is unspecified)
    add_f32(w_, g, {n_f}, std::move(f));
  }
  // kv_b's halves are requantised only by a rule naming them (attn_k_b, attn_v_b, attn_[kv]_b), as the experts
  // only by one naming exps: a catch-all keeps them as stored (the CPU's absorbed decode reads the stored bf16, or a
  // GGUF input's quantised halves, which are written back as they came).
  std::optional<WeightFormat> kv_b_rule_for(const std::string& g) {
    for (size_t i = 0; i < rules_.size(); ++i) {
      const std::string& pat = patterns_[i];
      const bool names = pat.find("k_b") != std::string::npos || pat.find("v_b") != std::string::npos ||
                         pat.find("]_b") != std::string::npos;
      if (names && std::regex_search(g, rules_[i].first)) {
        ++rule_hits_[i];
        return rules_[i].second;
      }
    }
    return std::nullopt;
  }
  // One half quantised: per head, `rows` rows of `cols` values, row r of head h at kvb[at(h, r)] with `step` between
  // its values (the key half is stored transposed per head); each head's imatrix slice weights its rows.
  void kv_b_half_quantised(const std::string& name, const TensorInfo* tp, WeightFormat f, std::vector<int64_t> ne,
                           int64_t rows, int64_t cols, std::function<size_t(int64_t, int64_t)> at, size_t step) {
    if (cols % weight_layout(f).block_elems != 0 && cols % 32 == 0) {
      ++fallbacks_;
      f = fallback_format(f);
    }
    if (cols % weight_layout(f).block_elems != 0)
      throw Error("--tensor-type: '" + name + "' has rows of " + std::to_string(cols) + " values, not whole " +
                  weight_format_name(f) + " blocks");
    ++quantised_;
    const int64_t nh = ne[2];
    std::vector<std::vector<float>> imp;
    for (int64_t h = 0; h < nh; ++h) imp.push_back(im_ ? im_->importance(name, h, cols) : std::vector<float>{});
    with_importance_ += !imp.empty() && !imp[0].empty();
    w_.add_tensor(name, ne, *ggml_type_of_block_format(f), [=](GgufSink& s) {
      const std::vector<float> kvb = to_f32(*tp);
      std::vector<float> head(static_cast<size_t>(rows * cols));
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t i = 0; i < cols; ++i) head[static_cast<size_t>(r * cols + i)] = kvb[at(h, r) + static_cast<size_t>(i) * step];
        WeightMatrix m;
        m.format = WeightFormat::F32;
        m.data = head.data();
        m.rows = rows;
        m.cols = cols;
        write_quantised_rows(s, m, f, imp[static_cast<size_t>(h)].empty() ? nullptr : imp[static_cast<size_t>(h)].data());
      }
    });
  }
  // kv_b [heads*(nope+v)][kv_lora] -> attn_k_b ne [nope, kv_lora, heads] (per head transposed) + attn_v_b ne
  // [kv_lora, v, heads], in the stored type (streamed a head at a time) unless a rule names them.
  void kv_b(const std::string& g, const TensorInfo& t) {
    used_.insert(t.name);
    tensors_ += 2;
    const int64_t nh = c_.mla_heads, kr = c_.kv_lora_rank, dn = c_.qk_nope_dim, dv = c_.v_head_dim;
    if (t.shape != std::vector<int64_t>{nh * (dn + dv), kr}) throw Error("k3 convert: '" + t.name + "' has shape " + t.shape_str());
    const size_t es = dtype_size(t.dtype);
    const TensorInfo* tp = &t;
    const std::string vb = g.substr(0, g.size() - std::string("attn_k_b.weight").size()) + "attn_v_b.weight";
    const auto fk = kv_b_rule_for(g), fv = kv_b_rule_for(vb);
    // A GGUF input's quantised halves (weights.h kKvbKeyBlocksName) go back as stored, not as the fp32 rebuild, and
    // a rule naming another type for them is refused as for any stored block matrix (stored_blocks).
    const std::string sp = t.name.substr(0, t.name.size() - std::string("kv_b_proj.weight").size());
    const TensorInfo* ks = ck_.find(sp + kKvbKeyBlocksName);
    const TensorInfo* vs = ck_.find(sp + kKvbValueBlocksName);
    for (const TensorInfo* h : {ks, vs})
      if (h) used_.insert(h->name);
    const auto as_stored = [&](const std::string& name, std::vector<int64_t> ne, const TensorInfo* h, std::optional<WeightFormat> f) {
      refuse_requantise(name, *h->block_format, f);
      w_.add_tensor(name, std::move(ne), *ggml_type_of_block_format(*h->block_format), [h](GgufSink& s) { s.write(h->data, h->nbytes); });
    };
    if (ks && ks->block_format)
      as_stored(g, {dn, kr, nh}, ks, fk);
    else if (fk)  // key half: head h's row c (a kv_lora column) is kv_b's column c over the head's nope rows
      kv_b_half_quantised(g, tp, *fk, {dn, kr, nh}, kr, dn,
                          [=](int64_t h, int64_t c) { return static_cast<size_t>(h * (dn + dv) * kr + c); }, static_cast<size_t>(kr));
    else
    w_.add_tensor(g, {dn, kr, nh}, ggml_type_of(t.dtype), [=](GgufSink& s) {
      std::vector<uint8_t> head(static_cast<size_t>(kr * dn) * es);
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t col = 0; col < kr; ++col)
          for (int64_t i = 0; i < dn; ++i)
            std::memcpy(&head[static_cast<size_t>(col * dn + i) * es], tp->data + static_cast<size_t>((h * (dn + dv) + i) * kr + col) * es, es);
        s.write(head.data(), head.size());
      }
    });
    if (vs && vs->block_format)
      as_stored(vb, {kr, dv, nh}, vs, fv);
    else if (fv)  // value half: head h's row d is kv_b's row h (nope + v) + nope + d, contiguous
      kv_b_half_quantised(vb, tp, *fv, {kr, dv, nh}, dv, kr,
                          [=](int64_t h, int64_t d) { return static_cast<size_t>((h * (dn + dv) + dn + d) * kr); }, 1);
    else
    w_.add_tensor(vb, {kr, dv, nh}, ggml_type_of(t.dtype), [=](GgufSink& s) {
      for (int64_t h = 0; h < nh; ++h) s.write(tp->data + static_cast<size_t>((h * (dn + dv) + dn) * kr) * es, static_cast<size_t>(dv * kr) * es);
    });
  }
  // One stacked tensor per (layer, w1/w2/w3): ne [cols, rows, E]; MXFP4 pairs repacked into ggml blocks.
  void experts_of(const std::string& g, const std::string& name) {
    const size_t at = name.find(".experts.") + 9;
    const std::string base = name.substr(0, at);
    const size_t dot = name.find('.', at);
    const std::string wid = name.substr(dot + 1, 2);  // w1 / w2 / w3
    const int64_t E = c_.num_experts, I = c_.moe_intermediate_size, X = c_.expert_in_dim();
    const int64_t rows = wid == "w2" ? X : I, cols = wid == "w2" ? I : X;
    std::vector<const TensorInfo*> data, scales;
    // A GGUF input's experts are ggml's MXFP4 blocks already: written as stored.
    const bool ggml_blocks = c_.expert_quant_format == WeightFormat::MXFP4_GGML;
    for (int64_t e = 0; e < E; ++e) {
      const std::string p = base + std::to_string(e) + "." + wid;
      if (ggml_blocks) {
        data.push_back(&need(p + ".weight"));
      } else if (c_.expert_quant_format) {
        data.push_back(&need(p + ".weight_packed"));
        scales.push_back(&need(p + ".weight_scale"));
      } else {
        data.push_back(&need(p + ".weight"));
      }
    }
    ++tensors_;
    if (const auto f = expert_rule_for(g); f && cols % weight_layout(*f).block_elems == 0)
      return quantised_experts(g, data, scales, rows, cols, *f);
    if (ggml_blocks) {
      w_.add_tensor(g, {cols, rows, E}, kMxfp4, [data](GgufSink& s) {
        for (const TensorInfo* t : data) s.write(t->data, t->nbytes);
      });
    } else if (c_.expert_quant_format) {
      w_.add_tensor(g, {cols, rows, E}, kMxfp4, [data, scales, rows, cols](GgufSink& s) {
        const int64_t blocks = rows * cols / 32;
        std::vector<uint8_t> out(static_cast<size_t>(blocks * 17));
        for (size_t e = 0; e < data.size(); ++e) {
          mxfp4_to_ggml_blocks(data[e]->data, scales[e]->data, blocks, out.data());
          s.write(out.data(), out.size());
        }
      });
    } else {
      w_.add_tensor(g, {cols, rows, E}, ggml_type_of(data[0]->dtype), [data](GgufSink& s) {
        for (const TensorInfo* t : data) s.write(t->data, t->nbytes);
      });
    }
  }

  GgufWriter& w_;
  const ModelConfig& c_;
  const Checkpoint& ck_;
  std::set<std::string> used_;
  int64_t tensors_ = 0, quantised_ = 0, fallbacks_ = 0, with_importance_ = 0;
  const Imatrix* im_ = nullptr;
  std::vector<std::pair<std::regex, std::optional<WeightFormat>>> rules_;
  std::vector<std::string> patterns_;
  std::vector<int64_t> rule_hits_;
};

}  // namespace

TensorTypeRule parse_tensor_type_rule(const std::string& spec) {
  const size_t eq = spec.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
    throw Error("--tensor-type '" + spec + "': expected REGEX=TYPE (e.g. 'attn_.*=q8_0')");
  std::string type = spec.substr(eq + 1);
  std::transform(type.begin(), type.end(), type.begin(), ::toupper);
  if (type == "KEEP") return {spec.substr(0, eq), std::nullopt};
  // Every format quantize_row writes (the one list: quant::can_quantize), by its name.
  std::string known;
  for (int i = 0; i <= static_cast<int>(WeightFormat::IQ4_NL); ++i) {
    const auto f = static_cast<WeightFormat>(i);
    if (!quant::can_quantize(f)) continue;
    std::string name = weight_format_name(f);
    if (type == name) return {spec.substr(0, eq), f};
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    known += name + ", ";
  }
  throw Error("--tensor-type '" + spec + "': unknown or unwritable type '" + spec.substr(eq + 1) + "' (" + known + "keep)");
}

namespace {
// llama-quantize's mixes, on this family's GGUF names (first match wins; the last rule catches the rest).
// Routed experts are not dense matrices: they stay as shipped (MXFP4) under every preset.
// `file_type`: llama.cpp's llama_ftype (include/llama.h) written as general.file_type, the label its tools print: the
// type most of the file's bytes take -- the routed experts' for the expert presets (nearly all of a K3's weights).
struct Preset {
  std::string name;
  uint32_t file_type;
  std::vector<std::string> rules;
};
const std::vector<Preset>& presets() {
  static const std::vector<Preset> p = {
      {"Q8_0", 7, {".*=q8_0"}},
      {"Q6_K", 18, {".*=q6_k"}},
      {"Q5_K_M", 17, {"ffn_down|^output\\.=q6_k", ".*=q5_k"}},
      {"Q4_K_M", 15, {"ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      // Q3_K_M / Q2_K: the head at Q6_K and the KDA value / every output projection a step up with ffn_down, as
      // llama-quantize allocates them (k3's first mixes gave those the base type: 11-15% more KLD at 1% fewer
      // bytes on k3-small; with these, level with llama-quantize's at the same imatrix -- docs/quantization.md).
      {"Q3_K_M", 12, {"^output\\.=q6_k", "ffn_down|attn_v\\.|attn_output=q4_k", ".*=q3_k"}},
      {"Q2_K", 10, {"^output\\.=q6_k", "ffn_down|attn_v\\.|attn_output=q3_k", ".*=q2_k"}},
      {"IQ4_XS", 30, {".*=iq4_xs"}},
      // K3: the KDA and attention matrices (a small share of the bytes, most of the sensitivity) kept high.
      {"Q4_K_M-KDA8", 15, {"ssm_|attn_=q8_0", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      {"Q4_K_M-KDA16", 15, {"ssm_|attn_=keep", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      // Smaller boxes: routed experts below their shipped MXFP4 (4.25 bits) too; an expert matrix whose width
      // is not whole 256-blocks stays MXFP4.
      {"Q4_K_M-E3", 12, {"_exps=q3_k", "ssm_|attn_=q8_0", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      {"Q4_K_M-E2", 10, {"_exps=q2_k", "ssm_|attn_=q8_0", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      // The smallest boxes (in the spirit of Unsloth's UD-IQ1_S): routed experts -- nearly all of K3's weights
      // -- at a codebook i-quant, their down projection one step higher (it feeds the residual stream
      // directly); KDA, attention and the shared expert Q8_0; the rest as Q4_K_M. Best with --imatrix.
      {"Q4_K_M-EIQ1", 24, {"ffn_down_exps=iq2_xxs", "_exps=iq1_s", "ssm_|attn_|_shexp=q8_0", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      {"Q4_K_M-EIQ2", 19, {"ffn_down_exps=iq2_xs", "_exps=iq2_xxs", "ssm_|attn_|_shexp=q8_0", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
      {"Q4_K_M-EIQ3", 23, {"ffn_down_exps=iq3_s", "_exps=iq3_xxs", "ssm_|attn_|_shexp=q8_0", "ffn_down|^output\\.|^token_embd=q6_k", ".*=q4_k"}},
  };
  return p;
}
}  // namespace

std::vector<std::string> quantize_preset_names() {
  std::vector<std::string> n;
  for (const Preset& pr : presets()) n.push_back(pr.name);
  return n;
}

namespace {
// A preset by name, case-insensitively; throws k3::Error naming the presets.
const Preset& find_preset(const std::string& name) {
  std::string up = name;
  std::transform(up.begin(), up.end(), up.begin(), ::toupper);
  for (const Preset& pr : presets()) {
    std::string ku = pr.name;
    std::transform(ku.begin(), ku.end(), ku.begin(), ::toupper);
    if (ku == up) return pr;
  }
  std::string all;
  for (const std::string& n : quantize_preset_names()) all += (all.empty() ? "" : ", ") + n;
  throw Error("unknown quantisation preset '" + name + "' (" + all + ")");
}
}  // namespace

std::vector<TensorTypeRule> quantize_preset(const std::string& name) {
  std::vector<TensorTypeRule> r;
  for (const std::string& spec : find_preset(name).rules) {
    r.push_back(parse_tensor_type_rule(spec));
    r.back().from_preset = true;
  }
  return r;
}

uint32_t gguf_file_type_of_preset(const std::string& name) { return find_preset(name).file_type; }

GgufExportStats add_model_to_gguf(GgufWriter& w, const ModelConfig& c, const Checkpoint& ck, const std::string& name,
                                  const std::vector<TensorTypeRule>& rules, const Imatrix* imatrix,
                                  std::optional<uint32_t> file_type) {
  // MXFP4 experts come as compressed-tensors pairs (an HF dir) or in ggml's blocks (a GGUF input).
  if (c.expert_quant_format && *c.expert_quant_format != WeightFormat::MXFP4 && *c.expert_quant_format != WeightFormat::MXFP4_GGML)
    throw Error("k3 convert: experts in " + std::string(weight_format_name(*c.expert_quant_format)) + " cannot be written yet");
  // All checks of loading (shapes, dtypes, finite MXFP4 scales) before writing anything.
  const ModelWeights mw = bind_weights(c, ck);
  // Expert dtypes must agree within a layer (one stacked tensor).
  add_metadata(w, c, name, file_type);
  TensorExport ex(w, c, ck, rules, imatrix);
  ex.run();
  for (size_t i = 0; i < rules.size(); ++i)
    if (ex.rule_hits()[i] == 0 && !rules[i].from_preset)
      throw Error("--tensor-type '" + rules[i].pattern + "=" + (rules[i].format ? weight_format_name(*rules[i].format) : "keep") +
                  "' matches no dense matrix (GGUF names, e.g. blk.0.attn_q_a.weight; the router, vectors, kv_b and "
                  "routed experts are kept as stored)");
  GgufExportStats st;
  st.tensors = ex.tensors();
  st.quantised = ex.quantised();
  st.fallbacks = ex.fallbacks();
  st.with_importance = ex.with_importance();
  for (const auto& [n, t] : ck.all()) st.hf_skipped += !ex.used().count(n);
  return st;
}

}  // namespace k3
