#include "k3/model/model.h"

#include <unistd.h>

#include "k3/model/graph/forward.h"

namespace k3 {

int64_t Model::memory_available() const {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGE_SIZE));
}

std::unique_ptr<Model> Model::load(const std::string& dir, CacheDType kv, CacheDType ssm) {
  auto m = std::unique_ptr<Model>(new Model());
  m->cfg_ = load_model_config(dir);
  m->spec_ = make_cache_spec(m->cfg_, kv, ssm);
  m->ckpt_ = std::make_unique<Checkpoint>(dir);
  m->w_ = bind_weights(m->cfg_, *m->ckpt_);
  return m;
}

void Model::forward_batch(const std::vector<BatchItem>& items, std::vector<float>& logits,
                          const ForwardOptions& opt) const {
  const graph::StepPlan plan = graph::plan_step(items, opt, cfg_.vocab_size, spec_);
  logits.resize(static_cast<size_t>(plan.n_logits() * cfg_.vocab_size));
  {
    std::lock_guard<std::mutex> lock(mu_);
    graph::forward(cfg_, w_, backend_, plan, graph::Tensor::f32(logits.data(), plan.n_logits(), cfg_.vocab_size));
  }
  graph::finish_step(plan);
}

}  // namespace k3
