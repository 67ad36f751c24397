#include "k3/model/drafter/block_drafter.h"

#include <algorithm>
#include <mutex>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/core/error.h"
#include "k3/io/safetensors.h"
#include "k3/model/drafter/drafter_forward.h"
#include "k3/model/drafter/drafter_weights.h"
#include "k3/model/graph/step.h"
#include "k3/model/model_files.h"
#include "k3/model/weight_binder.h"

namespace k3::drafter {

namespace {

// The default runner: the forward on the CPU backend, over the host weights, straight into the caller's vectors.
class CpuDrafterRunner final : public DrafterRunner {
 public:
  CpuDrafterRunner(const DrafterConfig& c, const DrafterWeights& w) : c_(c), w_(w) {}
  void forward(const graph::StepPlan& plan, std::span<const float> ctx, int64_t n_out, std::vector<float>& logits) override {
    const int64_t R = plan.n_tokens();
    drafter_forward(c_, w_, backend_, plan, graph::Tensor::f32(const_cast<float*>(ctx.data()), R, c_.ctx_dim()), n_out,
                    graph::Tensor::f32(logits.data(), R * n_out, w_.target_lm_head.rows));
  }
  std::string device_name() const override { return "cpu"; }

 private:
  const DrafterConfig& c_;
  const DrafterWeights& w_;
  cpu::CpuBackend backend_;
};

}  // namespace

struct BlockDrafter::Impl {
  DrafterConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  DrafterWeights w;
  std::unique_ptr<Checkpoint> target_ckpt;  // load(dir, target_path): the target's files, mapped here
  std::vector<std::vector<uint8_t>> target_copies;
  std::mutex mu;  // one forward at a time: a runner's scratch is shared
  std::unique_ptr<DrafterRunner> runner;
};

BlockDrafter::BlockDrafter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { set_runner(nullptr); }
BlockDrafter::~BlockDrafter() = default;

const DrafterConfig& BlockDrafter::config() const { return impl_->cfg; }
const DrafterWeights& BlockDrafter::weights() const { return impl_->w; }

void BlockDrafter::set_runner(std::unique_ptr<DrafterRunner> r) {
  std::lock_guard lk(impl_->mu);
  impl_->runner = r ? std::move(r) : std::make_unique<CpuDrafterRunner>(impl_->cfg, impl_->w);
}

std::string BlockDrafter::device_name() const {
  std::lock_guard lk(impl_->mu);
  return impl_->runner->device_name();
}

namespace {

std::unique_ptr<Checkpoint> open_drafter(const std::string& dir, const ModelConfig& target, DrafterConfig& cfg) {
  cfg = load_drafter_config(dir);
  check_drafter_target(cfg, target);
  return std::make_unique<Checkpoint>(dir);
}

void check_head(const WeightMatrix& m, const char* what, const ModelConfig& t) {
  if (m.empty() || m.rows != t.vocab_size || m.cols != t.hidden_size || m.device != kHostDevice)
    throw Error(std::string("block drafter: the target's ") + what + " must be a host matrix [" + std::to_string(t.vocab_size) +
                "][" + std::to_string(t.hidden_size) + "]");
}

}  // namespace

std::unique_ptr<BlockDrafter> BlockDrafter::load(const std::string& dir, const ModelConfig& target, const WeightMatrix& embed,
                                                 const WeightMatrix& lm_head) {
  check_head(embed, "token embedding", target);
  check_head(lm_head, "lm_head", target);
  auto impl = std::make_unique<Impl>();
  impl->ckpt = open_drafter(dir, target, impl->cfg);
  impl->w = bind_drafter_weights(impl->cfg, *impl->ckpt);
  impl->w.target_embed = embed;
  impl->w.target_lm_head = lm_head;
  return std::unique_ptr<BlockDrafter>(new BlockDrafter(std::move(impl)));
}

std::unique_ptr<BlockDrafter> BlockDrafter::load(const std::string& dir, const std::string& target_path) {
  ModelFiles f = open_model_files(target_path);
  const ModelConfig& t = f.config;
  auto impl = std::make_unique<Impl>();
  impl->ckpt = open_drafter(dir, t, impl->cfg);
  impl->w = bind_drafter_weights(impl->cfg, *impl->ckpt);
  // Only the two matrices the drafter reads are bound (bind_weights would check every expert's scales).
  WeightBinder b(*f.checkpoint, impl->target_copies);
  impl->w.target_embed = b.mat(t.tensor_prefix + "embed_tokens.weight", t.vocab_size, t.hidden_size);
  impl->w.target_lm_head = t.tie_word_embeddings ? impl->w.target_embed : b.mat(t.lm_head_name, t.vocab_size, t.hidden_size);
  b.check();
  impl->target_ckpt = std::move(f.checkpoint);
  return std::unique_ptr<BlockDrafter>(new BlockDrafter(std::move(impl)));
}

graph::StepPlan BlockDrafter::plan_drafts(std::span<const float> ctx, std::span<const int32_t> tokens, int64_t n_out) const {
  const DrafterConfig& c = impl_->cfg;
  const int64_t R = static_cast<int64_t>(tokens.size()), V = c.target_vocab_size;
  if (R < 1 || static_cast<int64_t>(ctx.size()) != R * c.ctx_dim() || n_out < 1 || n_out > c.block_size)
    throw Error("block drafter: " + std::to_string(R) + " drafts need " + std::to_string(R * c.ctx_dim()) + " tap values (got " +
                std::to_string(ctx.size()) + ") and 1 <= n_out (" + std::to_string(n_out) + ") <= block_size (" +
                std::to_string(c.block_size) + ")");
  graph::StepPlan plan;
  plan.tokens.assign(tokens.begin(), tokens.end());
  for (const int32_t t : plan.tokens)
    if (t < 0 || t >= V) throw Error("block drafter: token id " + std::to_string(t) + " out of range [0, " + std::to_string(V) + ")");
  return plan;
}

void BlockDrafter::forward(std::span<const float> ctx, std::span<const int32_t> tokens, int64_t n_out,
                           std::vector<float>& logits) const {
  const graph::StepPlan plan = plan_drafts(ctx, tokens, n_out);
  logits.resize(static_cast<size_t>(plan.n_tokens() * n_out * impl_->cfg.target_vocab_size));
  std::lock_guard lk(impl_->mu);
  impl_->runner->forward(plan, ctx, n_out, logits);
}

void BlockDrafter::draft(std::span<const float> ctx, std::span<const int32_t> tokens, int64_t n_out,
                         std::vector<int32_t>& drafts) const {
  const graph::StepPlan plan = plan_drafts(ctx, tokens, n_out);
  const size_t V = static_cast<size_t>(impl_->cfg.target_vocab_size), rows = static_cast<size_t>(plan.n_tokens() * n_out);
  drafts.resize(rows);
  std::lock_guard lk(impl_->mu);
  if (impl_->runner->draft_ids(plan, ctx, n_out, drafts)) return;  // argmax'd where the logits are
  thread_local std::vector<float> logits;  // reused: [R][n_out][V] per call
  logits.resize(rows * V);
  impl_->runner->forward(plan, ctx, n_out, logits);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = logits.data() + r * V;
    drafts[r] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
}

}  // namespace k3::drafter
