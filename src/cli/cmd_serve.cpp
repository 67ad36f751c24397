// `k3 serve [-m DIR] [--host H] [--port P] ...`: the OpenAI-compatible HTTP server (docs/serving.md).
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/model_loader.h"
#include "cli/speculative_option.h"
#include "k3/core/error.h"
#include "k3/dist/tp_model.h"
#include "k3/engine/batch_engine.h"
#include "k3/engine/data_parallel_engine.h"
#include "k3/engine/speculative_config.h"
#include "k3/model/model.h"
#include "k3/grammar/grammar_engine.h"
#include "k3/serve/model_chat_adapter.h"
#include "k3/serve/server.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

namespace {
struct Opts {
  std::string model, served_name;
  std::vector<std::string> origins;  // --allowed-origins as given (JSON lists or single origins)
  DeviceOptions dev;
  k3::serve::ServerOptions so;
  int64_t max_num_seqs = 64, max_model_len = 0, max_batched = 2048, page_size = 16, ckpt_interval = 0;
  std::string cache_memory = "1GiB";
  std::string speculative;  // --speculative-config JSON
  bool no_prefix = false, prompt_tokens_details = false, allow_unknown_fields = false;
  int64_t max_response_bytes = int64_t{64} << 20;
  int data_parallel = 1;  // --data-parallel-size: model replicas, one engine each
};

// Every numeric flag of `k3 serve`, range-checked (issue 11: --max-num-seqs 0, --timeout 0|nan were accepted).
void validate_serve_flags(const Opts& o) {
  k3::engine::parse_speculative_config(o.speculative);  // throws on bad JSON / method / range
  auto in = [](int64_t v, int64_t lo, int64_t hi, const char* flag) {
    if (v < lo || v > hi)
      throw k3::Error(std::string(flag) + ": expected " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " +
                      std::to_string(v));
  };
  in(o.max_num_seqs, 1, 1 << 16, "--max-num-seqs");
  in(o.max_model_len, 0, int64_t{1} << 31, "--max-model-len");
  if (o.max_model_len == 1) throw k3::Error("--max-model-len: expected 0 (the model's limit) or at least 2, got 1");
  in(o.max_response_bytes, 0, int64_t{1} << 40, "--max-response-bytes");
  in(o.max_batched, 1, 1 << 20, "--max-num-batched-tokens");
  // Every running sequence decodes one token per step: a smaller step budget would leave the newest
  // decodes waiting behind the older ones (vLLM refuses this configuration too).
  if (o.max_batched < o.max_num_seqs)
    throw k3::Error("--max-num-batched-tokens: " + std::to_string(o.max_batched) + " is below --max-num-seqs (" +
                    std::to_string(o.max_num_seqs) + "); each running sequence needs a token per step");
  in(o.data_parallel, 1, 64, "--data-parallel-size");
  if (o.data_parallel > 1 && (o.dev.tensor_parallel_size > 1 || o.dev.nnodes > 1))
    throw k3::Error("--data-parallel-size with tensor parallel is not supported yet: each replica is one whole model "
                    "on one device (for TP replicas, run one `k3 serve --tensor-parallel-size N` per replica behind "
                    "a load balancer)");
  in(o.page_size, 1, 1024, "--page-size");
  in(o.ckpt_interval, 0, int64_t{1} << 31, "--checkpoint-interval");
  for (const auto& k : o.so.api_keys)  // $K3_API_KEY is read later, and an empty one skipped
    if (k.empty()) throw k3::Error("--api-key must not be empty");
  k3::serve::validate(o.so);
}

// --allowed-origins values: vLLM's JSON list ('["https://a.example", "*"]') or one origin per flag.
std::vector<std::string> parse_origins(const std::vector<std::string>& given) {
  std::vector<std::string> out;
  for (const std::string& g : given) {
    if (g.empty() || g[0] != '[') {
      out.push_back(g);
      continue;
    }
    const auto j = nlohmann::json::parse(g, nullptr, /*allow_exceptions=*/false);
    if (!j.is_array()) throw k3::Error("--allowed-origins: '" + g + "' is not a JSON list of strings");
    for (const auto& v : j) {
      if (!v.is_string()) throw k3::Error("--allowed-origins: '" + g + "' is not a JSON list of strings");
      out.push_back(v.get<std::string>());
    }
  }
  return out;
}
// A model that can never run another step (a sharded model that lost a rank: docs/multi-gpu.md) ends
// the server: its in-flight requests have failed already (the engine's error outputs); this stops the
// server as SIGTERM does, and `k3 serve` then exits with status 1. Polls every 100 ms.
// Why `m` can never run another step ("" while it can): a sharded model that lost a rank.
std::string model_failure(const k3::ModelRunner& m) {
  const auto* tp = dynamic_cast<const k3::dist::TpModel*>(&m);
  return tp ? tp->failure() : std::string();
}

// The same over the server's replicas (--data-parallel-size): the first one's that failed.
std::string model_failure(const std::vector<const k3::ModelRunner*>& models) {
  for (size_t i = 0; i < models.size(); ++i)
    if (std::string f = model_failure(*models[i]); !f.empty())
      return models.size() == 1 ? f : "replica " + std::to_string(i) + ": " + f;
  return {};
}

class ModelFailureWatch {
 public:
  explicit ModelFailureWatch(std::vector<const k3::ModelRunner*> models)
      : thread_([this, models = std::move(models)] {
          std::unique_lock lk(mu_);
          while (!done_) {
            if (const std::string f = model_failure(models); !f.empty()) {
              std::fprintf(stderr, "k3 serve: the model failed (%s): stopping\n", f.c_str());
              std::fflush(stderr);
              ::kill(::getpid(), SIGTERM);
              return;
            }
            cv_.wait_for(lk, std::chrono::milliseconds(100));
          }
        }) {}
  ~ModelFailureWatch() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};
// What the API layer needs of the model and the flags (openai_api.h).
k3::serve::ApiContext api_context(const Opts& o, const std::string& dir, const k3::text::Tokenizer& tok, const k3::ModelConfig& cfg,
                                  const k3::serve::ChatAdapter& chat, int32_t bos, int64_t max_model_len,
                                  const k3::grammar::GrammarEngine* grammar) {
  k3::serve::ApiContext ctx;
  ctx.model_name = !o.served_name.empty() ? o.served_name : std::filesystem::path(dir).lexically_normal().filename().string();
  if (ctx.model_name.empty()) ctx.model_name = std::filesystem::path(dir).lexically_normal().parent_path().filename().string();
  ctx.model_root = std::filesystem::absolute(dir).lexically_normal().string();
  ctx.tok = &tok;
  ctx.chat = &chat;
  ctx.bos = bos;
  ctx.max_model_len = max_model_len;
  ctx.vocab_size = cfg.vocab_size;
  ctx.max_response_bytes = o.max_response_bytes;
  ctx.prompt_tokens_details = o.prompt_tokens_details;
  ctx.allow_unknown_fields = o.allow_unknown_fields;
  ctx.grammar = grammar;
  if (cfg.eos_token_id >= 0) ctx.eos_ids.push_back(static_cast<int32_t>(cfg.eos_token_id));
  if (tok.eos_id() >= 0 && tok.eos_id() != cfg.eos_token_id) ctx.eos_ids.push_back(tok.eos_id());
  return ctx;
}

// One model replica of the server (--data-parallel-size; one without it): its device, model, speculative
// helpers and engine options. Declared before the engine that runs on it, so that it outlives the engine.
struct Replica {
  DeviceOptions dev;
  std::unique_ptr<k3::ModelRunner> model, draft;
  std::unique_ptr<k3::drafter::BlockDrafter> drafter;
  k3::engine::BatchEngineOptions eo;
  const k3::engine::BatchEngine* engine = nullptr;  // owned by the server's engine (start_engines)
};

// Every replica's model, each on its device (replica_device_options; one replica: --device as given).
std::vector<Replica> load_replicas(const Opts& o, const std::string& dir) {
  std::vector<Replica> reps(static_cast<size_t>(o.data_parallel));
  for (size_t i = 0; i < reps.size(); ++i) {
    reps[i].dev = reps.size() == 1 ? o.dev : replica_device_options(o.dev, static_cast<int>(i));
    reps[i].model = load_model(dir, reps[i].dev);
    reps[i].dev.apply_compute = false;  // the global thread pool is sized once: the draft loads leave it
  }
  return reps;
}

k3::engine::BatchEngineOptions engine_options(const Opts& o, int64_t cache_budget) {
  k3::engine::BatchEngineOptions eo;
  eo.cache.budget_bytes = cache_budget;
  eo.cache.page_tokens = o.page_size;
  eo.cache.prefix_caching = !o.no_prefix;
  eo.sched.max_num_seqs = o.max_num_seqs;
  eo.sched.max_num_batched_tokens = o.max_batched;
  eo.sched.checkpoint_interval = o.ckpt_interval;
  eo.max_model_len = o.max_model_len;
  eo.speculative = k3::engine::parse_speculative_config(o.speculative);
  return eo;
}

// Each replica's engine options, its cache budget from --cache-memory: a size is per replica; a fraction
// is of what the replica's device has free once every replica is loaded and warmed up (the RAM on the
// CPU), divided between the replicas on that device, so that together they take that fraction.
void size_caches(const Opts& o, std::vector<Replica>& reps) {
  for (auto& r : reps) r.model->warm_up(o.max_batched);  // before the caches take their share of the free memory
  for (auto& r : reps) {
    const auto on_device =
        std::count_if(reps.begin(), reps.end(), [&r](const Replica& x) { return x.dev.device == r.dev.device; });
    int64_t budget = parse_memory(o.cache_memory, r.model->memory_available());
    if (memory_is_fraction(o.cache_memory)) budget /= on_device;
    r.eo = engine_options(o, budget);
  }
}

// Each replica's speculative proposer (its draft model or drafter, on its device) and engine; several
// engines behind one DataParallelEngine. The replicas must outlive the engine returned.
std::unique_ptr<k3::engine::Engine> start_engines(const std::string& dir, const k3::text::Tokenizer& tok,
                                                  std::vector<Replica>& reps) {
  std::vector<std::unique_ptr<k3::engine::Engine>> engines;
  for (auto& r : reps) {
    r.draft = load_draft_model(r.eo.speculative, r.dev);
    r.eo.draft_model = r.draft.get();
    r.drafter = load_block_drafter(r.eo.speculative, dir, r.dev, *r.model);
    r.eo.block_drafter = r.drafter.get();
    auto e = std::make_unique<k3::engine::BatchEngine>(*r.model, tok, r.eo);
    r.engine = e.get();
    engines.push_back(std::move(e));
  }
  if (engines.size() == 1) return std::move(engines[0]);
  return std::make_unique<k3::engine::DataParallelEngine>(std::move(engines));
}

// "max_num_seqs 64, cache 1.07 GB: 65536 pages x 16 tokens + 130 state slots" of one replica.
std::string cache_summary(const Opts& o, const Replica& r) {
  const k3::cache::CacheStats cs = r.engine->cache_stats();
  char buf[256];
  std::snprintf(buf, sizeof buf, "max_num_seqs %lld, cache %s: %lld pages x %lld tokens + %lld state slots",
                (long long)o.max_num_seqs, human_bytes((double)r.eo.cache.budget_bytes).c_str(), (long long)cs.pages_total,
                (long long)o.page_size, (long long)cs.slots_total);
  return buf;
}

// The engines' part of the start-up line: the one replica's cache, or the data parallel group's.
std::string engines_summary(const Opts& o, const std::vector<Replica>& reps) {
  if (reps.size() == 1) return cache_summary(o, reps[0]);
  std::string devices, caches = cache_summary(o, reps[0]);
  bool same = true;
  for (size_t i = 0; i < reps.size(); ++i) {
    devices += (i ? ", " : "") + reps[i].dev.device;
    same = same && cache_summary(o, reps[i]) == caches;
  }
  if (!same) {
    caches.clear();
    for (size_t i = 0; i < reps.size(); ++i)
      caches += (i ? "; replica " : "replica ") + std::to_string(i) + ": " + cache_summary(o, reps[i]);
  }
  return "data parallel " + std::to_string(reps.size()) + " replicas (devices " + devices + "), per replica " + caches;
}

// Why max_model_len is what it is: the reason of the replica that holds the least.
std::string max_model_len_reason(const std::vector<Replica>& reps) {
  const Replica* least = &reps[0];
  for (const auto& r : reps)
    if (r.engine->limits().max_model_len < least->engine->limits().max_model_len) least = &r;
  return least->engine->max_model_len_reason();
}
}  // namespace

void add_serve(CLI::App& app, Registry& reg) {
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, ...)");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file (default: the built-in model)");
  add_device_options(cmd, o->dev);
  cmd->add_option("--host", o->so.host, "address to bind")->capture_default_str();
  cmd->add_option("--port", o->so.port, "TCP port (0 = any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->so.api_keys,
                  "require \"Authorization: Bearer KEY\" on /v1/*; may be given several times, each key its own "
                  "prefix-cache partition (default: $K3_API_KEY)")
      ->expected(1)
      ->allow_extra_args(false)  // a key "[abc]" is that key, not CLI11's list syntax
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--allowed-origins", o->origins,
                  "CORS: origins whose web pages may call the API, as vLLM's JSON list ('[\"*\"]') or one per flag "
                  "(default: none, no CORS headers)")
      ->expected(1)
      ->allow_extra_args(false)  // else CLI11 splits a "[...]" value itself, quotes and all
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--served-model-name", o->served_name, "model name of the API (default: the model directory's name)");
  cmd->add_option("--max-num-seqs", o->max_num_seqs, "sequences the engine runs at once (per replica with --data-parallel-size)")
      ->capture_default_str();
  cmd->add_option("--max-waiting", o->so.max_waiting, "requests that may wait beyond --max-num-seqs; more get 429")
      ->capture_default_str();
  cmd->add_option("--max-model-len", o->max_model_len,
                  "prompt + completion tokens per sequence (default: the model's max_position_embeddings, capped by "
                  "what the cache holds for one sequence)");
  cmd->add_option("--max-response-bytes", o->max_response_bytes,
                  "bound on what one non-streamed response may hold (n x max_tokens x per-token cost with logprobs); "
                  "an explicit max_tokens beyond it -> 400, the default max_tokens is lowered to fit; 0: no bound")
      ->capture_default_str();
  cmd->add_flag("--enable-prompt-tokens-details", o->prompt_tokens_details,
                "report usage.prompt_tokens_details.cached_tokens (off by default, as in vLLM: it tells a client "
                "whether another sent the same prompt prefix)");
  cmd->add_flag("--allow-unknown-fields", o->allow_unknown_fields,
                "ignore request fields this server does not know, with a warning (default: 400 naming the field, "
                "as OpenAI answers)");
  cmd->add_option("--max-num-batched-tokens", o->max_batched, "tokens per engine step (decodes + prefill chunks)")
      ->capture_default_str();
  cmd->add_option("--cache-memory", o->cache_memory,
                  "memory for the MLA latent pages + KDA state slots: bytes (e.g. 2GiB, 512MB) or a fraction of what is "
                  "free for it (e.g. 0.25: of RAM on the CPU, of the GPU memory left after the weights with --device cuda); "
                  "with --data-parallel-size, bytes are per replica and a fraction is split between the replicas on "
                  "one device")
      ->capture_default_str();
  cmd->add_option("--data-parallel-size", o->data_parallel,
                  "model replicas in this server, one engine each (-dp; vLLM's flag): a request runs on the replica "
                  "with the fewest in flight, ties going to the one its prompt prefix hashes to (prefix-cache hits). "
                  "--device cuda[:N]: replica i on GPU (N + i) mod the visible GPUs; --device cpu: all share the CPU "
                  "threads, which rarely pays (one engine already batches). --max-num-seqs is per replica. Not with "
                  "--tensor-parallel-size (docs/serving.md)")
      ->capture_default_str();
  cmd->add_option("--page-size", o->page_size, "tokens per latent-cache page")->capture_default_str();
  cmd->add_option("--checkpoint-interval", o->ckpt_interval, "tokens between KDA state checkpoints inside prompts (prefix cache); 0: auto, a checkpoint "
                  "costs about what the latent pages it spans cost (64 for small models, ~7.9k for Kimi K3)")
      ->capture_default_str();
  cmd->add_flag("--no-enable-prefix-caching,--no-prefix-caching", o->no_prefix, "turn prefix caching off (on by default)");
  cmd->add_option("--max-body-bytes", o->so.max_body_bytes, "largest request body (413 beyond)")->capture_default_str();
  cmd->add_option("--max-inflight-body-bytes", o->so.max_inflight_body_bytes,
                  "request-body bytes all connections together may be receiving; beyond: 503 + Retry-After (0: the larger "
                  "of 128 MiB and 2 x --max-body-bytes)")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->so.max_connections,
                  "open client connections (beyond: the oldest idle one is closed, else 503); 0: the descriptor "
                  "limit (ulimit -n) - 64")
      ->capture_default_str();
  // llama-server's name: -t/--threads are the compute threads (add_device_options), as in every verb.
  cmd->add_option("--threads-http", o->so.threads, "HTTP I/O threads")->capture_default_str();
  cmd->add_option("--timeout", o->so.read_timeout_s, "seconds to receive a request (and keep-alive idle time)")
      ->capture_default_str();
  cmd->add_option("--write-timeout", o->so.write_timeout_s,
                  "seconds one write to a client may take (a client that stops reading is disconnected)")
      ->capture_default_str();
  cmd->add_option("--shutdown-grace", o->so.shutdown_grace_s, "seconds in-flight requests may finish after SIGTERM")
      ->capture_default_str();
  cmd->add_flag("--log-requests", o->so.log_requests, "log one line per request to stderr");
  cmd->add_flag("!--no-webui", o->so.webui, "do not serve the web chat at / (llama-server's flag)");
  add_speculative_option(cmd, o->speculative);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      o->so.allowed_origins = parse_origins(o->origins);
      validate_serve_flags(*o);  // before the model loads: a bad flag fails at once
      // Few malloc arenas: with one per thread (glibc's default), freed request memory stays spread over
      // per-thread arenas and RSS crept up by ~15 MiB per load-test round (+6.6 MiB with two arenas, 0 with one)
      // (docs/perf/serve-loadtest.md).
      ::mallopt(M_ARENA_MAX, 1);
      // A fixed mmap threshold: a forward's large activation buffers (MBs for a 2048-token step) are
      // mmapped and returned when freed. glibc's dynamic threshold would move them onto the heap after the
      // first free, where the largest step's high-water stays resident (+14-18 MiB in the quick load test
      // once prompts were prefilled in longer chunks).
      ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
      const auto t0 = std::chrono::steady_clock::now();
      const std::string dir = resolve_model_dir(o->model);
      std::vector<Replica> reps = load_replicas(*o, dir);
      auto tok = load_tokenizer(dir, o->dev);
      const auto& cfg = reps[0].model->config();
      if (tok.n_vocab() > cfg.vocab_size)
        throw k3::Error("the tokenizer has " + std::to_string(tok.n_vocab()) + " ids but the model's vocab_size is " +
                        std::to_string(cfg.vocab_size));
      const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      size_caches(*o, reps);
      const std::unique_ptr<k3::engine::Engine> engine = start_engines(dir, tok, reps);
      const int64_t max_model_len = engine->limits().max_model_len;

      const int32_t bos = static_cast<int32_t>(cfg.bos_token_id >= 0 ? cfg.bos_token_id : tok.bos_id());
      k3::serve::ModelChatAdapterOptions co;
      co.bos = bos;  // k3-tiny was trained on [BOS] + XTML documents
      if (cfg.eos_token_id >= 0) co.extra_stop.push_back(static_cast<int32_t>(cfg.eos_token_id));
      auto chat = k3::serve::make_model_chat_adapter(cfg.model_type, tok, co);
      // Structured outputs: the grammar engine over the model's vocabulary (K3_GRAMMAR builds).
      std::unique_ptr<k3::grammar::GrammarEngine> grammar;
      if (k3::grammar::GrammarEngine::available())
        grammar = std::make_unique<k3::grammar::GrammarEngine>(tok, cfg.vocab_size);
      const k3::serve::ApiContext ctx = api_context(*o, dir, tok, cfg, *chat, bos, max_model_len, grammar.get());
      if (o->so.api_keys.empty())
        if (const char* k = std::getenv("K3_API_KEY"); k && *k) o->so.api_keys.push_back(k);

      k3::serve::Metrics metrics(ctx.model_name);
      std::vector<const k3::ModelRunner*> models;  // a failed replica makes /health 503 and stops the server
      for (const auto& r : reps) models.push_back(r.model.get());
      o->so.health_problem = [models] { return model_failure(models); };
      k3::serve::Server server(o->so, *engine, ctx, metrics);
      server.catch_signals();  // before the first request can be answered
      server.start();
      ModelFailureWatch failure_watch(models);
      const double ready_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const auto& spec = reps[0].eo.speculative;
      std::fprintf(stderr,
                   "k3 serve: model '%s' from %s (load %.3f s); ready in %.3f s on http://%s:%u "
                   "(max_model_len %lld: %s; %s, prefix caching %s, %d I/O threads, max_connections %lld%s%s)\n",
                   ctx.model_name.c_str(), dir.c_str(), load_s, ready_s, o->so.host.c_str(), server.port(),
                   (long long)max_model_len, max_model_len_reason(reps).c_str(), engines_summary(*o, reps).c_str(),
                   o->no_prefix ? "off" : "on", o->so.threads,
                   (long long)server.max_connections(), o->so.api_keys.empty() ? "" : ", API key required",
                   spec ? (", speculative decoding " + k3::engine::describe(*spec)).c_str() : "");
      if (o->so.webui) std::fprintf(stderr, "k3 serve: web chat at http://%s:%u/\n", o->so.host.c_str(), server.port());
      std::fflush(stderr);
      server.run_until_signal();
      if (const std::string f = model_failure(models); !f.empty()) throw k3::Error("k3 serve stopped: " + f);
      std::fprintf(stderr, "k3 serve: stopped\n");
      return 0;
    };
  });
}

}  // namespace k3cli
