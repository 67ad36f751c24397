// `k3 perplexity [-m DIR] -f FILE [--ctx N] [--chunks K]`: perplexity of a model on a text file.
// Rule (shared with python/k3tiny/evaluate.py, docs/perplexity.md): the whole file is tokenised with
// encode_ordinary and cut into consecutive, non-overlapping windows of N tokens (the last may be
// shorter); each window is run from an empty state as [BOS] + window, and every window token is
// scored given BOS and the window tokens before it. PPL = exp(total NLL / scored tokens).
// KL divergence (llama-perplexity's flags): `--kl-divergence-base FILE` saves every scored position's
// log-probs; adding `--kl-divergence` reads them instead and compares this model with that base
// (k3/eval/kl_divergence.h; -f may then be left out: the base file holds the tokens).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/calibration.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "k3/core/error.h"
#include "k3/eval/kl_divergence.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

namespace {

struct PerplexityOpts {
  std::string model, file, json_out, kl_base;
  bool kl_compare = false;
  DeviceOptions dev;
  int64_t ctx = 512, chunks = -1;
};


// What each scored position feeds besides the NLL: nothing, the base file being written, or the
// comparison with a base file being read.
struct KlMode {
  std::unique_ptr<k3::eval::KlBaseWriter> writer;
  std::unique_ptr<k3::eval::KlBase> base;
  k3::eval::KlAccumulator acc;
};

void print_kl(const k3::eval::KlSummary& s, nlohmann::json& j) {
  std::printf("kl_positions %lld\nppl_base %.4f\nppl_ratio %.6f\nln_ppl_ratio %.6f\n", (long long)s.n, s.ppl_base,
              s.ppl / s.ppl_base, std::log(s.ppl / s.ppl_base));
  std::printf("kld_mean %.6g\nkld_stderr %.3g\nkld_median %.6g\nkld_p90 %.6g\nkld_p99 %.6g\nkld_p99_9 %.6g\nkld_max %.6g\n",
              s.kld_mean, s.kld_stderr, s.kld_median, s.kld_p90, s.kld_p99, s.kld_p999, s.kld_max);
  std::printf("same_top1 %.4f\nrms_dp %.6f\n", s.same_top1, s.rms_dp);
  j["kl_divergence"] = {{"positions", s.n},          {"ppl_base", s.ppl_base},     {"ppl_ratio", s.ppl / s.ppl_base},
                        {"kld_mean", s.kld_mean},    {"kld_stderr", s.kld_stderr}, {"kld_median", s.kld_median},
                        {"kld_p90", s.kld_p90},      {"kld_p99", s.kld_p99},       {"kld_p99_9", s.kld_p999},
                        {"kld_max", s.kld_max},      {"same_top1", s.same_top1},   {"rms_dp", s.rms_dp}};
}

int run_perplexity(const PerplexityOpts& o) {
  if (o.kl_compare && o.kl_base.empty()) throw k3::Error("--kl-divergence needs --kl-divergence-base FILE (the base's log-probs)");
  if (o.file.empty() && !o.kl_compare) throw k3::Error("-f/--file is required (the text to score)");
  const std::string dir = resolve_model_dir(o.model);
  auto model = load_model(dir, o.dev);
  const int64_t V = model->config().vocab_size;
  // The tokenizer only for text: a comparison with a base file takes the base's tokens.
  std::optional<k3::text::Tokenizer> tok;
  if (!o.file.empty() || model->config().bos_token_id < 0) {
    tok.emplace(load_tokenizer(dir, o.dev));
    check_tokenizer_fits(tok->n_vocab(), V);
  }
  KlMode kl;
  int64_t ctx = o.ctx;
  std::vector<int32_t> ids;
  if (o.kl_compare) {
    kl.base = std::make_unique<k3::eval::KlBase>(o.kl_base);
    const auto& h = kl.base->header();
    if (h.n_vocab != V)
      throw k3::Error("'" + o.kl_base + "' holds a " + std::to_string(h.n_vocab) + "-token vocabulary, this model's is " + std::to_string(V));
    ids.assign(kl.base->ids().begin(), kl.base->ids().end());
    ctx = h.ctx;  // the base's windows, whatever --ctx says
    if (!o.file.empty()) {  // the base may cover fewer windows (--chunks): its tokens start the text's
      const auto text_ids = read_text_ids(o.file, *tok);
      if (text_ids.size() < ids.size() || !std::equal(ids.begin(), ids.end(), text_ids.begin()))
        throw k3::Error("'" + o.file + "' does not tokenise to the tokens of '" + o.kl_base + "' (other text or tokenizer)");
    }
  } else {
    ids = read_text_ids(o.file, *tok);
  }
  const int64_t bos = model->config().bos_token_id >= 0 ? model->config().bos_token_id : tok->bos_id();
  if (bos < 0) throw k3::Error("the model has no BOS token id; perplexity windows start with BOS");
  int64_t N = static_cast<int64_t>(ids.size());
  int64_t windows = (N + ctx - 1) / ctx;
  if (o.chunks >= 0 && !o.kl_compare) windows = std::min(windows, o.chunks);
  N = std::min(N, windows * ctx);  // the tokens the windows cover
  if (N == 0) throw k3::Error("'" + o.file + "' holds no tokens to score");
  if (!o.kl_base.empty() && !o.kl_compare)
    kl.writer = std::make_unique<k3::eval::KlBaseWriter>(o.kl_base, V, ctx, std::span<const int32_t>(ids.data(), static_cast<size_t>(N)));
  std::fprintf(stderr, "perplexity: %lld tokens, %lld windows of %lld%s\n", (long long)N, (long long)windows, (long long)ctx,
               kl.writer ? " (saving the base log-probs)" : kl.base ? " (KL divergence against the base)" : "");
  double nll = 0;
  int64_t scored = 0;
  std::vector<float> logits, logp(static_cast<size_t>(V));
  std::vector<int32_t> win;
  k3::ForwardOptions fo;
  fo.all_logits = true;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t w = 0; w < windows; ++w) {
    const int64_t b = w * ctx, e = std::min(N, b + ctx);
    win.assign(1, static_cast<int32_t>(bos));
    win.insert(win.end(), ids.begin() + b, ids.begin() + e);
    auto st = model->new_cache();
    model->forward(win, *st, logits, fo);
    for (int64_t i = 0; i + 1 < static_cast<int64_t>(win.size()); ++i) {
      const float* l = logits.data() + i * V;
      const int32_t next = win[static_cast<size_t>(i + 1)];
      k3::eval::log_softmax(l, V, logp.data());
      nll -= logp[static_cast<size_t>(next)];
      if (kl.writer) kl.writer->add_row(logp.data());
      if (kl.base) kl.acc.add(kl.base->row(scored), logp.data(), V, next);
      ++scored;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\r[%lld/%lld] ppl %.4f  %.0f tok/s", (long long)(w + 1), (long long)windows,
                 std::exp(nll / std::max<int64_t>(scored, 1)), scored / std::max(secs, 1e-9));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n");
  if (kl.writer) kl.writer->finish();
  const double mean = nll / static_cast<double>(scored);
  const std::string src = o.file.empty() ? o.kl_base : o.file;
  std::printf("file %s\nmodel %s\nwindows %lld x ctx %lld\ntokens %lld\nmean_nll %.6f\nperplexity %.4f\ntok_per_s %.1f\n",
              src.c_str(), dir.c_str(), (long long)windows, (long long)ctx, (long long)scored, mean, std::exp(mean),
              scored / secs);
  nlohmann::json j = {{"file", src},       {"model", dir},           {"ctx", ctx},
                      {"windows", windows}, {"tokens", scored},      {"mean_nll", mean},
                      {"perplexity", std::exp(mean)}, {"tok_per_s", scored / secs}};
  if (kl.base) print_kl(kl.acc.summary(), j);
  if (kl.writer) std::printf("kl_base_written %s\n", o.kl_base.c_str());
  if (!o.json_out.empty()) std::ofstream(o.json_out) << j.dump(1) << "\n";
  return 0;
}

}  // namespace

void add_perplexity(CLI::App& app, Registry& reg) {
  auto o = std::make_shared<PerplexityOpts>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity (mean NLL) of a model over a text file; KL divergence against a base");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file (default: the built-in model)");
  cmd->add_option("-f,--file", o->file, "UTF-8 text file (with --kl-divergence: optional, checked against the base's tokens)");
  cmd->add_option("--ctx", o->ctx, "window length in tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "score at most this many windows (default: all)");
  cmd->add_option("--json", o->json_out, "also write the result as JSON to this path");
  cmd->add_option("--kl-divergence-base", o->kl_base,
                  "file of the base's log-probs: written by this run, or read with --kl-divergence");
  cmd->add_flag("--kl-divergence", o->kl_compare, "compare with the base file: PPL ratio, KLD mean/median/tails, same top-1, RMS dp");
  add_device_options(cmd, o->dev);
  cmd->callback([&reg, o] {
    reg.action = [o] { return run_perplexity(*o); };
  });
}

}  // namespace k3cli
