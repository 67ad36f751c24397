#include "k3/model/model.h"

#include <unistd.h>

#include "k3/model/graph/forward.h"
#include "k3/model/model_files.h"

namespace k3 {

int64_t Model::memory_available() const {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
}

namespace {

// The byte ranges expert `e` reads: its three matrices' data and scales.
std::vector<ByteSpan> expert_spans(const GluMlp& e) {
  std::vector<ByteSpan> s;
  for (const WeightMatrix* m : {&e.gate, &e.up, &e.down}) {
    const int64_t data = m->rows * row_data_bytes(m->format, m->cols);
    const int64_t scales = m->rows * row_scale_bytes(m->format, m->cols);
    s.push_back({static_cast<const uint8_t*>(m->data), static_cast<size_t>(data)});
    if (m->scales) s.push_back({m->scales, static_cast<size_t>(scales)});
  }
  return s;
}

// The residency manager over the model's routed experts, or null (no MoE layer, or turned off). The
// automatic budget pins nothing when the whole checkpoint fits in half the available memory: the page
// cache keeps all of it anyway.
std::unique_ptr<ExpertResidency> make_residency(const ModelWeights& w, const Checkpoint& ck,
                                                ExpertResidencyOptions opt) {
  if (!opt.enabled) return nullptr;
  int64_t expert_bytes = 0;
  bool any = false;
  for (const LayerWeights& L : w.layers)
    for (const GluMlp& e : L.moe.experts) {
      any = true;
      for (const WeightMatrix* m : {&e.gate, &e.up, &e.down}) expert_bytes += m->bytes();
    }
  if (!any) return nullptr;
  if (opt.hot_budget_bytes == ExpertResidencyOptions::kAutoBudget) {
    const int64_t auto_budget = ExpertResidency::auto_budget(w.bound_bytes - expert_bytes);
    opt.hot_budget_bytes = static_cast<int64_t>(ck.total_bytes()) <= auto_budget + (w.bound_bytes - expert_bytes)
                               ? 0
                               : auto_budget;
  }
  std::vector<ByteSpan> regions;
  for (const MappedFile* f : ck.mappings()) regions.push_back({f->data(), f->size()});
  auto r = std::make_unique<ExpertResidency>(opt, std::move(regions));
  for (const LayerWeights& L : w.layers) {
    if (L.moe.experts.empty()) continue;
    std::vector<std::vector<ByteSpan>> experts;
    for (const GluMlp& e : L.moe.experts) experts.push_back(expert_spans(e));
    r->add_layer(L.moe.experts[0].gate.data, experts);
  }
  return r;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& dir, CacheDType kv, CacheDType ssm, ExpertResidencyOptions experts) {
  auto m = std::unique_ptr<Model>(new Model());
  ModelFiles files = open_model_files(dir);  // an HF directory or a GGUF file
  m->cfg_ = std::move(files.config);
  m->spec_ = make_cache_spec(m->cfg_, kv, ssm);
  m->ckpt_ = std::move(files.checkpoint);
  m->w_ = bind_weights(m->cfg_, *m->ckpt_);
  m->residency_ = make_residency(m->w_, *m->ckpt_, experts);
  m->backend_.set_expert_residency(m->residency_.get());
  return m;
}

std::optional<ExpertCacheStats> Model::expert_cache_stats() const {
  if (!residency_) return std::nullopt;
  return residency_->stats();
}

void Model::forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                          const ForwardOptions& opt) const {
  check_tap_layers(opt, cfg_.num_layers);
  const graph::StepPlan plan = graph::plan_step(items, opt, cfg_.vocab_size, spec_);
  logits.resize(static_cast<size_t>(plan.n_logits() * cfg_.vocab_size));
  const int64_t T = static_cast<int64_t>(plan.tap_layers.size()), R = plan.n_logits(), H = cfg_.hidden_size;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tap_major_.resize(static_cast<size_t>(T * R * H));
    graph::forward(cfg_, w_, backend_, plan, graph::Tensor::f32(logits.data(), R, cfg_.vocab_size), nullptr,
                   graph::Tensor::f32(tap_major_.data(), T * R, H));
    if (T > 0) taps_to_rows(tap_major_.data(), T, R, H, *opt.taps);
  }
  graph::finish_step(plan);
}

}  // namespace k3
