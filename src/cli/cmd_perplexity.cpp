// `k3 perplexity [-m DIR] -f FILE [--ctx N] [--chunks K]`: perplexity of a model on a text file.
// Rule (shared with python/k3tiny/evaluate.py, docs/perplexity.md): the whole file is tokenised with
// encode_ordinary and cut into consecutive, non-overlapping windows of N tokens (the last may be
// shorter); each window is run from an empty state as [BOS] + window, and every window token is
// scored given BOS and the window tokens before it. PPL = exp(total NLL / scored tokens).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "k3/core/error.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

void add_perplexity(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, file, json_out;
    DeviceOptions dev;
    int64_t ctx = 512, chunks = -1;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("perplexity", "Perplexity (mean NLL) of a model over a text file");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file (default: the built-in model)");
  cmd->add_option("-f,--file", o->file, "UTF-8 text file")->required();
  cmd->add_option("--ctx", o->ctx, "window length in tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "score at most this many windows (default: all)");
  cmd->add_option("--json", o->json_out, "also write the result as JSON to this path");
  add_device_options(cmd, o->dev);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      const std::string dir = resolve_model_dir(o->model);
      auto model = load_model(dir, o->dev);
      auto tok = load_tokenizer(dir, o->dev);
      check_tokenizer_fits(tok.n_vocab(), model->config().vocab_size);
      std::ifstream f(o->file, std::ios::binary);
      if (!f) throw k3::Error("cannot read '" + o->file + "'");
      std::stringstream ss;
      ss << f.rdbuf();
      const auto ids = tok.encode(ss.str(), false);
      const int64_t bos = model->config().bos_token_id >= 0 ? model->config().bos_token_id : tok.bos_id();
      if (bos < 0) throw k3::Error("the model has no BOS token id; perplexity windows start with BOS");
      const int64_t V = model->config().vocab_size, N = static_cast<int64_t>(ids.size());
      int64_t windows = (N + o->ctx - 1) / o->ctx;
      if (o->chunks >= 0) windows = std::min(windows, o->chunks);
      std::fprintf(stderr, "perplexity: %lld tokens, %lld windows of %lld\n", (long long)N, (long long)windows, (long long)o->ctx);
      double nll = 0;
      int64_t scored = 0;
      std::vector<float> logits;
      std::vector<int32_t> win;
      k3::ForwardOptions fo;
      fo.all_logits = true;
      auto t0 = std::chrono::steady_clock::now();
      for (int64_t w = 0; w < windows; ++w) {
        const int64_t b = w * o->ctx, e = std::min(N, b + o->ctx);
        win.assign(1, static_cast<int32_t>(bos));
        win.insert(win.end(), ids.begin() + b, ids.begin() + e);
        auto st = model->new_cache();
        model->forward(win, *st, logits, fo);
        for (int64_t i = 0; i + 1 < static_cast<int64_t>(win.size()); ++i) {
          const float* l = logits.data() + i * V;
          float mx = l[0];
          for (int64_t v = 1; v < V; ++v) mx = std::max(mx, l[v]);
          double se = 0;
          for (int64_t v = 0; v < V; ++v) se += std::exp(static_cast<double>(l[v] - mx));
          nll += std::log(se) + mx - l[win[static_cast<size_t>(i + 1)]];
          ++scored;
        }
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "\r[%lld/%lld] ppl %.4f  %.0f tok/s", (long long)(w + 1), (long long)windows,
                     std::exp(nll / std::max<int64_t>(scored, 1)), scored / std::max(secs, 1e-9));
      }
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\n");
      if (scored == 0) throw k3::Error("'" + o->file + "' holds no tokens to score");
      const double mean = nll / static_cast<double>(scored);
      std::printf("file %s\nmodel %s\nwindows %lld x ctx %lld\ntokens %lld\nmean_nll %.6f\nperplexity %.4f\ntok_per_s %.1f\n",
                  o->file.c_str(), dir.c_str(), (long long)windows, (long long)o->ctx, (long long)scored, mean,
                  std::exp(mean), scored / secs);
      if (!o->json_out.empty()) {
        nlohmann::json j = {{"file", o->file}, {"model", dir}, {"ctx", o->ctx}, {"windows", windows},
                            {"tokens", scored}, {"mean_nll", mean}, {"perplexity", std::exp(mean)}, {"tok_per_s", scored / secs}};
        std::ofstream(o->json_out) << j.dump(1) << "\n";
      }
      return 0;
    };
  });
}

}  // namespace k3cli
