#include "k3/model/imatrix.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/io/gguf_writer.h"
#include "k3/model/gguf_names.h"

namespace k3 {

namespace {

constexpr uint32_t kGgmlF32 = 0;

// The name binding used for a matrix: its HF tensor (the packed half for compressed-tensors blocks) as
// hf_to_gguf spells the GGUF tensor it is written to.
std::optional<std::string> gguf_name_of(const ModelConfig& c, const std::string& hf) {
  std::string canonical = hf;
  for (const char* sfx : {".weight_packed", ".weight_scale"}) {
    const std::string s = sfx;
    if (hf.size() > s.size() && hf.compare(hf.size() - s.size(), s.size(), s) == 0)
      canonical = hf.substr(0, hf.size() - s.size()) + ".weight";
  }
  auto g = hf_to_gguf(c, canonical);
  if (!g || g->rfind("blk.", 0) != 0) return std::nullopt;  // outside the blocks: not collected
  return g;
}

}  // namespace

std::vector<float> Imatrix::importance(const std::string& name, int64_t mat, int64_t cols) const {
  const auto it = entries.find(name);
  if (it == entries.end() || it->second.cols != cols) return {};
  const ImatrixEntry& e = it->second;
  const int64_t n_mat = static_cast<int64_t>(e.counts.size());
  if (mat < 0 || mat >= n_mat || e.counts[static_cast<size_t>(mat)] <= 0) return {};
  std::vector<float> w(static_cast<size_t>(cols));
  const double n = e.counts[static_cast<size_t>(mat)];
  for (int64_t c = 0; c < cols; ++c) {
    // A column no input ever reached still gets a tiny weight: the quantisers need every weight > 0.
    w[static_cast<size_t>(c)] = static_cast<float>(std::max(e.in_sum2[static_cast<size_t>(mat * cols + c)] / n, 1e-12));
  }
  return w;
}

ImatrixCollector::ImatrixCollector(const ModelConfig& c, const ModelWeights& w, const Checkpoint& ckpt) {
  std::unordered_map<const void*, std::string> hf_of;
  for (const auto& [name, t] : ckpt.all()) hf_of.emplace(t->data, name);
  auto name = [&](const WeightMatrix& m) -> std::optional<std::string> {
    const auto it = hf_of.find(m.data);
    if (m.empty() || it == hf_of.end()) return std::nullopt;
    return gguf_name_of(c, it->second);
  };
  for_each_matrix(w, [&](const WeightMatrix& m) {
    if (const auto g = name(m)) name_of_.emplace(m.data, *g);
  });
  for (const LayerWeights& L : w.layers) {
    if (!L.is_moe || L.moe.experts.empty()) continue;
    const GluMlp& e0 = L.moe.experts[0];
    const auto g = name(e0.gate), u = name(e0.up), d = name(e0.down);
    if (g && u && d) experts_[&L.moe] = {*g, *u, *d, static_cast<int64_t>(L.moe.experts.size())};
    for (const GluMlp& e : L.moe.experts)  // experts come through on_expert_inputs, not as dense products
      for (const WeightMatrix* m : {&e.gate, &e.up, &e.down}) name_of_.erase(m->data);
  }
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    if (L.is_kda || L.mla.kv_b_f32.empty()) continue;
    // hf_to_gguf spells layer l's blocks blk.<l>; kv_b becomes these two (gguf_export.cpp writes them)
    const std::string blk = "blk." + std::to_string(l) + ".";
    kv_b_[&L.mla] = {blk + "attn_k_b.weight", blk + "attn_v_b.weight"};
    for (const WeightMatrix* m : {&L.mla.kv_b_f32, &L.mla.kv_b_stored}) name_of_.erase(m->data);
  }
}

void ImatrixCollector::add(const std::string& name, int64_t mat, int64_t n_mat, const float* x, int64_t rows,
                           int64_t cols, int64_t stride) {
  if (stride == 0) stride = cols;
  ImatrixEntry& e = im_.entries[name];
  if (e.counts.empty()) {
    e.cols = cols;
    e.in_sum2.assign(static_cast<size_t>(n_mat * cols), 0.0);
    e.counts.assign(static_cast<size_t>(n_mat), 0.0);
  }
  if (e.cols != cols || static_cast<int64_t>(e.counts.size()) != n_mat)
    throw Error("imatrix: matrix '" + name + "' seen with two shapes");
  double* s = e.in_sum2.data() + mat * cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * stride;
    for (int64_t c = 0; c < cols; ++c) s[c] += static_cast<double>(xr[c]) * xr[c];
  }
  e.counts[static_cast<size_t>(mat)] += static_cast<double>(rows);
}

void ImatrixCollector::on_linear_input(const WeightMatrix& W, const float* x, int64_t n) {
  const auto it = name_of_.find(W.data);
  if (it != name_of_.end()) add(it->second, 0, 1, x, n, W.cols);
}

void ImatrixCollector::on_mla_absorbed(const MlaWeights& w, const graph::MlaDims& d, const float* q, const float* ol,
                                       std::span<const int64_t> rows) {
  const auto it = kv_b_.find(&w);
  if (it == kv_b_.end()) return;
  const int64_t nh = d.heads, qk = d.qk(), kr = d.rank;
  for (const int64_t r : rows)
    for (int64_t h = 0; h < nh; ++h) {
      add(it->second.k_b, h, nh, q + (r * nh + h) * qk, 1, d.nope);  // q_nope: each head's first nope values
      add(it->second.v_b, h, nh, ol + (r * nh + h) * kr, 1, kr);
    }
}

void ImatrixCollector::on_expert_inputs(const MoeWeights& w, int64_t expert, const float* x, const float* h, int64_t m) {
  const auto it = experts_.find(&w);
  if (it == experts_.end()) return;
  const GluMlp& e = w.experts[static_cast<size_t>(expert)];
  add(it->second.gate, expert, it->second.n, x, m, e.gate.cols);
  add(it->second.up, expert, it->second.n, x, m, e.up.cols);
  add(it->second.down, expert, it->second.n, h, m, e.down.cols);
}

void write_imatrix(const Imatrix& im, const std::string& path) {
  GgufWriter w;
  w.set_string("general.type", "imatrix");
  w.set_array_strings("imatrix.datasets", im.datasets);
  w.set_u32("imatrix.chunk_count", static_cast<uint32_t>(im.chunk_count));
  w.set_u32("imatrix.chunk_size", static_cast<uint32_t>(im.chunk_size));
  for (const auto& [name, e] : im.entries) {  // std::map: sorted by name, as llama-imatrix writes them
    const int64_t n_mat = static_cast<int64_t>(e.counts.size());
    auto sums = std::make_shared<std::vector<float>>(e.in_sum2.begin(), e.in_sum2.end());
    auto counts = std::make_shared<std::vector<float>>(e.counts.begin(), e.counts.end());
    w.add_tensor(name + ".in_sum2", {e.cols, n_mat}, kGgmlF32, [sums](GgufSink& s) { s.write(sums->data(), sums->size() * 4); });
    w.add_tensor(name + ".counts", {1, n_mat}, kGgmlF32, [counts](GgufSink& s) { s.write(counts->data(), counts->size() * 4); });
  }
  w.write(path);
}

Imatrix read_imatrix(const std::string& path) {
  GgufFile f(path);
  return parse_imatrix(f.gguf(), path);
}

Imatrix parse_imatrix(const Gguf& g, const std::string& path) {
  const auto where = [&](const std::string& what) { return "'" + path + "': " + what; };
  if (!g.metadata.contains("general.type") || g.metadata["general.type"] != "imatrix")
    throw Error(where("not an imatrix GGUF (general.type is not \"imatrix\"; the legacy .dat format is not read)"));
  Imatrix im;
  if (g.metadata.contains("imatrix.datasets") && g.metadata["imatrix.datasets"].is_array())
    for (const auto& d : g.metadata["imatrix.datasets"])
      if (d.is_string()) im.datasets.push_back(d.get<std::string>());
  for (const char* k : {"imatrix.chunk_count", "imatrix.chunk_size"})
    if (g.metadata.contains(k) && g.metadata[k].is_number_integer())
      (std::string(k) == "imatrix.chunk_count" ? im.chunk_count : im.chunk_size) = g.metadata[k].get<int64_t>();
  static const std::string kSums = ".in_sum2";
  for (const GgufTensor& t : g.tensors) {
    if (t.name.size() <= kSums.size() || t.name.compare(t.name.size() - kSums.size(), kSums.size(), kSums) != 0) continue;
    const std::string name = t.name.substr(0, t.name.size() - kSums.size());
    const GgufTensor* c = g.find(name + ".counts");
    if (!c) throw Error(where("tensor '" + t.name + "' has no '" + name + ".counts'"));
    const int64_t cols = t.dims[0], n_mat = t.dims.size() > 1 ? t.dims[1] : 1;
    if (t.type != kGgmlF32 || c->type != kGgmlF32 || t.dims.size() > 2 || c->elements() != n_mat)
      throw Error(where("tensors '" + t.name + "' / '" + c->name + "': expected F32 [cols, n_mat] and F32 [1, n_mat]"));
    ImatrixEntry e;
    e.cols = cols;
    e.in_sum2.resize(static_cast<size_t>(cols * n_mat));
    e.counts.resize(static_cast<size_t>(n_mat));
    for (size_t i = 0; i < e.in_sum2.size(); ++i) {
      float v;
      std::memcpy(&v, t.data + 4 * i, 4);
      if (!std::isfinite(v) || v < 0) throw Error(where("tensor '" + t.name + "' holds a negative or non-finite sum"));
      e.in_sum2[i] = v;
    }
    for (size_t i = 0; i < e.counts.size(); ++i) {
      float v;
      std::memcpy(&v, c->data + 4 * i, 4);
      if (!std::isfinite(v) || v < 0) throw Error(where("tensor '" + c->name + "' holds a negative or non-finite count"));
      e.counts[i] = v;
    }
    im.entries.emplace(name, std::move(e));
  }
  if (im.entries.empty()) throw Error(where("holds no <name>.in_sum2 tensors"));
  return im;
}

}  // namespace k3
