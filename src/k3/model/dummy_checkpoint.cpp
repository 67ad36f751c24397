#include "k3/model/dummy_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "k3/core/error.h"
#include "k3/core/weight.h"
#include "k3/io/safetensors.h"

namespace k3 {

namespace {

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// ~N(0, 1) from one 64-bit draw: four 16-bit uniforms summed (Irwin-Hall, variance 1/3 before the scale).
float normal(uint64_t& s) {
  const uint64_t r = splitmix(s);
  float sum = 0;
  for (int i = 0; i < 4; ++i) sum += static_cast<float>((r >> (16 * i)) & 0xffff) / 65535.0f;
  return (sum - 2.0f) * 1.7320508f;
}
float uniform(uint64_t& s, float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(splitmix(s) >> 40) / static_cast<float>(1ull << 24);
}
uint16_t to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

// What one tensor holds: a view into a shared pool (matrices, expert blocks) or its own small values.
enum class Kind { Matrix, Fp4Packed, Fp4Scale, Norm, ResProj, Conv, DtBias, ALog, RouterBias };

struct Spec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  Kind kind;
  int64_t width = 0;  // the input width: pool key and scale
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// The tensor list of python/k3ref/checkpoint.py's build_tensors for this config.
std::vector<Spec> tensor_list(const ModelConfig& c) {
  std::vector<Spec> t;
  const std::string pre = c.tensor_prefix;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  auto mat = [&](const std::string& n, int64_t rows, int64_t cols) { t.push_back({n, DType::BF16, {rows, cols}, Kind::Matrix, cols}); };
  auto norm = [&](const std::string& n, int64_t len) { t.push_back({n, DType::BF16, {len}, Kind::Norm, len}); };
  auto glu = [&](const std::string& p, int64_t in, int64_t inter) {
    mat(p + "gate_proj.weight", inter, in);
    mat(p + "up_proj.weight", inter, in);
    mat(p + "down_proj.weight", in, inter);
  };
  mat(pre + "embed_tokens.weight", V, H);
  const int64_t Hk = c.kda_heads, D = c.kda_head_dim, C = Hk * D, W = c.conv_kernel;
  const int64_t r = c.kda_gate_rank > 0 ? c.kda_gate_rank : D;
  const int64_t nh = c.mla_heads, qk = c.mla_qk_dim(), kr = c.kv_lora_rank, dn = c.qk_nope_dim, dv = c.v_head_dim;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = pre + "layers." + std::to_string(l) + ".";
    norm(p + "input_layernorm.weight", H);
    norm(p + "post_attention_layernorm.weight", H);
    if (c.attn_res_block_size > 0)
      for (const char* nm : {"self_attention_res", "mlp_res"}) {
        norm(p + nm + "_norm.weight", H);
        t.push_back({p + nm + "_proj.weight", DType::BF16, {1, H}, Kind::ResProj, H});
      }
    const std::string a = p + "self_attn.";
    if (c.is_kda[static_cast<size_t>(l)]) {
      for (const char* x : {"q", "k", "v"}) mat(a + x + "_proj.weight", C, H);
      for (const char* x : {"q", "k", "v"}) t.push_back({a + x + "_conv1d.weight", DType::F32, {C, 1, W}, Kind::Conv, W});
      mat(a + "f_a_proj.weight", r, H);
      mat(a + "f_b_proj.weight", C, r);
      t.push_back({a + "dt_bias", DType::F32, {C}, Kind::DtBias, 0});
      t.push_back({a + "A_log", DType::F32, {1, 1, Hk, 1}, Kind::ALog, 0});
      mat(a + "b_proj.weight", Hk, H);
      if (c.kda_full_rank_gate) {
        mat(a + "g_proj.weight", C, H);
      } else {
        mat(a + "g_a_proj.weight", r, H);
        mat(a + "g_b_proj.weight", C, r);
      }
      norm(a + "o_norm.weight", D);
      mat(a + "o_proj.weight", H, C);
    } else {
      if (c.q_lora_rank > 0) {
        mat(a + "q_a_proj.weight", c.q_lora_rank, H);
        norm(a + "q_a_layernorm.weight", c.q_lora_rank);
        mat(a + "q_b_proj.weight", nh * qk, c.q_lora_rank);
      } else {
        mat(a + "q_proj.weight", nh * qk, H);
      }
      mat(a + "kv_a_proj_with_mqa.weight", kr + c.qk_rope_dim, H);
      norm(a + "kv_a_layernorm.weight", kr);
      mat(a + "kv_b_proj.weight", nh * (dn + dv), kr);
      mat(a + "o_proj.weight", H, nh * dv);
      if (c.mla_output_gate) mat(a + "g_proj.weight", nh * dv, H);
    }
    if (!c.is_moe_layer(l)) {
      glu(p + "mlp.", H, c.intermediate_size);
      continue;
    }
    const std::string m = p + "block_sparse_moe.";
    const int64_t E = c.num_experts, I = c.moe_intermediate_size, X = c.expert_in_dim();
    mat(m + "gate.weight", E, H);
    t.push_back({m + "gate.e_score_correction_bias", DType::F32, {E}, Kind::RouterBias, 0});
    for (int64_t e = 0; e < E; ++e)
      for (const auto& [wn, rows, cols] : {std::tuple{"w1", I, X}, std::tuple{"w3", I, X}, std::tuple{"w2", X, I}}) {
        const std::string base = m + "experts." + std::to_string(e) + "." + wn;
        if (!c.expert_quant_format) {
          mat(base + ".weight", rows, cols);
          continue;
        }
        if (*c.expert_quant_format != WeightFormat::MXFP4)
          throw Error(std::string("--load-format dummy: no dummy weights for ") + weight_format_name(*c.expert_quant_format) + " experts");
        t.push_back({base + ".weight_packed", DType::U8, {rows, cols / 2}, Kind::Fp4Packed, cols});
        t.push_back({base + ".weight_scale", DType::U8, {rows, cols / 32}, Kind::Fp4Scale, cols});
      }
    if (c.num_shared_experts > 0) glu(m + "shared_experts.", H, I * c.num_shared_experts);
    if (c.routed_hidden_size > 0) {
      mat(m + "routed_expert_down_proj.weight", X, H);
      if (c.latent_moe_norm) norm(m + "routed_expert_norm.weight", X);
      mat(m + "routed_expert_up_proj.weight", H, X);
    }
  }
  if (c.attn_res_block_size > 0) {
    norm(pre + "output_attn_res_norm.weight", H);
    t.push_back({pre + "output_attn_res_proj.weight", DType::BF16, {1, H}, Kind::ResProj, H});
  }
  norm(pre + "norm.weight", H);
  mat(c.lm_head_name, V, H);
  return t;
}

// The values behind the views, kept alive by the checkpoint.
struct Pools {
  std::map<int64_t, std::vector<uint16_t>> bf16;    // by input width: N(0, 1 / width) as bf16
  std::map<int64_t, std::vector<uint8_t>> packed;   // by width: random E2M1 pairs
  std::map<int64_t, std::vector<uint8_t>> scales;   // by width: e8m0 near 1 / (3 sqrt(width))
  std::vector<std::vector<uint8_t>> own;            // small tensors' own bytes
};

// Fills `n` values by fixed 1 M-value chunks, each from its own seed (the same values whatever the thread count).
template <typename F>
void fill_chunks(size_t n, uint64_t seed, F&& f) {
  constexpr size_t kChunk = size_t{1} << 20;
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const size_t T = std::max<size_t>(1, std::min<size_t>(chunks, std::thread::hardware_concurrency()));
  std::vector<std::thread> ts;
  for (size_t t = 0; t < T; ++t)
    ts.emplace_back([&, t] {
      for (size_t ch = t; ch < chunks; ch += T) {
        uint64_t s = seed ^ (0xD1B54A32D192ED03ull * (ch + 1));
        for (size_t i = ch * kChunk; i < std::min(n, (ch + 1) * kChunk); ++i) f(i, s);
      }
    });
  for (auto& th : ts) th.join();
}

void fill_pools(const std::vector<Spec>& specs, uint64_t seed, Pools& p) {
  std::map<int64_t, size_t> need_bf16, need_packed, need_scales;
  for (const Spec& s : specs) {
    const size_t n = static_cast<size_t>(s.numel());
    if (s.kind == Kind::Matrix) need_bf16[s.width] = std::max(need_bf16[s.width], n);
    if (s.kind == Kind::Fp4Packed) need_packed[s.width] = std::max(need_packed[s.width], n);
    if (s.kind == Kind::Fp4Scale) need_scales[s.width] = std::max(need_scales[s.width], n);
  }
  for (const auto& [w, n] : need_bf16) {
    auto& v = p.bf16[w];
    v.resize(n);
    const float sd = 1.0f / std::sqrt(static_cast<float>(w));
    fill_chunks(n, seed + static_cast<uint64_t>(w), [&](size_t i, uint64_t& s) { v[i] = to_bf16(normal(s) * sd); });
  }
  for (const auto& [w, n] : need_packed) {
    auto& v = p.packed[w];
    v.resize(n);
    fill_chunks(n, seed + 7 * static_cast<uint64_t>(w), [&](size_t i, uint64_t& s) { v[i] = static_cast<uint8_t>(splitmix(s)); });
  }
  for (const auto& [w, n] : need_scales) {
    auto& v = p.scales[w];
    v.resize(n);
    // E2M1 magnitudes average ~2.5 (rms ~3): a block scale 2^e with 3 * 2^e ~ 1 / sqrt(width).
    const int e = static_cast<int>(std::floor(std::log2(1.0 / (3.0 * std::sqrt(static_cast<double>(w))))));
    fill_chunks(n, seed + 13 * static_cast<uint64_t>(w),
                [&](size_t i, uint64_t& s) { v[i] = static_cast<uint8_t>(127 + e - static_cast<int>(splitmix(s) & 1)); });
  }
}

// A small tensor's values (python/k3ref/checkpoint.py's distributions), as bytes of its dtype.
std::vector<uint8_t> small_values(const Spec& sp, const ModelConfig& c, uint64_t& s) {
  const size_t n = static_cast<size_t>(sp.numel());
  std::vector<float> f(n);
  const bool bounded = c.gate_lower_bound.has_value();
  for (size_t i = 0; i < n; ++i) {
    switch (sp.kind) {
      case Kind::Norm: f[i] = 1.0f + 0.1f * normal(s); break;
      case Kind::ResProj: f[i] = 2.0f * normal(s) / std::sqrt(static_cast<float>(sp.width)); break;
      case Kind::Conv: f[i] = 0.4f * normal(s) + (static_cast<int64_t>(i % static_cast<size_t>(sp.width)) == sp.width - 1 ? 0.8f : 0.0f); break;
      case Kind::DtBias: f[i] = bounded ? uniform(s, -5.0f, -2.5f) : uniform(s, -3.0f, -0.3f); break;
      case Kind::ALog: f[i] = std::log(bounded ? uniform(s, 0.6f, 1.4f) : uniform(s, 0.3f, 1.0f)); break;
      case Kind::RouterBias: f[i] = uniform(s, -0.15f, 0.15f); break;
      default: throw Error("dummy checkpoint: '" + sp.name + "' is not a small tensor");
    }
  }
  std::vector<uint8_t> b(n * dtype_size(sp.dtype));
  if (sp.dtype == DType::F32) {
    std::memcpy(b.data(), f.data(), b.size());
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = to_bf16(f[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    }
  }
  return b;
}

}  // namespace

ModelFiles dummy_model_files(const ModelConfig& c, uint64_t seed) {
  const std::vector<Spec> specs = tensor_list(c);
  auto pools = std::make_shared<Pools>();
  fill_pools(specs, seed, *pools);
  std::vector<TensorInfo> tensors;
  tensors.reserve(specs.size());
  uint64_t s = seed ^ 0x5DEECE66Dull;
  for (const Spec& sp : specs) {
    TensorInfo t;
    t.name = sp.name;
    t.dtype = sp.dtype;
    t.shape = sp.shape;
    t.nbytes = static_cast<size_t>(sp.numel()) * dtype_size(sp.dtype);
    t.file = "dummy";
    switch (sp.kind) {
      case Kind::Matrix: t.data = reinterpret_cast<const uint8_t*>(pools->bf16.at(sp.width).data()); break;
      case Kind::Fp4Packed: t.data = pools->packed.at(sp.width).data(); break;
      case Kind::Fp4Scale: t.data = pools->scales.at(sp.width).data(); break;
      default:
        pools->own.push_back(small_values(sp, c, s));
        t.data = pools->own.back().data();
    }
    tensors.push_back(std::move(t));
  }
  ModelFiles f;
  f.config = c;
  f.name = "dummy";
  f.checkpoint = std::make_unique<Checkpoint>("dummy weights (--load-format dummy)", std::move(tensors),
                                              std::vector<const MappedFile*>{}, pools, nullptr);
  return f;
}

}  // namespace k3
