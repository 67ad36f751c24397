// `k3 run [-m DIR] -p "text" | -p - | -f FILE [-n N] [--temp T] [--seed S] ...`: stream a continuation to
// stdout (the prompt from the argument, from stdin, or from a file, as llama.cpp's -p / -f).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/expert_report.h"
#include "cli/model_loader.h"
#include "cli/speculative_option.h"
#include "k3/core/error.h"
#include "k3/io/regular_file.h"
#include "k3/cache/hybrid_cache.h"
#include "k3/engine/batch_engine.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

namespace {

// Prompts from a file or stdin are bounded like every other input (a pipe from /dev/zero must end).
constexpr size_t kMaxPromptBytes = size_t{64} << 20;

std::string read_stdin_prompt() {
  std::string s;
  char buf[1 << 16];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) {
    if (s.size() + n > kMaxPromptBytes)
      throw k3::Error("-p -: the prompt on stdin is larger than " + std::to_string(kMaxPromptBytes >> 20) + " MiB");
    s.append(buf, n);
  }
  if (std::ferror(stdin)) throw k3::Error("-p -: cannot read the prompt from stdin");
  return s;
}

// The prompt text: -p TEXT, -p - (stdin) or -f FILE; exactly one of -p / -f.
std::string prompt_text(const std::optional<std::string>& prompt, const std::string& file) {
  if (prompt && !file.empty()) throw k3::Error("give the prompt once: -p TEXT, -p - (stdin) or -f FILE");
  if (!file.empty()) return k3::read_regular_file(file, kMaxPromptBytes, "prompt file");
  if (!prompt) throw k3::Error("a prompt is required: -p TEXT, -p - (stdin) or -f FILE");
  return *prompt == "-" ? read_stdin_prompt() : *prompt;
}

}  // namespace

void add_run(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, file;
    std::optional<std::string> prompt;
    k3::engine::SamplingParams sp;
    std::optional<uint64_t> seed;
    bool special = false, no_bos = false, verbose = false;
    std::string speculative;  // --speculative-config JSON
    DeviceOptions dev;
  };
  auto o = std::make_shared<Opts>();
  o->sp.temperature = 0.8f;
  o->sp.max_tokens = 128;
  auto* cmd = app.add_subcommand("run", "Generate a continuation of a prompt, streamed to stdout");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file (default: the built-in model)");
  cmd->add_option("-p,--prompt", o->prompt, "prompt text ('-': read it from stdin)");
  cmd->add_option("-f,--file", o->file, "read the prompt from this file");
  cmd->add_option("-n,--max-tokens", o->sp.max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temp,--temperature", o->sp.temperature, "sampling temperature (0 = greedy)")->capture_default_str();
  cmd->add_option("--top-k", o->sp.top_k, "top-k (0 = off)");
  cmd->add_option("--top-p", o->sp.top_p, "top-p (1 = off)");
  cmd->add_option("--min-p", o->sp.min_p, "min-p (0 = off)");
  cmd->add_option("--repeat-penalty", o->sp.repetition_penalty, "repetition penalty (1 = off)");
  cmd->add_option("--presence-penalty", o->sp.presence_penalty, "presence penalty");
  cmd->add_option("--frequency-penalty", o->sp.frequency_penalty, "frequency penalty");
  cmd->add_option("--seed", o->seed, "random seed (default: random)");
  // One string per flag: without this CLI11 reads "[END]" as its list syntax and stops at "END".
  cmd->add_option("--stop", o->sp.stop, "stop string (repeatable)")->expected(1)->allow_extra_args(false);
  cmd->add_flag("--ignore-eos", o->sp.ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--special", o->special, "parse special-token text in the prompt (e.g. <|open|>)");
  cmd->add_flag("--no-bos", o->no_bos, "do not prepend the BOS token");
  cmd->add_flag("-v,--verbose", o->verbose, "print timing to stderr");
  add_device_options(cmd, o->dev);
  add_speculative_option(cmd, o->speculative);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      // Before the model loads: bad input fails fast.
      const auto spec_cfg = k3::engine::parse_speculative_config(o->speculative);
      const std::string text = prompt_text(o->prompt, o->file);
      const std::string dir = resolve_model_dir(o->model);
      const k3::DiskCounters disk_start = k3::read_disk_counters();
      auto model = load_model(dir, o->dev);
      auto tok = load_tokenizer(dir, o->dev);
      const auto& cfg = model->config();
      check_tokenizer_fits(tok.n_vocab(), cfg.vocab_size);
      std::vector<int32_t> prompt;
      const int64_t bos = cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id();
      if (!o->no_bos && bos >= 0) prompt.push_back(static_cast<int32_t>(bos));
      auto ids = tok.encode(text, o->special);
      prompt.insert(prompt.end(), ids.begin(), ids.end());
      // Unset seed: a random one, so that two runs differ (as before); --seed makes a run repeatable.
      o->sp.seed = o->seed ? *o->seed : static_cast<uint64_t>(std::random_device{}());
      o->sp.validate();

      // One request through the serving engine (same sampler, stop handling and detokeniser as
      // `k3 serve`), with a cache sized for exactly this prompt + completion.
      k3::engine::BatchEngineOptions eo;
      const int64_t len = static_cast<int64_t>(prompt.size()) + std::max(o->sp.max_tokens, 0) + 1;
      eo.cache.page_tokens = 16;
      eo.cache.prefix_caching = false;
      eo.cache.budget_bytes = k3::cache::HybridCache::budget_for(model->cache_spec(), eo.cache.page_tokens, 1, len,
                                                                 spec_cfg ? spec_cfg->state_slots() : 0);
      eo.sched.max_num_seqs = 1;
      eo.sched.max_num_batched_tokens = 512;  // prompt chunks per step (bounds activation memory)
      eo.max_model_len = len;
      eo.speculative = spec_cfg;
      const auto draft = load_draft_model(spec_cfg, o->dev);
      eo.draft_model = draft.get();
      const auto drafter = load_block_drafter(spec_cfg, dir, o->dev, *model);
      eo.block_drafter = drafter.get();
      k3::engine::BatchEngine engine(*model, tok, eo);

      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
      std::mutex mu;
      std::condition_variable cv;
      bool done = false;
      k3::engine::RequestOutput last;
      int64_t generated = 0;
      const auto t0 = std::chrono::steady_clock::now();
      std::chrono::steady_clock::time_point t_first = t0;
      k3::engine::Request req;
      req.id = "run";
      req.prompt = prompt;
      req.params = o->sp;
      req.skip_special_text = false;  // special tokens are printed as their text
      engine.submit(std::move(req), [&](const k3::engine::RequestOutput& out) {
        if (generated == 0 && !out.new_token_ids.empty()) t_first = std::chrono::steady_clock::now();
        generated = out.completion_tokens;
        for (const auto& p : out.pieces) std::fwrite(p.text.data(), 1, p.text.size(), stdout);
        std::fflush(stdout);
        if (out.finished) {
          std::lock_guard lk(mu);
          last = out;
          done = true;
          cv.notify_all();
        }
      });
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return done; });
      }
      const auto t_end = std::chrono::steady_clock::now();
      engine.shutdown(false);
      std::fputc('\n', stdout);
      if (last.finish_reason == "error") throw k3::Error(last.error);
      if (o->verbose) {
        const double pre = std::chrono::duration<double>(t_first - t0).count();
        const double dec = std::chrono::duration<double>(t_end - t_first).count();
        const double n = static_cast<double>(generated);
        std::fprintf(stderr, "prompt %lld tokens in %.3f s (%.1f tok/s, incl. the first token); generated %lld tokens, "
                     "%lld after the first in %.3f s (%.1f tok/s); finish: %s; device %s\n",
                     (long long)prompt.size(), pre, prompt.size() / std::max(pre, 1e-9), (long long)generated,
                     (long long)std::max<int64_t>(generated - 1, 0), dec, std::max(n - 1, 0.0) / std::max(dec, 1e-9),
                     last.finish_reason.c_str(), model->device_name().c_str());
        const auto st = engine.stats();
        if (st.num_speculative_tokens > 0)
          std::fprintf(stderr, "speculative decoding %s: %s\n", k3::engine::describe(*spec_cfg).c_str(),
                       spec_decode_summary(st).c_str());
        std::fprintf(stderr, "%s", expert_cache_report(model->expert_cache_stats(), disk_start, 0).c_str());
      }
      return 0;
    };
  });
}

}  // namespace k3cli
