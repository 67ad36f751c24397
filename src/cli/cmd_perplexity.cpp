// `k3 perplexity [-m DIR] -f FILE [--ctx N] [--chunks K]`: perplexity of a model on a text file.
// Rule (shared with python/k3tiny/evaluate.py, docs/perplexity.md): the whole file is tokenised with
// encode_ordinary and cut into consecutive, non-overlapping windows of N tokens (the last may be
// shorter); each window is run from an empty state as [BOS] + window, and every window token is
// scored given BOS and the window tokens before it. PPL = exp(total NLL / scored tokens).
// KL divergence (llama-perplexity's flags): `--kl-divergence-base FILE` saves every scored position's
// log-probs; adding `--kl-divergence` reads them instead and compares this model with that base
// (k3/eval/kl_divergence.h; -f may then be left out: the base file holds the tokens). Base files in
// llama.cpp's format (k3/eval/llama_kl_base.h; written with --kl-base-format llama, recognised on read) go
// with llama-perplexity's rule instead: chunks of ctx tokens, the first replaced by BOS, the second half scored.
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
#include "k3/eval/llama_kl_base.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

namespace {

struct PerplexityOpts {
  std::string model, file, json_out, kl_base, kl_base_format = "k3";
  bool kl_compare = false, parse_special = false, decode = false;
  DeviceOptions dev;
  int64_t ctx = 512, chunks = -1;
};

// One run of the model from an empty state: the tokens fed (BOS first) and the first scored position;
// positions first .. run.size()-2 are scored, each predicting the token after it.
struct Window {
  std::vector<int32_t> run;
  int64_t first = 0;
};

// k3's rule: consecutive windows of ctx tokens, each run as [BOS] + window, every token scored once.
std::vector<Window> k3_windows(const std::vector<int32_t>& ids, int64_t ctx, int32_t bos, int64_t max_windows) {
  std::vector<Window> w;
  for (int64_t b = 0; b < static_cast<int64_t>(ids.size()) && (max_windows < 0 || static_cast<int64_t>(w.size()) < max_windows); b += ctx) {
    Window win;
    win.run.assign(1, bos);
    win.run.insert(win.run.end(), ids.begin() + b, ids.begin() + std::min<int64_t>(b + ctx, static_cast<int64_t>(ids.size())));
    w.push_back(std::move(win));
  }
  return w;
}

// llama-perplexity's rule (the one its base files hold): chunks of ctx tokens, the first replaced by BOS,
// only the second half scored (positions ctx/2 .. ctx-2).
std::vector<Window> llama_windows(const std::vector<int32_t>& ids, int64_t ctx, int32_t bos, int64_t n_chunk) {
  std::vector<Window> w;
  for (int64_t c = 0; c < n_chunk; ++c) {
    Window win;
    win.run.assign(ids.begin() + c * ctx, ids.begin() + (c + 1) * ctx);
    win.run[0] = bos;
    win.first = ctx / 2;
    w.push_back(std::move(win));
  }
  return w;
}

// What each scored position feeds besides the NLL: nothing, a base file being written (k3's or
// llama.cpp's format), or the comparison with a base file being read (either format).
struct KlMode {
  std::unique_ptr<k3::eval::KlBaseWriter> writer;
  std::unique_ptr<k3::eval::LlamaKlBaseWriter> llama_writer;
  std::unique_ptr<k3::eval::KlBase> base;
  std::unique_ptr<k3::eval::LlamaKlBase> llama_base;
  k3::eval::KlAccumulator acc;
  std::vector<float> decoded;  // a llama.cpp base row, decoded

  bool reads() const { return base || llama_base; }
  bool writes() const { return writer || llama_writer; }
  // Scored position `scored` overall, row r of window w.
  void add(int64_t w, int64_t r, int64_t scored, const float* logp, int64_t V, int32_t next) {
    if (writer) writer->add_row(logp);
    if (llama_writer) llama_writer->add_row(logp);
    if (base) acc.add(base->row(scored), logp, V, next);
    if (llama_base) {
      decoded.resize(static_cast<size_t>(V));
      llama_base->decode_row(w, r, decoded.data());
      acc.add(decoded.data(), logp, V, next, k3::eval::kLlamaKlFloor);
    }
  }
};

bool file_is_llama_base(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char magic[8] = {};
  return f.read(magic, 8) && k3::eval::is_llama_kl_base(reinterpret_cast<const uint8_t*>(magic), 8);
}

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

void check_base_vocab(int64_t base_vocab, int64_t V, const std::string& path) {
  if (base_vocab != V)
    throw k3::Error("'" + path + "' holds a " + std::to_string(base_vocab) + "-token vocabulary, this model's is " + std::to_string(V));
}

// The text's tokens checked against a base's: the base may cover fewer windows (--chunks), so its tokens
// must start the text's.
void check_base_tokens(const std::vector<int32_t>& base_ids, const std::vector<int32_t>& text_ids, const PerplexityOpts& o) {
  if (text_ids.size() < base_ids.size() || !std::equal(base_ids.begin(), base_ids.end(), text_ids.begin()))
    throw k3::Error("'" + o.file + "' does not tokenise to the tokens of '" + o.kl_base + "' (other text or tokenizer)");
}

// llama-perplexity tokenises its text with BOS in front (Kimi vocabularies have add_bos), then cuts chunks.
std::vector<int32_t> with_bos(std::vector<int32_t> ids, int32_t bos) {
  ids.insert(ids.begin(), bos);
  return ids;
}

// Opens the base (comparison) or the writer, and cuts the windows by the rule that goes with the format.
std::vector<Window> plan_windows(const PerplexityOpts& o, int64_t V, int32_t bos, const std::optional<k3::text::Tokenizer>& tok,
                                 KlMode& kl, int64_t& ctx) {
  std::vector<int32_t> ids;
  const bool llama = o.kl_compare ? file_is_llama_base(o.kl_base) : o.kl_base_format == "llama" && !o.kl_base.empty();
  if (o.kl_compare && llama) {
    kl.llama_base = std::make_unique<k3::eval::LlamaKlBase>(o.kl_base);
    const auto& h = kl.llama_base->header();
    check_base_vocab(h.n_vocab, V, o.kl_base);
    ids.assign(kl.llama_base->tokens().begin(), kl.llama_base->tokens().end());
    if (!o.file.empty()) check_base_tokens(ids, with_bos(read_text_ids(o.file, *tok, o.parse_special), bos), o);
    ctx = h.n_ctx;
    return llama_windows(ids, ctx, bos, h.n_chunk);
  }
  if (o.kl_compare) {
    kl.base = std::make_unique<k3::eval::KlBase>(o.kl_base);
    const auto& h = kl.base->header();
    check_base_vocab(h.n_vocab, V, o.kl_base);
    ids.assign(kl.base->ids().begin(), kl.base->ids().end());
    if (!o.file.empty()) check_base_tokens(ids, read_text_ids(o.file, *tok, o.parse_special), o);
    ctx = h.ctx;  // the base's windows, whatever --ctx says
    return k3_windows(ids, ctx, bos, -1);
  }
  ids = read_text_ids(o.file, *tok, o.parse_special);
  if (llama) {  // llama.cpp's base: the text after one BOS, whole chunks only, at least two (as llama-perplexity)
    ids = with_bos(std::move(ids), bos);
    int64_t n_chunk = static_cast<int64_t>(ids.size()) / ctx;
    if (o.chunks >= 0) n_chunk = std::min(n_chunk, o.chunks);
    if (static_cast<int64_t>(ids.size()) < 2 * ctx || n_chunk < 1)
      throw k3::Error("'" + o.file + "' holds " + std::to_string(ids.size()) + " tokens; a llama.cpp base needs at least 2 x --ctx (" +
                      std::to_string(2 * ctx) + ")");
    ids.resize(static_cast<size_t>(n_chunk * ctx));
    kl.llama_writer = std::make_unique<k3::eval::LlamaKlBaseWriter>(o.kl_base, ctx, V, ids);
    return llama_windows(ids, ctx, bos, n_chunk);
  }
  auto windows = k3_windows(ids, ctx, bos, o.chunks);
  if (windows.empty()) throw k3::Error("'" + o.file + "' holds no tokens to score");
  if (!o.kl_base.empty()) {
    const size_t covered = std::min(ids.size(), windows.size() * static_cast<size_t>(ctx));
    kl.writer = std::make_unique<k3::eval::KlBaseWriter>(o.kl_base, V, ctx, std::span<const int32_t>(ids.data(), covered));
  }
  return windows;
}

// The logits of a window's positions ([run.size()][V] rows; those from win.first on filled): one forward over the whole
// window (prefill), or with `decode` one forward a token from win.first on, as generation runs them -- the one-token
// kernels, whose quality is what a user's decode gets (e.g. the CPU's MXFP4 expert copies, mxfp4_rowblocks.h).
void run_window(const k3::ModelRunner& model, const Window& win, bool decode, k3::SequenceCache& st,
                const k3::ForwardOptions& fo, std::vector<float>& logits) {
  if (!decode) return model.forward(win.run, st, logits, fo);
  const int64_t n = static_cast<int64_t>(win.run.size());
  k3::ForwardOptions last = fo;
  last.all_logits = false;
  std::vector<float> row;
  if (win.first > 0) model.forward(std::span<const int32_t>(win.run.data(), static_cast<size_t>(win.first)), st, row, last);
  for (int64_t i = win.first; i + 1 < n; ++i) {  // the last token predicts nothing scored
    model.forward(std::span<const int32_t>(win.run.data() + i, 1), st, row, last);
    if (logits.size() < static_cast<size_t>(n) * row.size()) logits.resize(static_cast<size_t>(n) * row.size());
    std::copy(row.begin(), row.end(), logits.begin() + i * static_cast<int64_t>(row.size()));
  }
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
  const int64_t bos = model->config().bos_token_id >= 0 ? model->config().bos_token_id : tok->bos_id();
  if (bos < 0) throw k3::Error("the model has no BOS token id; perplexity windows start with BOS");
  KlMode kl;
  int64_t ctx = o.ctx;
  const std::vector<Window> windows = plan_windows(o, V, static_cast<int32_t>(bos), tok, kl, ctx);
  std::fprintf(stderr, "perplexity: %zu windows of %lld%s%s%s\n", windows.size(), (long long)ctx, o.decode ? ", one token a forward" : "",
               windows.front().first > 0 ? " (llama-perplexity's rule: second half scored)" : "",
               kl.writes() ? " (saving the base log-probs)" : kl.reads() ? " (KL divergence against the base)" : "");
  double nll = 0;
  int64_t scored = 0;
  std::vector<float> logits, logp(static_cast<size_t>(V));
  k3::ForwardOptions fo;
  fo.all_logits = true;
  auto t0 = std::chrono::steady_clock::now();
  for (size_t w = 0; w < windows.size(); ++w) {
    const Window& win = windows[w];
    auto st = model->new_cache();
    run_window(*model, win, o.decode, *st, fo, logits);
    for (int64_t i = win.first; i + 1 < static_cast<int64_t>(win.run.size()); ++i) {
      const int32_t next = win.run[static_cast<size_t>(i + 1)];
      k3::eval::log_softmax(logits.data() + i * V, V, logp.data());
      nll -= logp[static_cast<size_t>(next)];
      kl.add(static_cast<int64_t>(w), i - win.first, scored, logp.data(), V, next);
      ++scored;
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "\r[%zu/%zu] ppl %.4f  %.0f tok/s", w + 1, windows.size(), std::exp(nll / std::max<int64_t>(scored, 1)),
                 scored / std::max(secs, 1e-9));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "\n");
  if (kl.writer) kl.writer->finish();
  if (kl.llama_writer) kl.llama_writer->finish();
  const double mean = nll / static_cast<double>(scored);
  const std::string src = o.file.empty() ? o.kl_base : o.file;
  const auto n_windows = static_cast<long long>(windows.size());
  std::printf("file %s\nmodel %s\nwindows %lld x ctx %lld\ntokens %lld\nmean_nll %.6f\nperplexity %.4f\ntok_per_s %.1f\n",
              src.c_str(), dir.c_str(), n_windows, (long long)ctx, (long long)scored, mean, std::exp(mean), scored / secs);
  nlohmann::json j = {{"file", src},       {"model", dir},           {"ctx", ctx},
                      {"windows", n_windows}, {"tokens", scored},    {"mean_nll", mean},
                      {"perplexity", std::exp(mean)}, {"tok_per_s", scored / secs}};
  if (kl.reads()) print_kl(kl.acc.summary(), j);
  if (kl.writes()) std::printf("kl_base_written %s\n", o.kl_base.c_str());
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
  add_parse_special_flag(cmd, o->parse_special);
  cmd->add_option("--json", o->json_out, "also write the result as JSON to this path");
  cmd->add_flag("--decode", o->decode,
                "score each window one token a forward, as generation runs it (the decode kernels), instead of one "
                "forward a window (prefill)");
  cmd->add_option("--kl-divergence-base", o->kl_base,
                  "file of the base's log-probs: written by this run, or read with --kl-divergence");
  cmd->add_flag("--kl-divergence", o->kl_compare, "compare with the base file: PPL ratio, KLD mean/median/tails, same top-1, RMS dp");
  cmd->add_option("--kl-base-format", o->kl_base_format,
                  "format of a base file written: k3 (fp32 rows, every token scored) or llama (llama-perplexity's file and "
                  "rule); a base read is recognised by its header")
      ->check(CLI::IsMember({"k3", "llama"}))
      ->capture_default_str();
  add_device_options(cmd, o->dev);
  cmd->callback([&reg, o] {
    reg.action = [o] { return run_perplexity(*o); };
  });
}

}  // namespace k3cli
