// Block drafters for tests (docs/block-drafter.md): a random drafter directory written in the real file
// format (config.json + model.safetensors, matrices BF16, vectors F32) for a given target, the values it
// holds, and an independent float64 reference of the drafter's arithmetic over them.
#pragma once
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3/core/dtype.h"
#include "k3/io/safetensors_writer.h"
#include "k3/model/config.h"
#include "test_util.h"

namespace k3test {

struct DrafterSpec {
  int64_t layers = 2, heads = 4, head_dim = 16, inter = 96, block = 8;
  std::vector<int32_t> taps;  // empty: {1, num_layers / 2, num_layers}
};

struct RandomDrafter {
  TempDir dir;
  nlohmann::json config;
  std::map<std::string, std::vector<float>> t;  // every tensor's values exactly as the file holds them
  std::string path() const { return dir.str(); }
};

// Writes a random drafter for `target` (seeded; never zeros: uniform values around sensible scales).
inline std::unique_ptr<RandomDrafter> write_random_drafter(const k3::ModelConfig& target, DrafterSpec s, uint32_t seed) {
  auto d = std::make_unique<RandomDrafter>();
  const int64_t H = target.hidden_size, A = s.heads * s.head_dim, L = target.num_layers;
  if (s.taps.empty()) s.taps = {1, static_cast<int32_t>(L / 2), static_cast<int32_t>(L)};
  const int64_t T = static_cast<int64_t>(s.taps.size());
  d->config = {{"architectures", {"K3BlockDrafter"}}, {"model_type", "k3_block_drafter"}, {"hidden_size", H},
               {"num_hidden_layers", s.layers}, {"num_attention_heads", s.heads}, {"head_dim", s.head_dim},
               {"intermediate_size", s.inter}, {"block_size", s.block}, {"target_layer_ids", s.taps},
               {"rms_norm_eps", 1e-5}, {"target_hidden_size", H}, {"target_vocab_size", target.vocab_size},
               {"target_num_layers", L}, {"torch_dtype", "bfloat16"}};
  std::mt19937 rng(seed);
  k3::SafetensorsWriter w;
  // A matrix [rows][cols] in BF16, values uniform with variance ~ gain / cols (activations keep their scale).
  auto mat = [&](const std::string& name, int64_t rows, int64_t cols, double gain = 1.0) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const float a = static_cast<float>(std::sqrt(3.0 * gain / static_cast<double>(cols)));
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols * 2));
    std::vector<float>& v = d->t[name];
    for (int64_t i = 0; i < rows * cols; ++i) {
      const uint16_t b = k3::f32_to_bf16(a * u(rng));
      std::memcpy(bytes.data() + 2 * i, &b, 2);
      v.push_back(k3::bf16_to_f32(b));
    }
    w.add_owned(name, k3::DType::BF16, {rows, cols}, std::move(bytes));
  };
  // An F32 vector: center + spread * uniform(-1, 1).
  auto vec = [&](const std::string& name, std::vector<int64_t> shape, float center, float spread) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    std::vector<float>& v = d->t[name];
    for (int64_t i = 0; i < n; ++i) v.push_back(center + spread * u(rng));
    std::vector<uint8_t> bytes(static_cast<size_t>(n * 4));
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_owned(name, k3::DType::F32, std::move(shape), std::move(bytes));
  };
  mat("context_proj.weight", H, T * H);
  vec("context_norm.weight", {H}, 1.f, 0.3f);
  vec("embed_norm.weight", {H}, 1.f, 0.3f);
  vec("mask_embedding", {H}, 0.f, 1.f);
  mat("input_proj.weight", H, 2 * H);
  vec("position_embedding", {s.block, H}, 0.f, 0.5f);
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string p = "layers." + std::to_string(i) + ".";
    vec(p + "attn_norm.weight", {H}, 1.f, 0.3f);
    mat(p + "q_proj.weight", A, H, 4.0);  // larger scores: attention weights far from uniform
    mat(p + "k_proj.weight", A, H, 4.0);
    mat(p + "v_proj.weight", A, H);
    mat(p + "o_proj.weight", H, A);
    vec(p + "mlp_norm.weight", {H}, 1.f, 0.3f);
    mat(p + "gate_proj.weight", s.inter, H);
    mat(p + "up_proj.weight", s.inter, H);
    mat(p + "down_proj.weight", H, s.inter);
  }
  vec("final_norm.weight", {H}, 1.f, 0.3f);
  w.write(d->path() + "/model.safetensors");
  std::ofstream(d->path() + "/config.json") << d->config.dump(1);
  return d;
}

// docs/block-drafter.md's arithmetic in float64, written from the document: logits [R][B][V] of R drafts,
// ctx [R][T * H], last tokens [R]; embed_row(id, out) / head_row(v, out) give the target's rows as floats.
template <typename EmbedRow, typename HeadRow>
std::vector<double> reference_drafter_logits(const RandomDrafter& d, const std::vector<float>& ctx,
                                             const std::vector<int32_t>& last, EmbedRow embed_row, HeadRow head_row) {
  const nlohmann::json& c = d.config;
  const int64_t H = c["hidden_size"], NL = c["num_hidden_layers"], nh = c["num_attention_heads"], hd = c["head_dim"],
                I = c["intermediate_size"], B = c["block_size"], V = c["target_vocab_size"];
  const int64_t T = static_cast<int64_t>(c["target_layer_ids"].size()), A = nh * hd, R = static_cast<int64_t>(last.size());
  const double eps = c["rms_norm_eps"];
  auto W = [&](const std::string& n) -> const std::vector<float>& { return d.t.at(n); };
  auto matvec = [](const std::vector<float>& m, int64_t rows, int64_t cols, const std::vector<double>& x) {
    std::vector<double> y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < cols; ++k) y[static_cast<size_t>(r)] += m[static_cast<size_t>(r * cols + k)] * x[static_cast<size_t>(k)];
    return y;
  };
  auto rms = [&](const std::vector<double>& x, const std::vector<float>& w) {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * w[i];
    return y;
  };
  std::vector<double> out(static_cast<size_t>(R * B * V));
  std::vector<float> row(static_cast<size_t>(H));
  for (int64_t r = 0; r < R; ++r) {
    const std::vector<double> cin(ctx.begin() + r * T * H, ctx.begin() + (r + 1) * T * H);
    const std::vector<double> cvec = rms(matvec(W("context_proj.weight"), H, T * H, cin), W("context_norm.weight"));
    std::vector<std::vector<double>> h(static_cast<size_t>(B));
    for (int64_t j = 0; j < B; ++j) {
      std::vector<double> e(static_cast<size_t>(H));
      if (j == 0) {
        embed_row(last[static_cast<size_t>(r)], row.data());
        e.assign(row.begin(), row.end());
      } else {
        e.assign(W("mask_embedding").begin(), W("mask_embedding").end());
      }
      std::vector<double> x = rms(e, W("embed_norm.weight"));
      x.insert(x.end(), cvec.begin(), cvec.end());
      h[static_cast<size_t>(j)] = matvec(W("input_proj.weight"), H, 2 * H, x);
      for (int64_t k = 0; k < H; ++k) h[static_cast<size_t>(j)][static_cast<size_t>(k)] += W("position_embedding")[static_cast<size_t>(j * H + k)];
    }
    for (int64_t l = 0; l < NL; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      std::vector<std::vector<double>> q, k, v;
      for (int64_t j = 0; j < B; ++j) {
        const std::vector<double> x = rms(h[static_cast<size_t>(j)], W(p + "attn_norm.weight"));
        q.push_back(matvec(W(p + "q_proj.weight"), A, H, x));
        k.push_back(matvec(W(p + "k_proj.weight"), A, H, x));
        v.push_back(matvec(W(p + "v_proj.weight"), A, H, x));
      }
      for (int64_t j = 0; j < B; ++j) {
        std::vector<double> o(static_cast<size_t>(A));
        for (int64_t m = 0; m < nh; ++m) {
          std::vector<double> s(static_cast<size_t>(B));
          double mx = -1e300, sum = 0;
          for (int64_t jj = 0; jj < B; ++jj) {
            for (int64_t e2 = 0; e2 < hd; ++e2) s[static_cast<size_t>(jj)] += q[static_cast<size_t>(j)][static_cast<size_t>(m * hd + e2)] * k[static_cast<size_t>(jj)][static_cast<size_t>(m * hd + e2)];
            s[static_cast<size_t>(jj)] /= std::sqrt(static_cast<double>(hd));
            mx = std::max(mx, s[static_cast<size_t>(jj)]);
          }
          for (double& x : s) sum += (x = std::exp(x - mx));
          for (int64_t jj = 0; jj < B; ++jj)
            for (int64_t e2 = 0; e2 < hd; ++e2) o[static_cast<size_t>(m * hd + e2)] += s[static_cast<size_t>(jj)] / sum * v[static_cast<size_t>(jj)][static_cast<size_t>(m * hd + e2)];
        }
        const std::vector<double> y = matvec(W(p + "o_proj.weight"), H, A, o);
        for (int64_t e2 = 0; e2 < H; ++e2) h[static_cast<size_t>(j)][static_cast<size_t>(e2)] += y[static_cast<size_t>(e2)];
      }
      for (int64_t j = 0; j < B; ++j) {
        const std::vector<double> x = rms(h[static_cast<size_t>(j)], W(p + "mlp_norm.weight"));
        std::vector<double> g = matvec(W(p + "gate_proj.weight"), I, H, x);
        const std::vector<double> u = matvec(W(p + "up_proj.weight"), I, H, x);
        for (int64_t i = 0; i < I; ++i) g[static_cast<size_t>(i)] = g[static_cast<size_t>(i)] / (1 + std::exp(-g[static_cast<size_t>(i)])) * u[static_cast<size_t>(i)];
        const std::vector<double> y = matvec(W(p + "down_proj.weight"), H, I, g);
        for (int64_t e2 = 0; e2 < H; ++e2) h[static_cast<size_t>(j)][static_cast<size_t>(e2)] += y[static_cast<size_t>(e2)];
      }
    }
    for (int64_t j = 0; j < B; ++j) {
      const std::vector<double> x = rms(h[static_cast<size_t>(j)], W("final_norm.weight"));
      for (int64_t vv = 0; vv < V; ++vv) {
        head_row(vv, row.data());
        double dot = 0;
        for (int64_t e2 = 0; e2 < H; ++e2) dot += row[static_cast<size_t>(e2)] * x[static_cast<size_t>(e2)];
        out[static_cast<size_t>((r * B + j) * V + vv)] = dot;
      }
    }
  }
  return out;
}

}  // namespace k3test
