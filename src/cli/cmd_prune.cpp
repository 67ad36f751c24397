// `k3 prune -m DIR -o OUT --ratio R -f CALIB [--method reap|frequency] [--ctx N] [--chunks K]`: expert pruning
// (model/expert_prune.h). The calibration text runs through the CPU model in windows of N tokens (as
// `k3 perplexity` does: [BOS] + window) while every routed expert's outputs are scored; each MoE layer then
// keeps the round(E x (1 - R)) experts of highest saliency, and OUT receives the smaller checkpoint.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "cli/calibration.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/compute_options.h"
#include "k3/core/error.h"
#include "k3/model/expert_prune.h"
#include "k3/model/model.h"

namespace k3cli {

namespace {

struct PruneOpts {
  std::string model, out, file, method = "reap";
  double ratio = 0;
  int64_t ctx = 512, chunks = -1;
  bool parse_special = false;
  ComputeOptions compute;
};

int run_prune(const PruneOpts& o) {
  const k3::PruneMethod method = k3::parse_prune_method(o.method);
  if (!(o.ratio > 0 && o.ratio < 1)) throw k3::Error("--ratio: expected a fraction of experts to prune in (0, 1)");
  apply_compute_options(o.compute);
  const std::string dir = resolve_model_dir(o.model);
  auto model = k3::Model::load(dir);
  const k3::ModelConfig& cfg = model->config();
  const int64_t E = cfg.num_experts;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) moe_layers += cfg.is_moe_layer(l) ? 1 : 0;
  if (moe_layers == 0 || E < 2) throw k3::Error("'" + dir + "' has no routed experts to prune");
  const int64_t n_keep = E - static_cast<int64_t>(std::llround(static_cast<double>(E) * o.ratio));
  if (n_keep >= E) throw k3::Error("--ratio " + std::to_string(o.ratio) + " prunes no expert of " + std::to_string(E));
  if (n_keep < cfg.top_k)
    throw k3::Error("--ratio " + std::to_string(o.ratio) + " keeps " + std::to_string(n_keep) + " experts, fewer than the " +
                    std::to_string(cfg.top_k) + " each token is routed to");
  const CalibrationText text = read_calibration(dir, *model, o.file, o.ctx, o.chunks, o.parse_special);

  k3::ExpertSaliency sal(model->weights());
  const int64_t ran = run_calibration(*model, text, sal);
  const auto scores = sal.scores(method);
  const auto keep = k3::experts_to_keep(scores, n_keep);
  std::printf("prune: %s, %lld calibration tokens, %lld MoE layers: %lld -> %lld experts each\n", o.method.c_str(),
              (long long)ran, (long long)moe_layers, (long long)E, (long long)n_keep);
  std::printf("| layer | never routed | lowest kept score | highest pruned score |\n|---|---|---|---|\n");
  for (size_t l = 0; l < keep.size(); ++l) {
    if (keep[l].empty()) continue;
    int64_t never = 0;
    double lo_kept = INFINITY, hi_pruned = 0;
    for (int64_t e = 0; e < E; ++e) {
      never += sal.routed(static_cast<int64_t>(l), e) == 0;
      const double s = scores[l][static_cast<size_t>(e)];
      if (std::find(keep[l].begin(), keep[l].end(), e) != keep[l].end())
        lo_kept = std::min(lo_kept, s);
      else
        hi_pruned = std::max(hi_pruned, s);
    }
    std::printf("| %zu | %lld | %.4g | %.4g |\n", l, (long long)never, lo_kept, hi_pruned);
  }
  const auto r = k3::write_pruned_checkpoint(dir, model->checkpoint(), cfg, keep, o.out, [](int64_t done, int64_t total) {
    std::fprintf(stderr, "\rwriting: %.2f / %.2f GB", done / 1e9, total / 1e9);
  });
  std::fprintf(stderr, "\n");
  std::printf("wrote %s: %lld tensors (%.3f GB), from %lld (%.3f GB)\n", o.out.c_str(), (long long)r.tensors_out, r.bytes_out / 1e9,
              (long long)r.tensors_in, r.bytes_in / 1e9);
  return 0;
}

}  // namespace

void add_prune(CLI::App& app, Registry& reg) {
  auto o = std::make_shared<PruneOpts>();
  auto* cmd = app.add_subcommand("prune", "Expert pruning (REAP) over calibration text: writes a checkpoint with fewer routed experts");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory (default: the built-in model)");
  cmd->add_option("-o,--output", o->out, "directory for the pruned checkpoint (new or empty)")->required();
  cmd->add_option("-f,--file", o->file, "calibration text (UTF-8; chat-formatted data calibrates chat use best)")->required();
  cmd->add_option("--method", o->method, "reap (router-weighted expert activation) | frequency (routing count)")->capture_default_str();
  cmd->add_option("--ratio", o->ratio, "fraction of each MoE layer's experts to prune, in (0, 1)")->required()->check(finite_number());
  cmd->add_option("--ctx", o->ctx, "calibration window length in tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "use at most this many windows (default: all)");
  add_parse_special_flag(cmd, o->parse_special);
  add_compute_options(cmd, o->compute);
  cmd->callback([&reg, o] {
    reg.action = [o] { return run_prune(*o); };
  });
}

}  // namespace k3cli
