#include "k3/backend/cuda/device_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "k3/backend/cuda/dense_kernels.h"
#include "k3/backend/cuda/quant_mma.h"
#include "k3/backend/cuda/quant_tables.h"
#include "k3/core/dtype.h"
#include "k3/core/mxfp4_ggml.h"

namespace k3::cuda {

void* DeviceArena::alloc(size_t bytes) {
  constexpr size_t kChunk = size_t{1} << 30, kAlign = 256;
  bytes = (bytes + kAlign - 1) / kAlign * kAlign;
  if (bytes == 0) bytes = kAlign;
  if (chunks_.empty() || off_ + bytes > chunks_.back().bytes()) {
    chunks_.emplace_back(std::max(bytes, kChunk));
    off_ = 0;
  }
  void* p = chunks_.back().get<uint8_t>() + off_;
  off_ += bytes;
  used_ += bytes;
  return p;
}

namespace {

// ---- upload from a bound checkpoint ----

class Uploader {
 public:
  Uploader(DeviceArena& a, int device) : a_(a), device_(device) {}

  WeightVector vec(const WeightVector& v) {
    if (v.empty()) return {};
    void* p = a_.alloc(v.size() * 4);
    K3_CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return WeightVector::view(static_cast<const float*>(p), v.size());
  }

  // A matrix whose home is the host stays a view of the host mapping (the CUDA backend runs its ops
  // there and moves the activations).
  DeviceLinear lin(const WeightMatrix& w) {
    DeviceLinear d;
    if (w.empty()) return d;
    if (w.device == kHostDevice) return w;
    d.device = device_;
    if (is_gguf_block(w.format)) return with_tiled(blocks(w));
    if (is_block_format(w.format))
      throw Error(std::string("CUDA backend: ") + weight_format_name(w.format) + " is supported for routed experts only (a dense projection is " +
                  weight_format_name(w.format) + ")");
    d.rows = w.rows;
    d.cols = w.cols;
    const size_t n = static_cast<size_t>(w.rows * w.cols);
    if (w.format == WeightFormat::BF16) {
      d.format = WeightFormat::BF16;
      void* p = a_.alloc(n * 2);
      K3_CUDA_CHECK(cudaMemcpy(p, w.data, n * 2, cudaMemcpyHostToDevice));
      d.data = p;
    } else {  // F32 as is; F16 widened to F32 (exact)
      d.format = WeightFormat::F32;
      std::vector<float> f(n);
      for (int64_t r = 0; r < w.rows; ++r) to_f32_row(w, r, f.data() + r * w.cols);
      void* p = a_.alloc(n * 4);
      K3_CUDA_CHECK(cudaMemcpy(p, f.data(), n * 4, cudaMemcpyHostToDevice));
      d.data = p;
    }
    return d;
  }

  // A bf16 [V][H] table for the embedding gather (F32/F16 tables are rounded to bf16).
  WeightMatrix bf16_table(const WeightMatrix& w) {
    if (w.device == kHostDevice) return w;
    if (is_gguf_block(w.format)) return blocks(w);  // gathered by quant_dequant_rows (CudaBackend::embed)
    if (is_block_format(w.format))
      throw Error(std::string("CUDA backend: an embedding table in ") + weight_format_name(w.format) + " is not supported");
    const size_t n = static_cast<size_t>(w.rows * w.cols);
    void* p = a_.alloc(n * 2);
    if (w.format == WeightFormat::BF16) {
      K3_CUDA_CHECK(cudaMemcpy(p, w.data, n * 2, cudaMemcpyHostToDevice));
    } else {
      std::vector<float> f(static_cast<size_t>(w.cols));
      std::vector<uint16_t> b(n);
      for (int64_t r = 0; r < w.rows; ++r) {
        to_f32_row(w, r, f.data());
        for (int64_t c = 0; c < w.cols; ++c) b[static_cast<size_t>(r * w.cols + c)] = f32_to_bf16(f[static_cast<size_t>(c)]);
      }
      K3_CUDA_CHECK(cudaMemcpy(p, b.data(), n * 2, cudaMemcpyHostToDevice));
    }
    return WeightMatrix{WeightFormat::BF16, p, nullptr, w.rows, w.cols, device_};
  }

  // One layer's routed experts stacked: [E][rows][cols] per projection. A block format goes up as stored
  // (packed blocks and scales, core/weight_format.h), dense floats as bf16: the expert kernels' formats.
  // Routed experts on the device are stacked; a layer with any expert placed on the host keeps them all
  // there (MoeWeights::experts, host views) and leaves the stack empty.
  static bool on_host(const std::vector<GluMlp>& ex) {
    for (const GluMlp& g : ex)
      if (g.gate.device == kHostDevice || g.up.device == kHostDevice || g.down.device == kHostDevice) return true;
    return false;
  }

  // A dense projection quant_mma_tiled_wanted names (K3_QUANT_MMA_TILED: the Q6_K vocabulary heads, or every K-quant
  // matrix) also gets the tile-major copy its decode GEMV reads (quant_mma.h, Tiled), beside the stored blocks that
  // prefill and the other forms keep reading.
  WeightMatrix with_tiled(WeightMatrix d) {
    d.tiled = nullptr;  // never a host copy's (the CPU's decode layout) on a device matrix
    if (!quant_mma_tiled_wanted(d)) return d;
    void* t = a_.alloc(static_cast<size_t>(quant_mma_tiled_bytes(d)));
    K3_CUDA_CHECK(quant_mma_make_tiled(d, t, nullptr));
    K3_CUDA_CHECK(cudaDeviceSynchronize());
    d.tiled = t;
    return d;
  }

  // A GGUF block matrix (Q8_0, Q4_K, ..., IQ1_M) goes up as its blocks, byte for byte (the kernels of
  // quant_kernels.h decode them in registers); the device's i-quant codebooks are made here, outside any
  // CUDA graph capture.
  WeightMatrix blocks(const WeightMatrix& w) {
    if (w.scales != nullptr || w.cols % weight_layout(w.format).block_elems != 0)
      throw Error(std::string("CUDA backend: a ") + weight_format_name(w.format) + " matrix of " + std::to_string(w.cols) +
                  " columns is not whole blocks without a scale array");
    iq_tables();
    const size_t bytes = static_cast<size_t>(w.rows * row_data_bytes(w.format, w.cols));
    void* p = a_.alloc(bytes);
    K3_CUDA_CHECK(cudaMemcpy(p, w.data, bytes, cudaMemcpyHostToDevice));
    return WeightMatrix{w.format, p, nullptr, w.rows, w.cols, device_};
  }

  ExpertBank experts(const std::vector<GluMlp>& ex) {
    ExpertBank b;
    if (ex.empty() || on_host(ex)) return b;
    const GluMlp& e0 = ex[0];
    b.E = static_cast<int>(ex.size());
    b.I = static_cast<int>(e0.gate.rows);
    b.X = static_cast<int>(e0.gate.cols);
    const WeightFormat f = e0.gate.format;
    // ggml's MXFP4 blocks (a GGUF) go up repacked to the layout the MXFP4 kernels read: the same values, so
    // the same results as from the HF checkpoint (core/mxfp4_ggml.h; a host-side copy per expert).
    const bool ggml = f == WeightFormat::MXFP4_GGML;
    const WeightFormat dev_f = ggml ? WeightFormat::MXFP4 : f;
    const bool packed = is_block_format(f);
    // GGUF block experts (the Q4_K_M-E3 / -E2 presets, llama-quantize's files) go up as their blocks, no scale
    // array (quant_moe.h); the down stack may be in another block format than gate / up (llama-quantize's
    // Q4_K_M gives some layers Q6_K down projections beside Q4_K gate / up).
    const bool gguf = is_gguf_block(f);
    const WeightFormat fd = gguf && is_gguf_block(e0.down.format) ? e0.down.format : f;
    if (packed && dev_f != WeightFormat::MXFP4 && !gguf)
      throw Error(std::string("CUDA backend: no routed-expert kernels for ") + weight_format_name(f) + " weights");
    if (gguf) {
      if (b.X % weight_layout(f).block_elems != 0 || b.I % weight_layout(fd).block_elems != 0)
        throw Error(std::string("CUDA backend: ") + weight_format_name(f) + " / " + weight_format_name(fd) + " routed experts of widths " +
                    std::to_string(b.X) + " / " + std::to_string(b.I) + " are not whole blocks");
      iq_tables();
    }
    b.format = packed ? dev_f : WeightFormat::BF16;
    b.down_format = gguf ? fd : b.format;
    uint8_t max_scale = 0;  // over the MXFP4 scale bytes of the three stacks (ExpertStack::max_scale)
    auto stack = [&](auto get, WeightFormat sf, const void*& data, const uint8_t*& scales) {
      const WeightFormat sdev = ggml ? WeightFormat::MXFP4 : sf;  // this stack's format, and on the device
      const WeightMatrix& m0 = get(e0);
      const size_t rc = static_cast<size_t>(m0.rows * m0.cols);
      if (packed) {
        const size_t db = static_cast<size_t>(m0.rows * row_data_bytes(sdev, m0.cols));
        const size_t sb = static_cast<size_t>(m0.rows * row_scale_bytes(sdev, m0.cols));
        uint8_t* p = static_cast<uint8_t*>(a_.alloc(db * ex.size()));
        uint8_t* s = sb > 0 ? static_cast<uint8_t*>(a_.alloc(sb * ex.size())) : nullptr;
        std::vector<uint8_t> hp(ggml ? db : 0), hs(ggml ? sb : 0);
        for (size_t e = 0; e < ex.size(); ++e) {
          const WeightMatrix& m = get(ex[e]);
          if (m.format != sf) throw Error(std::string("CUDA backend: a layer mixes ") + weight_format_name(sf) + " and other experts");
          const void* md = m.data;
          const uint8_t* ms = m.scales;
          if (ggml) {
            ggml_blocks_to_mxfp4(static_cast<const uint8_t*>(m.data), m.rows * m.cols / kMxfp4Group, hp.data(), hs.data());
            md = hp.data();
            ms = hs.data();
          }
          K3_CUDA_CHECK(cudaMemcpy(p + e * db, md, db, cudaMemcpyHostToDevice));
          if (sb > 0) {
            K3_CUDA_CHECK(cudaMemcpy(s + e * sb, ms, sb, cudaMemcpyHostToDevice));
            if (sdev == WeightFormat::MXFP4) max_scale = std::max(max_scale, *std::max_element(ms, ms + sb));
          }
        }
        data = p;
        scales = gguf ? nullptr : s;
      } else {
        uint16_t* p = static_cast<uint16_t*>(a_.alloc(rc * 2 * ex.size()));
        std::vector<float> f(static_cast<size_t>(m0.cols));
        std::vector<uint16_t> row(rc);
        for (size_t e = 0; e < ex.size(); ++e) {
          const WeightMatrix& m = get(ex[e]);
          if (is_block_format(m.format))
            throw Error(std::string("CUDA backend: a layer mixes ") + weight_format_name(m.format) + " and dense experts");
          if (m.format == WeightFormat::BF16) {
            K3_CUDA_CHECK(cudaMemcpy(p + e * rc, m.data, rc * 2, cudaMemcpyHostToDevice));
          } else {  // grouped expert kernels take bf16; fp32 experts are rounded (noted in docs)
            for (int64_t r = 0; r < m.rows; ++r) {
              to_f32_row(m, r, f.data());
              for (int64_t c = 0; c < m.cols; ++c) row[static_cast<size_t>(r * m.cols + c)] = f32_to_bf16(f[static_cast<size_t>(c)]);
            }
            K3_CUDA_CHECK(cudaMemcpy(p + e * rc, row.data(), rc * 2, cudaMemcpyHostToDevice));
          }
        }
        data = p;
        scales = nullptr;
      }
    };
    stack([](const GluMlp& g) -> const WeightMatrix& { return g.gate; }, f, b.gate, b.gate_scales);
    stack([](const GluMlp& g) -> const WeightMatrix& { return g.up; }, f, b.up, b.up_scales);
    stack([](const GluMlp& g) -> const WeightMatrix& { return g.down; }, fd, b.down, b.down_scales);
    if (b.format == WeightFormat::MXFP4) b.max_scale = max_scale;
    return b;
  }

 private:
  static void to_f32_row(const WeightMatrix& w, int64_t r, float* out) {
    const size_t c = static_cast<size_t>(w.cols);
    if (w.format == WeightFormat::F32) {
      std::memcpy(out, static_cast<const float*>(w.data) + r * w.cols, c * 4);
    } else if (w.format == WeightFormat::BF16) {
      const uint16_t* s = static_cast<const uint16_t*>(w.data) + r * w.cols;
      for (size_t i = 0; i < c; ++i) out[i] = bf16_to_f32(s[i]);
    } else {
      const uint16_t* s = static_cast<const uint16_t*>(w.data) + r * w.cols;
      for (size_t i = 0; i < c; ++i) out[i] = f16_to_f32(s[i]);
    }
  }
  DeviceArena& a_;
  int device_;

 public:
  int device() const { return device_; }
};

GluMlp glu(Uploader& u, const GluMlp& g) { return {u.lin(g.gate), u.lin(g.up), u.lin(g.down)}; }

// ---- dummy weights ----

class Generator {
 public:
  Generator(DeviceArena& a, uint64_t seed, int device) : a_(a), seed_(seed), device_(device) {}

  DeviceLinear lin(int64_t rows, int64_t cols) {
    uint16_t* p = static_cast<uint16_t*>(a_.alloc(static_cast<size_t>(rows * cols) * 2));
    K3_CUDA_CHECK(fill_uniform_bf16(p, rows * cols, std::sqrt(3.0f / static_cast<float>(cols)), ++seed_, nullptr));
    return WeightMatrix{WeightFormat::BF16, p, nullptr, rows, cols, device_};
  }
  WeightVector vec(int64_t n, float lo, float hi) {
    float* p = static_cast<float*>(a_.alloc(static_cast<size_t>(n) * 4));
    K3_CUDA_CHECK(fill_uniform_f32(p, n, lo, hi, ++seed_, nullptr));
    return WeightVector::view(p, static_cast<size_t>(n));
  }
  const void* bf16(int64_t n, int64_t cols) { return lin(n / cols, cols).data; }
  // MXFP4 [count][cols]: random nibbles; E8M0 scales chosen so that weights have std ~ 1/sqrt(cols).
  // Returns the largest scale byte it can have written (ExpertStack::max_scale).
  uint8_t mxfp4(int64_t count, int64_t cols, const void*& data, const uint8_t*& scales) {
    uint8_t* p = static_cast<uint8_t*>(a_.alloc(static_cast<size_t>(count / 2)));
    uint8_t* s = static_cast<uint8_t*>(a_.alloc(static_cast<size_t>(count / 32)));
    K3_CUDA_CHECK(fill_random_bytes(p, count / 2, 0, 255, ++seed_, nullptr));
    // E2M1 magnitudes average ~2.5 (rms ~3): scale 2^e with 3 * 2^e ~ 1/sqrt(cols).
    const int e = static_cast<int>(std::floor(std::log2(1.0 / (3.0 * std::sqrt(static_cast<double>(cols))))));
    K3_CUDA_CHECK(fill_random_bytes(s, count / 32, static_cast<uint8_t>(127 + e - 1), static_cast<uint8_t>(127 + e), ++seed_, nullptr));
    data = p;
    scales = s;
    return static_cast<uint8_t>(127 + e);
  }
  GluMlp glu(int64_t H, int64_t I) { return {lin(I, H), lin(I, H), lin(H, I)}; }

 private:
  DeviceArena& a_;
  uint64_t seed_;
  int device_;
};


// The device copy of one layer's KDA / MLA / MoE weights.
KdaWeights upload_kda(Uploader& u, const KdaWeights& k) {
  KdaWeights d;
  d.q = u.lin(k.q), d.k = u.lin(k.k), d.v = u.lin(k.v), d.f_a = u.lin(k.f_a), d.f_b = u.lin(k.f_b), d.b = u.lin(k.b);
  d.g = u.lin(k.g), d.g_a = u.lin(k.g_a), d.g_b = u.lin(k.g_b), d.o = u.lin(k.o);
  d.q_conv = u.vec(k.q_conv), d.k_conv = u.vec(k.k_conv), d.v_conv = u.vec(k.v_conv);
  d.dt_bias = u.vec(k.dt_bias), d.A_log = u.vec(k.A_log), d.o_norm = u.vec(k.o_norm);
  return d;
}

MlaWeights upload_mla(Uploader& u, const MlaWeights& m) {
  MlaWeights d;
  d.q_a = u.lin(m.q_a), d.q_b = u.lin(m.q_b), d.q = u.lin(m.q), d.kv_a = u.lin(m.kv_a), d.o = u.lin(m.o), d.g = u.lin(m.g);
  d.q_a_norm = u.vec(m.q_a_norm), d.kv_a_norm = u.vec(m.kv_a_norm), d.kv_b = u.vec(m.kv_b);
  d.kv_b_f32 = m.kv_b_f32;
  d.kv_b_f32.data = d.kv_b.data();
  d.kv_b_f32.device = u.device();
  return d;
}

MoeWeights upload_moe(Uploader& u, const MoeWeights& m) {
  MoeWeights d;
  d.router = u.lin(m.router);
  d.correction_bias = u.vec(m.correction_bias);
  d.stacked = u.experts(m.experts);
  if (d.stacked.empty()) d.experts = m.experts;  // placed on the host
  d.shared = glu(u, m.shared);
  d.latent_down = u.lin(m.latent_down);
  d.latent_up = u.lin(m.latent_up);
  d.latent_norm = u.vec(m.latent_norm);
  return d;
}

}  // namespace

namespace {
WeightMatrix homed_on(WeightMatrix w, int device) {
  w.device = device;
  return w;
}
}  // namespace

DeviceLinear upload_linear(DeviceArena& arena, int device, const WeightMatrix& w) {
  return Uploader(arena, device).lin(homed_on(w, device));
}
WeightMatrix upload_embedding_table(DeviceArena& arena, int device, const WeightMatrix& w) {
  return Uploader(arena, device).bf16_table(homed_on(w, device));
}
WeightVector upload_vector(DeviceArena& arena, int device, const WeightVector& v) { return Uploader(arena, device).vec(v); }

void upload_weights(const ModelWeights& w, int device, DeviceWeights& out) {
  Uploader u(out.arena, device);
  ModelWeights& d = out.w;
  d.embed = u.bf16_table(w.embed);
  d.lm_head = u.lin(w.lm_head);
  d.final_norm = u.vec(w.final_norm);
  d.out_res.w = u.vec(w.out_res.w);
  d.layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    LayerWeights& D = d.layers[l];
    D.is_kda = L.is_kda;
    D.is_moe = L.is_moe;
    D.input_norm = u.vec(L.input_norm);
    D.post_attn_norm = u.vec(L.post_attn_norm);
    D.attn_res.w = u.vec(L.attn_res.w);
    D.mlp_res.w = u.vec(L.mlp_res.w);
    if (L.is_kda)
      D.kda = upload_kda(u, L.kda);
    else
      D.mla = upload_mla(u, L.mla);
    if (L.is_moe)
      D.moe = upload_moe(u, L.moe);
    else
      D.mlp = glu(u, L.mlp);
  }
  d.bound_bytes = static_cast<int64_t>(out.arena.bytes());
}

void dummy_weights(const ModelConfig& c, uint64_t seed, int device, DeviceWeights& out) {
  Generator g(out.arena, seed, device);
  ModelWeights& w = out.w;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  w.embed = g.lin(V, H);
  w.lm_head = g.lin(V, H);
  w.final_norm = g.vec(H, 0.9f, 1.1f);
  const bool ar = c.attn_res_block_size > 0;
  if (ar) w.out_res.w = g.vec(H, -0.05f, 0.05f);
  w.layers.resize(static_cast<size_t>(c.num_layers));
  const int64_t Hk = c.kda_heads, D = c.kda_head_dim, C = Hk * D, r = c.kda_gate_rank > 0 ? c.kda_gate_rank : D;
  const int64_t nh = c.mla_heads, qk = c.mla_qk_dim(), kr = c.kv_lora_rank, dn = c.qk_nope_dim, dv = c.v_head_dim;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& L = w.layers[static_cast<size_t>(l)];
    L.is_kda = c.is_kda[static_cast<size_t>(l)];
    L.is_moe = c.is_moe_layer(l);
    L.input_norm = g.vec(H, 0.9f, 1.1f);
    L.post_attn_norm = g.vec(H, 0.9f, 1.1f);
    if (ar) {
      L.attn_res.w = g.vec(H, -0.05f, 0.05f);
      L.mlp_res.w = g.vec(H, -0.05f, 0.05f);
    }
    if (L.is_kda) {
      KdaWeights& k = L.kda;
      k.q = g.lin(C, H);
      k.k = g.lin(C, H);
      k.v = g.lin(C, H);
      k.f_a = g.lin(r, H);
      k.f_b = g.lin(C, r);
      k.b = g.lin(Hk, H);
      if (c.kda_full_rank_gate) {
        k.g = g.lin(C, H);
      } else {
        k.g_a = g.lin(r, H);
        k.g_b = g.lin(C, r);
      }
      k.o = g.lin(H, C);
      const int64_t W = c.conv_kernel;
      k.q_conv = g.vec(C * W, -0.5f, 0.5f);
      k.k_conv = g.vec(C * W, -0.5f, 0.5f);
      k.v_conv = g.vec(C * W, -0.5f, 0.5f);
      k.dt_bias = g.vec(C, -1.0f, 1.0f);
      k.A_log = g.vec(Hk, -1.0f, 1.0f);
      k.o_norm = g.vec(D, 0.9f, 1.1f);
    } else {
      MlaWeights& m = L.mla;
      if (c.q_lora_rank > 0) {
        m.q_a = g.lin(c.q_lora_rank, H);
        m.q_a_norm = g.vec(c.q_lora_rank, 0.9f, 1.1f);
        m.q_b = g.lin(nh * qk, c.q_lora_rank);
      } else {
        m.q = g.lin(nh * qk, H);
      }
      m.kv_a = g.lin(c.mla_cache_dim(), H);
      m.kv_a_norm = g.vec(kr, 0.9f, 1.1f);
      const float s = std::sqrt(3.0f / static_cast<float>(kr));
      m.kv_b = g.vec(nh * (dn + dv) * kr, -s, s);
      m.kv_b_f32 = WeightMatrix{WeightFormat::F32, m.kv_b.data(), nullptr, nh * (dn + dv), kr, device};
      m.o = g.lin(H, nh * dv);
      if (c.mla_output_gate) m.g = g.lin(nh * dv, H);
    }
    if (L.is_moe) {
      MoeWeights& m = L.moe;
      const int64_t E = c.num_experts, X = c.expert_in_dim(), I = c.moe_intermediate_size;
      m.router = g.lin(E, H);
      m.correction_bias = g.vec(E, -0.01f, 0.01f);
      ExpertStack& b = m.stacked;
      b.E = static_cast<int>(E);
      b.I = static_cast<int>(I);
      b.X = static_cast<int>(X);
      b.format = c.expert_quant_format.value_or(WeightFormat::BF16);
      if (b.format == WeightFormat::MXFP4) {
        b.max_scale = std::max({g.mxfp4(E * I * X, X, b.gate, b.gate_scales), g.mxfp4(E * I * X, X, b.up, b.up_scales),
                                g.mxfp4(E * X * I, I, b.down, b.down_scales)});
      } else if (b.format == WeightFormat::BF16) {
        b.gate = g.bf16(E * I * X, X);
        b.up = g.bf16(E * I * X, X);
        b.down = g.bf16(E * X * I, I);
      } else {
        throw Error(std::string("CUDA backend: no dummy weights for ") + weight_format_name(b.format) + " experts");
      }
      if (c.num_shared_experts > 0) m.shared = g.glu(H, I * c.num_shared_experts);
      if (c.routed_hidden_size > 0) {
        m.latent_down = g.lin(X, H);
        m.latent_up = g.lin(H, X);
        if (c.latent_moe_norm) m.latent_norm = g.vec(X, 0.9f, 1.1f);
      }
    } else {
      L.mlp = g.glu(H, c.intermediate_size);
    }
  }
  w.bound_bytes = static_cast<int64_t>(out.arena.bytes());
  K3_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace k3::cuda
