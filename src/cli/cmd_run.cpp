// `k3 run [-m DIR] -p "text" [-n N] [--temp T] [--seed S] ...`: stream a continuation to stdout.
#include <cstdio>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "k3/core/error.h"
#include "k3/engine/generator.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

void add_run(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, prompt;
    k3::engine::SamplingParams sp;
    std::optional<uint64_t> seed;
    bool special = false, no_bos = false, verbose = false;
    DeviceOptions dev;
  };
  auto o = std::make_shared<Opts>();
  o->sp.temperature = 0.8f;
  o->sp.max_tokens = 128;
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt, streamed to stdout");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory (default: the built-in model)");
  cmd->add_option("-p,--prompt", o->prompt, "prompt text")->required();
  cmd->add_option("-n,--max-tokens", o->sp.max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temp,--temperature", o->sp.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->sp.top_k, "top-k (0 = off)");
  cmd->add_option("--top-p", o->sp.top_p, "top-p (1 = off)");
  cmd->add_option("--min-p", o->sp.min_p, "min-p (0 = off)");
  cmd->add_option("--repeat-penalty", o->sp.repetition_penalty, "repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", o->sp.presence_penalty, "presence penalty");
  cmd->add_option("--frequency-penalty", o->sp.frequency_penalty, "frequency penalty");
  cmd->add_option("--seed", o->seed, "random seed (default: random)");
  cmd->add_option("--stop", o->sp.stop, "stop string (repeatable)");
  cmd->add_flag("--ignore-eos", o->sp.ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--special", o->special, "parse special-token text in the prompt (e.g. <|open|>)");
  cmd->add_flag("--no-bos", o->no_bos, "do not prepend the BOS token");
  cmd->add_flag("-v,--verbose", o->verbose, "print timing to stderr");
  add_device_options(cmd, o->dev);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      const std::string dir = resolve_model_dir(o->model);
      auto model = load_model(dir, o->dev);
      auto tok = k3::text::Tokenizer::load(dir);
      std::vector<int32_t> prompt;
      const int64_t bos = model->config().bos_token_id >= 0 ? model->config().bos_token_id : tok.bos_id();
      if (!o->no_bos && bos >= 0) prompt.push_back(static_cast<int32_t>(bos));
      auto ids = tok.encode(o->prompt, o->special);
      prompt.insert(prompt.end(), ids.begin(), ids.end());
      o->sp.seed = o->seed;
      k3::engine::GenerateOptions go;
      go.default_seed = std::random_device{}();
      std::fputs(o->prompt.c_str(), stdout);
      std::fflush(stdout);
      auto r = k3::engine::generate(*model, tok, prompt, o->sp, [](std::string_view s) {
        std::fwrite(s.data(), 1, s.size(), stdout);
        std::fflush(stdout);
      }, go);
      std::fputc('\n', stdout);
      if (o->verbose) {
        const double n = static_cast<double>(r.tokens.size());
        std::fprintf(stderr, "prompt %lld tokens in %.3f s (%.1f tok/s); generated %lld tokens in %.3f s (%.1f tok/s); finish: %s\n",
                     (long long)r.prompt_tokens, r.prefill_seconds, r.prompt_tokens / std::max(r.prefill_seconds, 1e-9),
                     (long long)r.tokens.size(), r.decode_seconds, n / std::max(r.decode_seconds, 1e-9), r.finish_reason.c_str());
      }
      return 0;
    };
  });
}

}  // namespace k3cli
