#include "cli/bench_speculative.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include "cli/speculative_option.h"
#include "k3/cache/hybrid_cache.h"
#include "k3/engine/batch_engine.h"
#include "k3/text/chat_format.h"

namespace k3cli {

namespace {

// Where prompt lookup hits: code that repeats its own structure, and a summary that quotes its source.
const char* kCodePrompt =
    "class Vector:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
    "    def __add__(self, other):\n        return Vector(self.x + other.x, self.y + other.y)\n\n"
    "    def __sub__(self, other):\n        return Vector(self.x - other.x, self.y - other.y)\n\n"
    "    def __mul__(self, other):\n        return Vector(self.x * other.x, self.y * other.y)\n\n"
    "    def __truediv__(self, other):\n        return Vector(self.x / other.x, self.y / other.y)\n\n"
    "    def __mod__(self, other):\n        return Vector(";
const char* kSummaryPrompt =
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of "
    "a wife. However little known the feelings or views of such a man may be on his first entering a neighbourhood, "
    "this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful "
    "property of some one or other of their daughters.\n\nSummary, quoting the passage: It is a truth universally "
    "acknowledged, that";

// A chat turn (not from ShareGPT / MT-Bench, which the k3-tiny drafter's training prompts draw on), rendered
// with the model's chat format: what a chat client sends.
const char* kChatQuestion =
    "Explain how a refrigerator keeps food cold, step by step, for a curious ten-year-old. Then list three "
    "things that make it use more electricity.";

struct Task {
  const char* name;
  std::vector<int32_t> prompt;
};

// code and summary: BOS + the text; chat: the question through the model's chat template (skipped, with a
// line on stderr, when the tokenizer lacks the format's markers, e.g. a dummy model's).
std::vector<Task> bench_tasks(const k3::ModelRunner& model, const k3::text::Tokenizer& tok) {
  std::vector<Task> tasks;
  const int64_t bos = model.config().bos_token_id >= 0 ? model.config().bos_token_id : tok.bos_id();
  for (const auto& [name, text] : {std::pair{"code", kCodePrompt}, std::pair{"summary", kSummaryPrompt}}) {
    Task t{name, {}};
    if (bos >= 0) t.prompt.push_back(static_cast<int32_t>(bos));
    const auto ids = tok.encode(text);
    t.prompt.insert(t.prompt.end(), ids.begin(), ids.end());
    tasks.push_back(std::move(t));
  }
  try {
    const auto fmt = k3::text::ChatFormat::for_model_type(model.config().model_type, tok);
    const auto req = k3::text::ChatRequest::from_json(
        nlohmann::json{{"messages", nlohmann::json::array({{{"role", "user"}, {"content", kChatQuestion}}})}});
    tasks.push_back({"chat", fmt.render(req, tok, /*add_generation_prompt=*/true)});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench: no chat task (%s)\n", e.what());
  }
  return tasks;
}

struct Timed {
  double seconds = 0;  // submission to the last request's end
  k3::engine::EngineStats stats;
};

// One batch of `batch` copies of the prompt, greedy, n_gen tokens each, timed from submission to the end;
// speculation as `on` says (null: off).
Timed run_once(const k3::ModelRunner& model, const k3::text::Tokenizer& tok, const std::vector<int32_t>& prompt,
               int64_t batch, int64_t n_gen, const SpecBenchOptions* on) {
  const std::optional<k3::engine::SpeculativeConfig> spec = on ? std::optional(on->spec) : std::nullopt;
  k3::engine::BatchEngineOptions eo;
  const int64_t len = static_cast<int64_t>(prompt.size()) + n_gen + 1;
  eo.cache.prefix_caching = false;
  eo.cache.budget_bytes = k3::cache::HybridCache::budget_for(model.cache_spec(), 16, batch, len, spec ? spec->state_slots() : 0);
  eo.sched.max_num_seqs = batch;
  eo.sched.max_num_batched_tokens = std::max<int64_t>(512, batch * 40);
  eo.max_model_len = len;
  eo.speculative = spec;
  eo.draft_model = on ? on->draft : nullptr;
  eo.block_drafter = on ? on->block_drafter : nullptr;
  k3::engine::BatchEngine engine(model, tok, eo);
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < batch; ++i) {
    k3::engine::Request r;
    r.id = std::to_string(i);
    r.prompt = prompt;
    r.params.temperature = 0.0f;
    r.params.max_tokens = n_gen;
    r.params.ignore_eos = true;
    engine.submit(std::move(r), [&](const k3::engine::RequestOutput& out) {
      if (!out.finished) return;
      std::lock_guard lk(mu);
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock lk(mu);
  cv.wait(lk, [&] { return done == batch; });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lk.unlock();
  engine.shutdown(true);  // the counters of the last step are final once the engine thread is done
  return {seconds, engine.stats()};
}

// Decode tok/s of one configuration: the tokens after each request's first, over the shortest run's
// time minus the shortest time of the same batch asked for one token (the prefill and the first token);
// the shortest of each is kept separately, since on a shared machine either may be hit by a neighbour.
struct Best {
  double first = 1e30, all = 1e30;
  k3::engine::EngineStats stats;
  void add(const k3::ModelRunner& model, const k3::text::Tokenizer& tok, const std::vector<int32_t>& prompt, int64_t batch,
           int64_t n_gen, const SpecBenchOptions* on) {
    first = std::min(first, run_once(model, tok, prompt, batch, 1, on).seconds);
    const Timed t = run_once(model, tok, prompt, batch, n_gen, on);
    all = std::min(all, t.seconds);
    stats = t.stats;  // greedy: the same acceptance every repetition
  }
  double tps(int64_t batch, int64_t n_gen) const { return static_cast<double>(batch * (n_gen - 1)) / std::max(all - first, 1e-9); }
};

}  // namespace

nlohmann::json run_spec_bench(const k3::ModelRunner& model, const k3::text::Tokenizer& tok, const SpecBenchOptions& o) {
  nlohmann::json rows = nlohmann::json::array();
  std::printf("| task | batch | decode tok/s off | decode tok/s on | speed-up | drafts | accepted / draft tokens | mean acceptance length |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [task, prompt] : bench_tasks(model, tok)) {
    for (int64_t b : o.batches) {
      Best off, on;
      for (int r = 0; r < o.reps; ++r) {  // alternating: a busy neighbour slows both alike
        off.add(model, tok, prompt, b, o.n_gen, nullptr);
        on.add(model, tok, prompt, b, o.n_gen, &o);
      }
      const double best_off = off.tps(b, o.n_gen), best_on = on.tps(b, o.n_gen);
      const k3::engine::EngineStats& st = on.stats;
      const double acc_rate = st.spec_num_draft_tokens > 0 ? double(st.spec_num_accepted_tokens) / double(st.spec_num_draft_tokens) : 0;
      const double mean_len = st.spec_num_drafts > 0 ? 1.0 + double(st.spec_num_accepted_tokens) / double(st.spec_num_drafts) : 0;
      std::printf("| %s | %lld | %.1f | %.1f | %.2fx | %lld | %lld / %lld (%.1f%%) | %.2f |\n", task, (long long)b, best_off, best_on,
                  best_on / std::max(best_off, 1e-9), (long long)st.spec_num_drafts, (long long)st.spec_num_accepted_tokens,
                  (long long)st.spec_num_draft_tokens, 100 * acc_rate, mean_len);
      std::fflush(stdout);
      rows.push_back({{"task", task}, {"batch", b}, {"n_gen", o.n_gen}, {"prompt_tokens", prompt.size()},
                      {"decode_tps_off", best_off}, {"decode_tps_on", best_on}, {"speedup", best_on / std::max(best_off, 1e-9)},
                      {"num_drafts", st.spec_num_drafts}, {"num_draft_tokens", st.spec_num_draft_tokens},
                      {"num_accepted_tokens", st.spec_num_accepted_tokens}, {"acceptance_rate", acc_rate},
                      {"mean_acceptance_length", mean_len}, {"accepted_per_pos", st.spec_accepted_per_pos}});
    }
  }
  return rows;
}

}  // namespace k3cli
