// `k3 bench serve|offline|plot`: serving load generator (vllm bench serve conventions) against any
// OpenAI-compatible server, engine throughput without HTTP (llama-bench style), and the
// latency-throughput plot (scripts/bench_plot.py). docs/bench.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/expert_report.h"
#include "cli/model_loader.h"
#include "cli/bench_allreduce.h"
#include "cli/bench_speculative.h"
#include "cli/speculative_option.h"
#include "k3/bench/client.h"
#include "k3/bench/dataset.h"
#include "k3/bench/memory_bandwidth.h"
#include "k3/model/gguf_model.h"
#include "k3/bench/offline.h"
#include "k3/grammar/grammar_engine.h"
#include "k3/engine/speculative_config.h"
#include "k3/bench/stats.h"
#include "k3/core/error.h"
#include "k3/core/thread_pool.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string now_string() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return buf;
}

std::string join_args(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) s += ' ';
    s += argv[i];
  }
  return s;
}

void write_json(const std::string& path, const json& j) {
  std::ofstream f(path);
  if (!f) throw k3::Error("cannot write '" + path + "'");
  f << j.dump(2) << "\n";
}

struct ServeOpts {
  std::string base_url = "http://127.0.0.1:8000", endpoint = "/v1/completions", model, api_key, tokenizer;
  std::string dataset = "random", dataset_path;
  k3::bench::RandomOptions rnd;
  k3::bench::PrefixRepetitionOptions pr;
  int64_t sharegpt_output_len = -1;
  int64_t num_prompts = 1000, max_concurrency = 0, warmups = 0, sweep_per_conc = 0, seed = 0;
  double request_rate = std::numeric_limits<double>::infinity(), burstiness = 1.0, temperature = 0.0, timeout = 6 * 3600;
  bool ignore_eos = false, dry_run = false, text_prompts = false, quiet = false, save_detailed = false;
  std::vector<std::string> goodput;
  std::vector<int64_t> sweep;
  std::string result_file, label;
  // vllm bench serve's spellings: --backend (endpoint), --host/--port (base URL), --save-result with
  // --result-dir / --result-filename (the result file); applied by apply_vllm_flags before the run.
  std::string backend, host, result_dir, result_filename;
  int port = 0;
  bool save_result = false;
  std::string percentile_metrics = "ttft,tpot,itl", metric_percentiles = "99";  // vllm's defaults
};

// vLLM's flags onto k3's: --backend openai-chat picks /v1/chat/completions (vllm / openai: /v1/completions)
// unless --endpoint was given; --host/--port build the base URL. (--save-result: name_saved_result.)
void apply_vllm_flags(ServeOpts& o, bool endpoint_given) {
  if (!o.backend.empty() && !endpoint_given) o.endpoint = o.backend == "openai-chat" ? "/v1/chat/completions" : "/v1/completions";
  if (!o.host.empty() || o.port > 0)
    o.base_url = "http://" + (o.host.empty() ? std::string("127.0.0.1") : o.host) + ":" + std::to_string(o.port > 0 ? o.port : 8000);
}

// --save-result's file, once the model name is known (given, or the server's first).
void name_saved_result(ServeOpts& o) {
  if (!o.save_result || !o.result_file.empty()) return;
  std::string name = o.result_filename;
  if (name.empty()) {
    char date[32];
    const std::time_t now = std::time(nullptr);
    std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", std::localtime(&now));
    const std::string rate = std::isfinite(o.request_rate) ? std::to_string(o.request_rate) : "inf";
    std::string model = o.model.empty() ? "model" : o.model;
    std::replace(model.begin(), model.end(), '/', '_');
    name = (o.backend.empty() ? "vllm" : o.backend) + "-" + rate + "qps-" + model + "-" + date + ".json";
  }
  o.result_file = (fs::path(o.result_dir.empty() ? "." : o.result_dir) / name).string();
}

void add_vllm_flags(CLI::App* s, ServeOpts& o) {
  s->add_option("--backend", o.backend, "vllm bench's: vllm / openai (/v1/completions) or openai-chat (/v1/chat/completions)")
      ->check(CLI::IsMember({"vllm", "openai", "openai-chat"}));
  s->add_option("--host", o.host, "server host (with --port, instead of --base-url)");
  s->add_option("--port", o.port, "server port (with --host, instead of --base-url)")->check(CLI::Range(1, 65535));
  s->add_flag("--save-result", o.save_result, "write the results as JSON into --result-dir (vllm bench's naming)");
  s->add_option("--result-dir", o.result_dir, "directory for --save-result (default: .)");
  s->add_option("--result-filename", o.result_filename, "file name for --save-result (default: vllm bench's)");
  // Checked here, so that a bad list is a usage error (exit 2) before anything is sent.
  auto check = [](bool metrics) {
    return CLI::Validator(
        [metrics](std::string& v) {
          try {
            k3::bench::parse_percentile_choice(metrics ? v : "ttft", metrics ? "99" : v);
            return std::string();
          } catch (const k3::Error& e) {
            const std::string m = e.what();  // CLI11 names the option itself: drop ours
            return m.substr(m.find(": ") == std::string::npos ? 0 : m.find(": ") + 2);
          }
        },
        "");
  };
  s->add_option("--percentile-metrics", o.percentile_metrics, "metrics the table shows percentiles of: ttft,tpot,itl,e2el")
      ->capture_default_str()
      ->check(check(true));
  s->add_option("--metric-percentiles", o.metric_percentiles, "percentiles shown and stored as p{P}_{metric}_ms, e.g. 50,90,99")
      ->capture_default_str()
      ->check(check(false));
}

// The ShareGPT file of the project's shared data: $K3_SHARED_DIR, else ../shared; else the bare file name
// (then the dataset loader says it is missing).
std::string sharegpt_default() {
  const char* env = std::getenv("K3_SHARED_DIR");
  const std::string base = env && *env ? env : "../shared";
  const std::string p = base + "/data/prompts/ShareGPT_V3_filtered_1000.json";
  return fs::exists(p) ? p : "ShareGPT_V3_filtered_1000.json";
}

namespace b = k3::bench;

// Client options from the flags; the model is the server's first one when --model is not given (as vllm
// bench does).
b::ClientOptions client_options(ServeOpts& o) {
  b::ClientOptions co;
  co.url = b::parse_url(o.base_url);
  co.endpoint = o.endpoint;
  if (!co.endpoint.empty() && co.endpoint[0] != '/') co.endpoint = "/" + co.endpoint;
  co.api_key = o.api_key;
  if (co.api_key.empty())
    if (const char* k = std::getenv("OPENAI_API_KEY")) co.api_key = k;
  co.ignore_eos = o.ignore_eos;
  co.temperature = o.temperature;
  co.token_id_prompts = !o.text_prompts;
  co.timeout_s = o.timeout;
  if (o.model.empty()) {
    int st = 0;
    auto body = b::http_get(co.url, "/v1/models", &st, 10, co.api_key);  // the key: /v1/* may need it
    auto j = json::parse(body, nullptr, false);
    if (st != 200 || !j.is_object() || !j.contains("data") || j["data"].empty())
      throw k3::Error("--model not given and GET /v1/models failed (HTTP " + std::to_string(st) + ")");
    o.model = j["data"][0].value("id", "");
  }
  co.model = o.model;
  return co;
}

// The tokenizer that builds the prompts: --tokenizer; else, as vllm bench defaults to the served model's,
// the `root` GET /v1/models gives for the model (k3 serve: its path) when that is readable on this host;
// else the built-in model's, said on stderr (a server on another host, or a server that is not k3's).
std::string bench_tokenizer_dir(const ServeOpts& o, const b::ClientOptions& co) {
  if (!o.tokenizer.empty() || o.dry_run) return resolve_model_dir(o.tokenizer);
  int st = 0;
  const json j = json::parse(b::http_get(co.url, "/v1/models", &st, 10, co.api_key), nullptr, false);
  std::string root;
  if (st == 200 && j.is_object() && j.contains("data") && j["data"].is_array())
    for (const auto& m : j["data"])
      if (m.is_object() && m.value("id", "") == co.model && m.contains("root") && m["root"].is_string())
        root = m["root"].get<std::string>();
  std::error_code ec;
  if (!root.empty() && fs::exists(root, ec)) {
    try {
      (void)k3::text::Tokenizer::load(root);
      std::fprintf(stderr, "k3 bench: tokenizer: %s (the served model's, from /v1/models)\n", root.c_str());
      return root;
    } catch (const k3::Error& e) {
      std::fprintf(stderr, "k3 bench: the served model's path %s has no tokenizer we read (%s)\n", root.c_str(), e.what());
    }
  }
  const std::string dir = resolve_model_dir("");
  std::fprintf(stderr, "k3 bench: tokenizer: %s (the built-in model's: the served model's path %s is not on this host; "
               "--tokenizer DIR to choose)\n", dir.c_str(), root.empty() ? "(none given)" : root.c_str());
  return dir;
}

// Requests for the warm-up and every sweep point: each point gets its own prompts (a server's prefix cache
// must not see repeats).
std::vector<b::BenchRequest> build_requests(const ServeOpts& o, const k3::text::Tokenizer& tok, bool decode_text) {
  int64_t total = o.sweep.empty() ? o.num_prompts : 0;
  for (int64_t c : o.sweep) total += std::max(o.num_prompts, o.sweep_per_conc * c);
  total += o.warmups;
  std::vector<b::BenchRequest> reqs;
  const uint64_t seed = static_cast<uint64_t>(o.seed);
  if (o.dataset == "random") {
    reqs = b::random_dataset(total, o.rnd, b::sampleable_ids(tok), seed);
  } else if (o.dataset == "prefix-repetition") {
    reqs = b::prefix_repetition_dataset(total, o.pr, b::sampleable_ids(tok), seed);
  } else if (o.dataset == "sharegpt") {
    b::ShareGptOptions so;
    so.path = o.dataset_path.empty() ? sharegpt_default() : o.dataset_path;
    so.output_len = o.sharegpt_output_len;
    reqs = b::sharegpt_dataset(total, so, tok, seed);
  } else {
    throw k3::Error("--dataset-name: unknown dataset '" + o.dataset + "' (random, sharegpt, prefix-repetition)");
  }
  if (decode_text) b::decode_prompts(reqs, tok);
  return reqs;
}

// The server's own count of generated tokens (k3 serve's /metrics), to check the client's count.
std::optional<double> server_tokens(const ServeOpts& o, const b::ClientOptions& co) {
  if (o.dry_run) return std::nullopt;
  try {
    int st = 0;
    auto txt = b::http_get(co.url, "/metrics", &st);
    if (st != 200) return std::nullopt;
    return b::prometheus_value(txt, "k3_generation_tokens_total");
  } catch (const k3::Error&) {
    return std::nullopt;
  }
}

// The JSON of one sweep point (vllm bench's result keys plus ours).
json point_json(const ServeOpts& o, const b::Summary& s, const b::LoadResult& lr, const b::Slo& slo, int64_t conc,
                int64_t n, double served) {
  json j = b::summary_json(s, b::parse_percentile_choice(o.percentile_metrics, o.metric_percentiles));
  j["max_concurrency"] = conc > 0 ? json(conc) : json(nullptr);
  j["num_prompts"] = n;
  j["request_rate"] = std::isfinite(o.request_rate) ? json(o.request_rate) : json("inf");
  j["burstiness"] = o.burstiness;
  j["client_connections_opened"] = lr.connections_opened;
  j["usage_missing"] = lr.usage_missing;
  j["chunk_throughput"] = s.duration_s > 0 ? s.total_chunks / s.duration_s : 0.0;
  if (served >= 0) j["server_generation_tokens_delta"] = served;
  if (!slo.empty()) {
    json g;
    if (slo.ttft_ms) g["ttft"] = *slo.ttft_ms;
    if (slo.tpot_ms) g["tpot"] = *slo.tpot_ms;
    if (slo.e2el_ms) g["e2el"] = *slo.e2el_ms;
    j["goodput_slo_ms"] = g;
  }
  if (o.save_detailed) {
    json per = json::array();
    for (auto& r : lr.outcomes)
      per.push_back({{"success", r.success}, {"error", r.error}, {"prompt_tokens", r.prompt_tokens},
                     {"output_tokens", r.output_tokens}, {"ttft", r.ttft}, {"e2e", r.e2e}, {"itl", r.itl}});
    j["requests"] = per;
  }
  return j;
}

// The printed table of one sweep point.
// served: the server's count of generated tokens in this point (< 0: unknown).
std::string point_table(const ServeOpts& o, const b::Summary& s, int64_t conc, double served) {
  const std::string title =
      conc > 0 ? "Serving Benchmark Result (concurrency " + std::to_string(conc) + ")" : "Serving Benchmark Result";
  std::string t = b::summary_table(s, title, b::parse_percentile_choice(o.percentile_metrics, o.metric_percentiles));
  if (served >= 0) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-40s%-10.0f\n", "Server-counted generated tokens:", served);
    t.insert(t.size() - 51, buf);
  }
  if (o.dry_run) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%-40s%-10.0f\n%-40s%-10.0f\n", "Client capacity (req/s, mock server):",
                  s.request_throughput, "Client capacity (chunks/s, mock server):",
                  s.duration_s > 0 ? s.total_chunks / s.duration_s : 0.0);
    t.insert(t.size() - 51, buf);
  }
  if (!s.errors.empty()) t += "first errors: " + s.errors.front() + "\n";
  return t;
}

// The result file's run description (vllm bench's keys).
json result_meta(const ServeOpts& o, const b::ClientOptions& co, const std::string& tok_dir, const std::string& cmdline) {
  json meta = {{"date", now_string()},
               {"backend", o.dry_run ? "mock" : "openai"},
               {"base_url", o.base_url},
               {"endpoint", co.endpoint},
               {"model_id", o.model},
               {"tokenizer_id", tok_dir},
               {"dataset_name", o.dataset},
               {"seed", o.seed},
               {"ignore_eos", o.ignore_eos},
               {"temperature", o.temperature},
               {"num_warmups", o.warmups},
               {"label", o.label},
               {"command", cmdline}};
  if (o.dataset == "random")
    meta["random"] = {{"input_len", o.rnd.input_len}, {"output_len", o.rnd.output_len},
                      {"range_ratio", o.rnd.range_ratio}, {"prefix_len", o.rnd.prefix_len}};
  if (o.dataset == "prefix-repetition")
    meta["prefix_repetition"] = {{"prefix_len", o.pr.prefix_len}, {"suffix_len", o.pr.suffix_len},
                                 {"num_prefixes", o.pr.num_prefixes}, {"output_len", o.pr.output_len}};
  return meta;
}

int run_bench_serve(ServeOpts& o, const std::string& cmdline) {
  const b::Slo slo = b::parse_goodput(o.goodput);
  std::unique_ptr<b::MockServer> mock;
  if (o.dry_run) {
    mock = std::make_unique<b::MockServer>(1);
    o.base_url = "http://127.0.0.1:" + std::to_string(mock->port());
    if (o.model.empty()) o.model = "mock";
  }
  const b::ClientOptions co = client_options(o);
  name_saved_result(o);  // vllm bench's {backend}-{rate}qps-{model}-{date}.json in --result-dir
  const std::string tok_dir = bench_tokenizer_dir(o, co);
  auto tok = k3::text::Tokenizer::load(tok_dir);
  std::vector<b::BenchRequest> reqs = build_requests(o, tok, b::is_chat_endpoint(co.endpoint) || o.text_prompts);
  std::vector<b::BenchRequest> warm(reqs.begin(), reqs.begin() + o.warmups);
  reqs.erase(reqs.begin(), reqs.begin() + o.warmups);

  if (!warm.empty()) {
    std::fprintf(stderr, "k3 bench: %zu warm-up requests\n", warm.size());
    auto wr = b::run_load(co, warm, std::vector<double>(warm.size(), 0.0), o.max_concurrency > 0 ? o.max_concurrency : 0);
    int64_t bad = 0;
    for (auto& r : wr.outcomes) bad += !r.success;
    if (bad) std::fprintf(stderr, "k3 bench: %lld warm-up requests failed: %s\n", (long long)bad, wr.outcomes[0].error.c_str());
  }

  std::vector<int64_t> points = o.sweep;
  if (points.empty()) points.push_back(o.max_concurrency);
  json runs = json::array();
  size_t offset = 0;
  for (int64_t conc : points) {
    const int64_t n = o.sweep.empty() ? o.num_prompts : std::max(o.num_prompts, o.sweep_per_conc * conc);
    std::vector<b::BenchRequest> sub(reqs.begin() + offset, reqs.begin() + offset + n);
    offset += static_cast<size_t>(n);
    auto arrivals = b::arrival_times(n, o.request_rate, o.burstiness, static_cast<uint64_t>(o.seed));
    const auto before = server_tokens(o, co);
    std::fprintf(stderr, "k3 bench: %lld requests, max concurrency %s, request rate %s -> %s%s\n", (long long)n,
                 conc > 0 ? std::to_string(conc).c_str() : "unlimited",
                 std::isfinite(o.request_rate) ? std::to_string(o.request_rate).c_str() : "inf", o.base_url.c_str(),
                 co.endpoint.c_str());
    const int64_t step = std::max<int64_t>(1, n / 10);
    auto lr = b::run_load(co, sub, arrivals, conc, [&](size_t d) {
      if (!o.quiet && (static_cast<int64_t>(d) % step == 0 || static_cast<int64_t>(d) == n))
        std::fprintf(stderr, "  %zu/%lld done\n", d, (long long)n);
    });
    const auto after = server_tokens(o, co);
    const double served = before && after ? *after - *before : -1;  // < 0: the server did not say
    const auto s = b::summarize(lr.outcomes, lr.duration_s, slo);
    std::printf("%s", point_table(o, s, conc, served).c_str());
    std::fflush(stdout);
    runs.push_back(point_json(o, s, lr, slo, conc, n, served));
  }

  json result = result_meta(o, co, tok_dir, cmdline);
  if (o.sweep.empty())
    result.update(runs[0]);
  else
    result["sweep"] = runs;
  if (!o.result_file.empty()) {
    write_json(o.result_file, result);
    std::fprintf(stderr, "k3 bench: results written to %s\n", o.result_file.c_str());
  }
  int64_t failed = 0;
  for (auto& r : runs) failed += r["failed"].get<int64_t>();
  return failed > 0 ? 3 : 0;
}

std::string shell_quote(const std::string& s) {
  std::string o = "'";
  for (char ch : s) o += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return o + "'";
}

std::string find_plot_script() {
  std::vector<fs::path> c = {fs::current_path() / "scripts/bench_plot.py"};
  char exe[4096];
  ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (len > 0) {
    exe[len] = '\0';
    fs::path d = fs::path(exe).parent_path();
    c.push_back(d.parent_path() / "share/k3/scripts/bench_plot.py");  // `cmake --install`: PREFIX/bin/k3
    for (int up = 0; up < 4 && !d.empty(); ++up, d = d.parent_path()) c.push_back(d / "scripts/bench_plot.py");
  }
  for (auto& p : c)
    if (std::error_code ec; fs::exists(p, ec)) return p.string();
  throw k3::Error("scripts/bench_plot.py not found (run from the source tree, or install with cmake --install)");
}

// The plot needs python3 with matplotlib: asked before anything runs, so that a missing one is one line
// saying how to get it rather than a Python traceback. $K3_PYTHON picks the interpreter (default python3).
std::string plot_python() {
  const char* env = std::getenv("K3_PYTHON");
  const std::string py = env && *env ? env : "python3";
  const std::string probe = shell_quote(py) + " -c 'import matplotlib' >/dev/null 2>&1";
  if (std::system(probe.c_str()) != 0)
    throw k3::Error("k3 bench plot needs matplotlib for " + py + ": python3 -m pip install matplotlib (or apt install python3-matplotlib)");
  return py;
}

}  // namespace

// Set by main through the registry's argv (CLI11 does not keep the raw line); filled in add_bench.
static std::string g_cmdline;

namespace {
// `k3 bench offline`'s options (flags below, in add_bench_offline).
struct OfflineOptions {
  std::string model, json_out;
  DeviceOptions dev;
  std::vector<int64_t> pp{512}, tg{128}, depth{0}, batch{1};
  int reps = 5;
  int64_t seed = 0, ubatch = 0;
  double mem_bw = 0, peak_tflops = 0;
  bool drop_page_cache = false, fresh_tokens = false, no_warmup = false, host_logits = false;
  std::string speculative;  // --speculative-config: the speculative decode test instead of pp/tg
  std::string grammar;      // --grammar: tg with host sampling, none | json_object
};
}  // namespace

// --speculative-config: decode tok/s with speculation off / on through the engine, greedy, -n tokens per request,
// -b requests at once, best of -r alternating repetitions.
static int run_offline_speculative(const OfflineOptions& f, const std::string& dir, const k3::engine::SpeculativeConfig& spec) {
  auto model = load_model(dir, f.dev);
  auto tok = load_tokenizer(dir, f.dev);
  check_tokenizer_fits(tok.n_vocab(), model->config().vocab_size);
  const auto draft = load_draft_model(spec, f.dev);
  const auto drafter = load_block_drafter(spec, dir, f.dev, *model);
  SpecBenchOptions so;
  so.spec = spec;
  so.draft = draft.get();
  so.block_drafter = drafter.get();
  so.batches = f.batch;
  so.n_gen = f.tg.empty() ? 128 : std::max<int64_t>(f.tg[0], 2);
  so.reps = std::max(f.reps, 1);
  std::printf("speculative decoding %s, %s, %lld tokens per request, best of %d, %d threads\n\n",
              k3::engine::describe(spec).c_str(), fs::path(dir).lexically_normal().filename().c_str(),
              (long long)so.n_gen, so.reps, k3::ThreadPool::global().size());
  const json rows = run_spec_bench(*model, tok, so);
  if (!f.json_out.empty())
    write_json(f.json_out, {{"date", now_string()}, {"model", dir}, {"command", g_cmdline},
                             {"speculative_config", k3::engine::describe(spec)}, {"device", model->device_name()},
                             {"threads", k3::ThreadPool::global().size()}, {"results", rows}});
  return 0;
}

// The tg roofline's bandwidth: as given, or -1 (no roofline) where the config's bytes per token are not what the loaded
// weights read; `loaded` gets the GGUF's bytes as bound on the CPU.
static double decode_roofline_bandwidth(const OfflineOptions& f, const std::string& dir, const k3::ModelRunner& model, bool any_tg,
                                        std::optional<k3::plan::LoadedWeightBytes>& loaded) {
  double bw = f.mem_bw;
  // The roofline's bytes per step come from the config (plan::decode_step_bytes: the checkpoint's BF16 /
  // MXFP4 formats); a GGUF's block formats read other bytes: on the CPU they are counted from the bound
  // weights, elsewhere (the device copies are the backend's) no roofline rather than a wrong one.
  if (any_tg && k3::is_gguf_path(dir) && bw >= 0) {
    if (const auto* cpu = dynamic_cast<const k3::Model*>(&model)) {
      loaded = k3::bench::loaded_weight_bytes(cpu->weights());
      std::fprintf(stderr, "k3 bench offline: decode roofline from the GGUF's weights as loaded: %.4f GB a token "
                           "(non-routed) + %.4f GB an expert (all MoE layers)\n", loaded->non_routed / 1e9,
                   loaded->per_expert / 1e9);
    } else {
      bw = -1;
      std::fprintf(stderr, "k3 bench offline: no decode roofline for a GGUF off the CPU (its bytes per token are not the config's)\n");
    }
  }
  // The CPU's dummy matrices are views of shared pools (model/dummy_checkpoint.h): fewer distinct bytes than
  // the config's, so a roofline would flatter it.
  if (any_tg && f.dev.load_format == "dummy" && f.dev.device == "cpu" && bw >= 0) {
    bw = -1;
    std::fprintf(stderr, "k3 bench offline: no decode roofline for --load-format dummy on the CPU (its matrices share bytes; a GGUF written by "
                         "`k3 quantize --load-format dummy` has its own bytes and gets one)\n");
  }
  return bw;
}

// pp / tg tests (llama-bench style), a table and the JSON.
static int run_offline(const OfflineOptions& f, const std::string& dir) {
  if (f.drop_page_cache) drop_checkpoint_pages(dir);
  const k3::DiskCounters disk0 = k3::read_disk_counters();
  const auto t_load = std::chrono::steady_clock::now();
  auto model = load_model(dir, f.dev);
  std::fprintf(stderr, "k3 bench offline: loaded in %.1f s; %s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count(),
               expert_cache_report(std::nullopt, disk0, 0).c_str());
  // The numerics the rows below ran with (the table has no column for them; logs of A/B arms need them).
  std::fprintf(stderr, "k3 bench offline: %s, kv-cache-dtype %s, mamba-ssm-cache-dtype %s, moe-activation-dtype %s%s\n",
               model->device_name().c_str(), f.dev.kv_cache_dtype.c_str(), f.dev.mamba_ssm_cache_dtype.c_str(),
               f.dev.moe_activation_dtype.c_str(), f.dev.device == "cpu" ? "" : (", gemm-precision " + f.dev.gemm).c_str());
  auto tests = k3::bench::offline_tests(f.pp, f.tg, f.depth, f.batch);
  for (auto& t : tests) t.ubatch = f.ubatch;
  std::vector<k3::bench::OfflineResult> rs;
  json arr = json::array();
  std::string name = fs::path(dir).lexically_normal().filename().string();
  if (f.dev.load_format == "dummy")
    name = (f.dev.preset.empty() ? name : f.dev.preset) +
           (f.dev.num_layers > 0 ? " " + std::to_string(f.dev.num_layers) + "L" : "") + " (dummy)";
  const bool any_tg = std::any_of(tests.begin(), tests.end(), [](const auto& t) { return !t.prefill; });
  std::optional<k3::plan::LoadedWeightBytes> loaded;
  double bw = decode_roofline_bandwidth(f, dir, *model, any_tg, loaded);
  // Measured here (not given): read again after each tg test, whose roofline takes the mean of the figures before
  // and after it -- a shared host's memory rate moves by the minute (docs/perf/cpu.md session 45: 28-51 GB/s in
  // four back-to-back rounds on the dev VM, the decode itself within 10%).
  const bool measured_bw = bw == 0 && any_tg && f.dev.device == "cpu";
  auto read_bw = [] {
    // 1 GiB, median: with 512 MiB and the best pass the figure sometimes read 64-78 GB/s on a box whose
    // 2 GiB reads give 45 (a cache of the host's, or another tenant's lull), which made `% of BW` look low.
    const k3::bench::BandwidthResult m = k3::bench::measure_read_bandwidth(size_t{1024} << 20, 5);
    std::fprintf(stderr, "k3 bench offline: memory read bandwidth %.1f GB/s (median of %d passes over %zu MiB, %d threads)\n",
                 m.median_gb_s, m.passes, m.bytes >> 20, m.threads);
    return m.median_gb_s;
  };
  if (measured_bw) bw = read_bw();
  k3::bench::OfflineSampling sampling;
  std::unique_ptr<k3::grammar::GrammarEngine> grammar;
  if (f.grammar == "json_object") {
    auto tok = load_tokenizer(dir, f.dev);
    grammar = std::make_unique<k3::grammar::GrammarEngine>(tok, model->config().vocab_size);
    k3::grammar::GrammarSpec gs;
    gs.kind = k3::grammar::GrammarSpec::Kind::JsonObject;
    if (tok.eos_id() >= 0) gs.stop_ids.push_back(tok.eos_id());
    sampling.grammar = grammar->compile(gs);
  }
  for (auto& t : tests) {
    std::fprintf(stderr, "k3 bench offline: %s depth %lld batch %lld, %d threads ...\n", t.name.c_str(), (long long)t.depth,
                 (long long)t.batch, k3::ThreadPool::global().size());
    rs.push_back(k3::bench::run_offline_test(*model, t, f.reps, static_cast<uint64_t>(f.seed), f.fresh_tokens,
                                             !f.no_warmup, f.grammar.empty() ? nullptr : &sampling, f.host_logits));
    double test_bw = bw;
    if (measured_bw && !t.prefill) {
      const double after = read_bw();
      test_bw = (bw + after) / 2;
      if (std::abs(after - bw) > 0.2 * test_bw)
        std::fprintf(stderr, "k3 bench offline: %s: the memory rate moved during the test (%.1f -> %.1f GB/s); %% of BW uses %.1f\n",
                     t.name.c_str(), bw, after, test_bw);
      bw = after;
    }
    k3::bench::add_decode_roofline(rs.back(), model->config(), model->cache_spec(), test_bw, loaded ? &*loaded : nullptr);
    k3::bench::add_prefill_roofline(rs.back(), model->config(), f.peak_tflops);
    if (sampling.grammar && !t.prefill) {
      double total = 0;
      for (double s : rs.back().seconds) total += s;
      std::fprintf(stderr, "k3 bench offline: %s: filling grammar masks took %.1f ms of %.1f ms (%.2f%%)\n",
                   t.name.c_str(), rs.back().mask_seconds * 1e3, total * 1e3,
                   total > 0 ? 100.0 * rs.back().mask_seconds / total : 0.0);
    }
    json j = rs.back().to_json();
    j["model"] = f.dev.load_format == "dummy" ? name : dir;  // dummy weights: the preset, not a directory
    arr.push_back(j);
  }
  std::printf("%s", k3::bench::offline_table(rs, name).c_str());
  if (!rs.empty() && (rs[0].io.have_disk || rs[0].io.have_experts))  // the timed repetitions' reads
    std::printf("\n%s", k3::bench::offline_io_table(rs).c_str());
  std::printf("\n%s", expert_cache_report(model->expert_cache_stats(), disk0, 0).c_str());  // since load
  if (!f.json_out.empty()) write_json(f.json_out, {{"date", now_string()}, {"model", f.dev.load_format == "dummy" ? name : dir}, {"command", g_cmdline},
                                                     {"method", f.host_logits || !f.grammar.empty()
                                                                   ? "ModelRunner::forward_batch (logits to the host), one cache per sequence"
                                                                   : "pp: ModelRunner::forward_batch; tg: forward_sample (greedy picks on the runner), one cache per sequence"}, {"device", model->device_name()},
                                                     {"threads", k3::ThreadPool::global().size()}, {"placement", compute_threads_summary()},
                                                     {"results", arr}});
  return 0;
}

// `k3 bench offline`: llama-bench-style pp/tg throughput of the forward pass (no HTTP, no scheduler).
static void add_bench_offline(CLI::App* bench, Registry& reg) {
  // ---- offline
  auto f = std::make_shared<OfflineOptions>();
  auto* off = bench->add_subcommand("offline", "Engine throughput without HTTP (llama-bench style pp/tg tok/s)");
  off->add_option("-m,--model", f->model, "HF checkpoint directory or GGUF file (default: the built-in model)");
  add_device_options(off, f->dev);
  off->add_option("-p,--n-prompt", f->pp, "prompt-processing sizes (pp N)")->delimiter(',')->capture_default_str();
  off->add_option("-n,--n-gen", f->tg, "generation lengths (tg N)")->delimiter(',')->capture_default_str();
  off->add_option("-d,--n-depth", f->depth, "tokens already in the cache")->delimiter(',')->capture_default_str();
  off->add_option("-b,--batch", f->batch, "sequences per batched forward")->delimiter(',')->capture_default_str();
  off->add_option("--ubatch-size", f->ubatch,
                  "pp tests: at most this many tokens of each prompt per forward (llama-bench's -ub; 0: the whole prompt at once)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  off->add_option("-r,--repetitions", f->reps, "timed repetitions (after one warm-up)")->capture_default_str();
  off->add_option("--seed", f->seed, "token seed")->capture_default_str();
  off->add_option("-o,--json", f->json_out, "write the results as JSON");
  off->add_option("--mem-bw", f->mem_bw,
                  "memory read bandwidth in GB/s for the tg roofline columns (0: measure it as `k3 bench memory` does, "
                  "CPU device only; -1: no roofline)")
      ->capture_default_str();
  off->add_option("--peak-tflops", f->peak_tflops,
                  "the device's dense bf16 tensor rate in TFLOP/s for the pp roofline columns (GFLOP/token, TFLOP/s, % of "
                  "peak; the FLOPs are `k3 plan`'s); 0: no columns")
      ->check(finite_number())
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  off->add_flag("--fresh-tokens", f->fresh_tokens,
                "new random tokens for every repetition (the warm-up does not preload the experts the timed runs use)");
  off->add_flag("--host-logits", f->host_logits,
                "tg steps download every row's logits to the host (forward_batch, as llama.cpp's llama_decode does); "
                "default: the serving engine's path, greedy picks by forward_sample (on a GPU only the ids cross)");
  off->add_flag("--no-warmup", f->no_warmup, "no untimed warm-up run (with --drop-page-cache: a cold start is timed)");
  off->add_flag("--drop-page-cache", f->drop_page_cache,
                "evict the checkpoint's files from the page cache before loading (a cold start without root)");
  add_speculative_option(off, f->speculative);
  off->add_option("--grammar", f->grammar,
                  "tg tests sample every row on the host after each step, the token being the next input: 'none' "
                  "(no mask) or 'json_object' (every sequence under a JSON-object grammar: what masks cost)")
      ->check(CLI::IsMember({"none", "json_object"}));
  off->callback([&reg, f] {
    reg.action = [f] {
      const auto spec = k3::engine::parse_speculative_config(f->speculative);  // before the model loads
      const std::string dir = resolve_model_dir(f->model);
      return spec ? run_offline_speculative(*f, dir, *spec) : run_offline(*f, dir);
    };
  });
}

// `k3 bench memory`: the compute threads' DRAM read bandwidth (the decode roofline's denominator).
static void add_bench_memory(CLI::App* bench, Registry& reg) {
  // ---- memory
  struct MemOpts {
    int64_t mib = 1024;
    int passes = 10;
    std::vector<int64_t> job_kib;  // empty: the whole buffer in one job a pass
    ComputeOptions compute;
  };
  auto mo = std::make_shared<MemOpts>();
  auto* mem = bench->add_subcommand("memory", "DRAM read bandwidth of the compute threads (the decode roofline's denominator)");
  mem->add_option("--size-mib", mo->mib, "buffer to read, MiB (64..65536)")->capture_default_str();
  mem->add_option("--passes", mo->passes, "timed full reads (after one warm-up)")->capture_default_str();
  mem->add_option("--job-kib", mo->job_kib,
                  "also read the buffer as back-to-back parallel jobs of this many KiB (a list: one line each; a decode "
                  "product's size, e.g. 5184 for a 2304x4096 Q4_K matrix): the rate through the pool's fork and join")
      ->delimiter(',');
  add_compute_options(mem, mo->compute);
  mem->callback([&reg, mo] {
    reg.action = [mo] {
      if (mo->mib < 64 || mo->mib > 65536) throw k3::Error("--size-mib: expected 64..65536, got " + std::to_string(mo->mib));
      apply_compute_options(mo->compute);
      for (int64_t k : mo->job_kib)
        if (k < 4 || k > mo->mib * 1024) throw k3::Error("--job-kib: expected 4 .. the buffer's KiB, got " + std::to_string(k));
      const k3::bench::BandwidthResult r = k3::bench::measure_read_bandwidth(static_cast<size_t>(mo->mib) << 20, mo->passes);
      std::printf("memory read bandwidth: best %.1f GB/s, median %.1f GB/s (%d passes over %zu MiB, %d threads)\n",
                  r.best_gb_s, r.median_gb_s, r.passes, r.bytes >> 20, r.threads);
      for (int64_t k : mo->job_kib) {
        const auto j = k3::bench::measure_read_bandwidth(static_cast<size_t>(mo->mib) << 20, mo->passes, static_cast<size_t>(k) << 10);
        const double us = static_cast<double>(j.job_bytes) / (j.median_gb_s * 1e3);
        std::printf("  in jobs of %6lld KiB: best %.1f GB/s, median %.1f GB/s (%.0f%% of the whole-buffer median; %.1f us a job)\n",
                    (long long)k, j.best_gb_s, j.median_gb_s, 100.0 * j.median_gb_s / r.median_gb_s, us);
      }
      return 0;
    };
  });

}

void add_bench(CLI::App& app, Registry& reg) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: serve (load generator), offline (engine throughput), allreduce, plot");
  bench->require_subcommand(1);
  add_bench_allreduce(bench, reg);

  // ---- serve
  auto o = std::make_shared<ServeOpts>();
  auto* s = bench->add_subcommand("serve", "Load-test an OpenAI-compatible server (vllm bench serve conventions)");
  s->add_option("--base-url", o->base_url, "server base URL")->capture_default_str();
  s->add_option("--endpoint", o->endpoint, "/v1/completions or /v1/chat/completions")->capture_default_str();
  s->add_option("--model", o->model, "model name of the API (default: the first of GET /v1/models)");
  s->add_option("--api-key", o->api_key, "bearer token (default: $OPENAI_API_KEY)");
  s->add_option("--tokenizer", o->tokenizer, "model dir whose tokenizer builds the prompts (default: the served model's, from /v1/models root, if on this host)");
  s->add_option("--dataset-name", o->dataset, "random, sharegpt, prefix-repetition")->capture_default_str();
  s->add_option("--dataset-path", o->dataset_path, "ShareGPT JSON (default: ShareGPT_V3_filtered_1000.json in ../shared/data/prompts)");
  s->add_option("--input-len,--random-input-len", o->rnd.input_len, "random: prompt tokens")->capture_default_str();
  s->add_option("--output-len,--random-output-len", o->rnd.output_len, "random: max_tokens")->capture_default_str();
  s->add_option("--range-ratio,--random-range-ratio", o->rnd.range_ratio, "random: lengths uniform in len*[1-r, 1+r]")
      ->capture_default_str();
  s->add_option("--prefix-len,--random-prefix-len", o->rnd.prefix_len, "random: shared prefix tokens before each prompt")
      ->capture_default_str();
  s->add_option("--sharegpt-output-len", o->sharegpt_output_len, "sharegpt: max_tokens (default: the dataset reply's length)");
  s->add_option("--prefix-repetition-prefix-len", o->pr.prefix_len)->capture_default_str();
  s->add_option("--prefix-repetition-suffix-len", o->pr.suffix_len)->capture_default_str();
  s->add_option("--prefix-repetition-num-prefixes", o->pr.num_prefixes)->capture_default_str();
  s->add_option("--prefix-repetition-output-len", o->pr.output_len)->capture_default_str();
  s->add_option("--num-prompts", o->num_prompts, "requests to send (per sweep point)")->capture_default_str();
  s->add_option("--request-rate", o->request_rate, "requests/s (Poisson / gamma arrivals); inf: all at once")
      ->capture_default_str();
  s->add_option("--burstiness", o->burstiness, "gamma shape of the inter-arrival times (1 = Poisson)")->capture_default_str();
  s->add_option("--max-concurrency", o->max_concurrency, "requests in flight at most (0 = unlimited)");
  s->add_option("--warmups,--num-warmups", o->warmups, "warm-up requests before measuring (not counted)")->capture_default_str();
  s->add_flag("--ignore-eos", o->ignore_eos, "send ignore_eos: generate exactly max_tokens");
  s->add_option("--seed", o->seed, "dataset and arrival seed")->capture_default_str();
  s->add_option("--temperature", o->temperature, "sampling temperature sent")->capture_default_str();
  s->add_option("--goodput", o->goodput, "SLOs: ttft:MS tpot:MS e2el:MS")->expected(1, 3);
  s->add_option("--sweep-concurrency", o->sweep, "run once per max concurrency, e.g. 1,32,128,512")->delimiter(',');
  s->add_option("--sweep-prompts-per-concurrency", o->sweep_per_conc,
                "sweep: send max(--num-prompts, K x concurrency) requests per point")
      ->capture_default_str();
  s->add_option("--result-file", o->result_file, "write the results as JSON");
  s->add_option("--label", o->label, "free-form label stored in the result");
  s->add_option("--timeout", o->timeout, "seconds without data before a request fails")->capture_default_str();
  s->add_flag("--text-prompts", o->text_prompts, "completions: send random prompts as text instead of token-id lists");
  s->add_flag("--save-detailed", o->save_detailed, "store per-request TTFT / ITL / lengths in the result");
  s->add_flag("--dry-run-server", o->dry_run,
              "run against a built-in mock SSE server (instant tokens) to measure what the client alone sustains");
  s->add_flag("-q,--quiet", o->quiet, "no progress lines");
  add_vllm_flags(s, *o);
  s->callback([&reg, o, s] {
    const bool endpoint_given = s->count("--endpoint") > 0;
    reg.action = [o, endpoint_given] {
      apply_vllm_flags(*o, endpoint_given);
      return run_bench_serve(*o, g_cmdline);
    };
  });

  add_bench_offline(bench, reg);
  add_bench_memory(bench, reg);
  add_bench_disk(bench, reg);

  // ---- plot
  struct PlotOpts {
    std::vector<std::string> files;
    std::string out = "bench.png", title;
  };
  auto p = std::make_shared<PlotOpts>();
  auto* pl = bench->add_subcommand("plot", "Latency-throughput curves of bench serve results (python3 + matplotlib)");
  pl->add_option("results", p->files, "result JSON files (single runs or sweeps)")->required();
  pl->add_option("-o,--output", p->out, "PNG to write")->capture_default_str();
  pl->add_option("--title", p->title, "plot title");
  pl->callback([&reg, p] {
    reg.action = [p] {
      std::string cmd = shell_quote(plot_python()) + " " + shell_quote(find_plot_script()) + " -o " + shell_quote(p->out);
      if (!p->title.empty()) cmd += " --title " + shell_quote(p->title);
      for (auto& f2 : p->files) cmd += " " + shell_quote(f2);
      const int st = std::system(cmd.c_str());
      if (st != 0) throw k3::Error("the plot script failed (its message is above)");
      return 0;
    };
  });
}

void set_bench_cmdline(int argc, char** argv) { g_cmdline = join_args(argc, argv); }

}  // namespace k3cli
