#include "k3/model/expert_prune.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "k3/core/error.h"
#include "k3/io/safetensors_writer.h"

namespace k3 {

namespace fs = std::filesystem;

PruneMethod parse_prune_method(const std::string& s) {
  if (s == "reap") return PruneMethod::Reap;
  if (s == "frequency") return PruneMethod::Frequency;
  throw Error("--method: unknown pruning method '" + s + "' (choices: reap, frequency)");
}

ExpertSaliency::ExpertSaliency(const ModelWeights& w) {
  sum_.resize(w.layers.size());
  count_.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    if (!w.layers[l].is_moe) continue;
    layer_of_[&w.layers[l].moe] = static_cast<int64_t>(l);
    sum_[l].assign(w.layers[l].moe.experts.size(), 0.0);
    count_[l].assign(w.layers[l].moe.experts.size(), 0);
  }
}

void ExpertSaliency::on_expert_outputs(const MoeWeights& w, int64_t expert, std::span<const std::pair<int64_t, float>> toks,
                                       const float* y, int64_t cols) {
  const auto it = layer_of_.find(&w);
  if (it == layer_of_.end()) return;  // another model's weights
  const size_t l = static_cast<size_t>(it->second), e = static_cast<size_t>(expert);
  for (size_t j = 0; j < toks.size(); ++j) {
    double n2 = 0;
    const float* r = y + static_cast<int64_t>(j) * cols;
    for (int64_t c = 0; c < cols; ++c) n2 += static_cast<double>(r[c]) * r[c];
    sum_[l][e] += static_cast<double>(toks[j].second) * std::sqrt(n2);
  }
  count_[l][e] += static_cast<int64_t>(toks.size());
}

std::vector<std::vector<double>> ExpertSaliency::scores(PruneMethod m) const {
  std::vector<std::vector<double>> s(sum_.size());
  for (size_t l = 0; l < sum_.size(); ++l)
    for (size_t e = 0; e < sum_[l].size(); ++e) {
      const double n = static_cast<double>(count_[l][e]);
      s[l].push_back(m == PruneMethod::Frequency ? n : (n > 0 ? sum_[l][e] / n : 0.0));
    }
  return s;
}

std::vector<std::vector<int64_t>> experts_to_keep(const std::vector<std::vector<double>>& scores, int64_t n_keep) {
  std::vector<std::vector<int64_t>> keep(scores.size());
  for (size_t l = 0; l < scores.size(); ++l) {
    const auto& s = scores[l];
    if (s.empty()) continue;
    if (n_keep < 1 || n_keep > static_cast<int64_t>(s.size()))
      throw Error("expert pruning: cannot keep " + std::to_string(n_keep) + " of " + std::to_string(s.size()) + " experts");
    std::vector<int64_t> order(s.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)]; });
    keep[l].assign(order.begin(), order.begin() + n_keep);
    std::sort(keep[l].begin(), keep[l].end());
  }
  return keep;
}

namespace {

// "…layers.<L>.block_sparse_moe.<rest>" -> L and rest; false for any other name.
bool moe_tensor(const std::string& name, int64_t* layer, std::string* prefix, std::string* rest) {
  static const std::string kMoe = ".block_sparse_moe.";
  const size_t m = name.find(kMoe);
  if (m == std::string::npos) return false;
  const size_t d = name.rfind("layers.", m);
  if (d == std::string::npos) return false;
  const std::string num = name.substr(d + 7, m - d - 7);
  if (num.empty() || num.size() > 6 || !std::all_of(num.begin(), num.end(), ::isdigit)) return false;
  *layer = std::stoll(num);
  *prefix = name.substr(0, m + kMoe.size());
  *rest = name.substr(m + kMoe.size());
  return true;
}

// "experts.<e>.<tail>" -> e and tail.
bool expert_tensor(const std::string& rest, int64_t* e, std::string* tail) {
  if (rest.rfind("experts.", 0) != 0) return false;
  const size_t dot = rest.find('.', 8);
  if (dot == std::string::npos) return false;
  const std::string num = rest.substr(8, dot - 8);
  if (num.empty() || num.size() > 7 || !std::all_of(num.begin(), num.end(), ::isdigit)) return false;
  *e = std::stoll(num);
  *tail = rest.substr(dot + 1);
  return true;
}

// The rows (dim 0 = experts) of `t` that `keep` names, as a new tensor.
std::vector<uint8_t> keep_rows(const TensorInfo& t, int64_t E, const std::vector<int64_t>& keep) {
  if (t.shape.empty() || t.shape[0] != E)
    throw Error("expert pruning: '" + t.name + "' has shape " + t.shape_str() + ", expected " + std::to_string(E) + " experts first");
  const size_t row = t.nbytes / static_cast<size_t>(E);
  std::vector<uint8_t> out;
  out.reserve(row * keep.size());
  for (int64_t e : keep) out.insert(out.end(), t.data + static_cast<size_t>(e) * row, t.data + static_cast<size_t>(e + 1) * row);
  return out;
}

void write_config(const std::string& src_dir, const std::string& out_dir, int64_t n_experts) {
  std::ifstream in(src_dir + "/config.json");
  if (!in) throw Error("cannot read '" + src_dir + "/config.json'");
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(in);
  int updated = 0;
  for (auto* obj : {&j, j.contains("text_config") ? &j["text_config"] : nullptr})
    if (obj && obj->is_object() && obj->contains("num_experts")) (*obj)["num_experts"] = n_experts, ++updated;
  if (updated == 0) throw Error("'" + src_dir + "/config.json' has no num_experts to update");
  std::ofstream(out_dir + "/config.json") << j.dump(2) << "\n";
}

}  // namespace

PruneWriteResult write_pruned_checkpoint(const std::string& src_dir, const Checkpoint& ckpt, const ModelConfig& cfg,
                                         const std::vector<std::vector<int64_t>>& keep, const std::string& out_dir,
                                         const std::function<void(int64_t, int64_t)>& progress) {
  std::error_code ec;
  if (fs::exists(out_dir) && fs::equivalent(out_dir, src_dir, ec)) throw Error("prune: the output directory is the model's own");
  if (fs::exists(out_dir + "/config.json")) throw Error("prune: '" + out_dir + "' already holds a model (config.json); choose an empty directory");
  fs::create_directories(out_dir, ec);
  if (ec) throw Error("prune: cannot create '" + out_dir + "': " + ec.message());
  const int64_t E = cfg.num_experts;
  int64_t n_keep = -1;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const auto& k = keep.at(static_cast<size_t>(l));
    if (cfg.is_moe_layer(l) != !k.empty()) throw Error("prune: keep list of layer " + std::to_string(l) + " does not match the config");
    if (k.empty()) continue;
    if (n_keep >= 0 && static_cast<int64_t>(k.size()) != n_keep) throw Error("prune: every MoE layer must keep as many experts");
    n_keep = static_cast<int64_t>(k.size());
  }
  if (n_keep < cfg.top_k) throw Error("prune: keeping " + std::to_string(n_keep) + " experts, fewer than the " + std::to_string(cfg.top_k) + " each token uses");

  // Tensors per shard, in file order.
  std::map<std::string, std::vector<const TensorInfo*>> shards;
  for (const auto& [name, t] : ckpt.all()) shards[t->file].push_back(t);
  PruneWriteResult r;
  r.bytes_in = static_cast<int64_t>(ckpt.total_bytes());
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  int64_t done = 0;
  for (auto& [file, ts] : shards) {
    std::sort(ts.begin(), ts.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->data < b->data; });
    SafetensorsWriter w;
    for (const TensorInfo* t : ts) {
      ++r.tensors_in;
      done += static_cast<int64_t>(t->nbytes);
      int64_t layer = 0, e = 0;
      std::string prefix, rest, tail, name = t->name;
      if (moe_tensor(t->name, &layer, &prefix, &rest) && layer >= 0 && layer < cfg.num_layers && cfg.is_moe_layer(layer)) {
        const auto& k = keep[static_cast<size_t>(layer)];
        if (expert_tensor(rest, &e, &tail)) {
          const auto pos = std::find(k.begin(), k.end(), e);
          if (pos == k.end()) continue;  // pruned
          name = prefix + "experts." + std::to_string(pos - k.begin()) + "." + tail;
        } else if (rest == "gate.weight" || rest == "gate.e_score_correction_bias") {
          std::vector<int64_t> shape = t->shape;
          shape[0] = n_keep;
          auto rows = keep_rows(*t, E, k);
          r.bytes_out += static_cast<int64_t>(rows.size());
          w.add_owned(name, t->dtype, shape, std::move(rows));
          weight_map[name] = fs::path(file).filename().string();
          ++r.tensors_out;
          continue;
        }
      }
      w.add_view(name, t->dtype, t->shape, t->data, t->nbytes);
      weight_map[name] = fs::path(file).filename().string();
      r.bytes_out += static_cast<int64_t>(t->nbytes);
      ++r.tensors_out;
    }
    if (!w.empty()) w.write(out_dir + "/" + fs::path(file).filename().string());
    if (progress) progress(done, r.bytes_in);
  }
  if (shards.size() > 1 || fs::exists(src_dir + "/model.safetensors.index.json")) {
    nlohmann::ordered_json idx = {{"metadata", {{"total_size", r.bytes_out}}}, {"weight_map", weight_map}};
    std::ofstream(out_dir + "/model.safetensors.index.json") << idx.dump(2) << "\n";
  }
  write_config(src_dir, out_dir, n_keep);
  for (const auto& f : fs::directory_iterator(src_dir)) {  // tokenizer, templates, generation config, ...
    const std::string n = f.path().filename().string();
    if (!f.is_regular_file() || n == "config.json" || n == "model.safetensors.index.json" || f.path().extension() == ".safetensors") continue;
    fs::copy_file(f.path(), out_dir + "/" + n, fs::copy_options::overwrite_existing, ec);
    if (ec) throw Error("prune: cannot copy '" + f.path().string() + "': " + ec.message());
  }
  return r;
}

}  // namespace k3
