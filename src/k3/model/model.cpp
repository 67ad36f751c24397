#include "k3/model/model.h"

#include <unistd.h>

#include "k3/model/expert_residency_setup.h"
#include "k3/model/graph/forward.h"
#include "k3/model/model_files.h"

namespace k3 {

int64_t Model::memory_available() const {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
}

std::unique_ptr<Model> Model::load(const std::string& dir, CacheDType kv, CacheDType ssm, ExpertResidencyOptions experts) {
  return load(open_model_files(dir), kv, ssm, experts);  // an HF directory or a GGUF file
}

std::unique_ptr<Model> Model::load(ModelFiles files, CacheDType kv, CacheDType ssm, ExpertResidencyOptions experts) {
  auto m = std::unique_ptr<Model>(new Model());
  m->cfg_ = std::move(files.config);
  m->spec_ = make_cache_spec(m->cfg_, kv, ssm);
  m->ckpt_ = std::move(files.checkpoint);
  m->w_ = bind_weights(m->cfg_, *m->ckpt_);
  m->residency_ = make_expert_residency(m->w_, *m->ckpt_, experts);
  m->backend_.set_expert_residency(m->residency_.get());
  return m;
}

void Model::add_decode_layouts(bool experts) {
  std::lock_guard lk(mu_);
  if (decode_layouts_.bytes == 0) decode_layouts_ = cpu::add_decode_layouts(w_);
  if (experts && expert_layouts_.bytes == 0) expert_layouts_ = cpu::add_expert_decode_layouts(w_);
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
