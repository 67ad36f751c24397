// `k3 convert -m MODEL -o OUT.gguf [--tokenizer DIR] [--tensor-type REGEX=TYPE]... [--imatrix F]`: an HF
// checkpoint as the GGUF llama.cpp's converter writes for kimi-k3 / kimi-linear (model/gguf_export.h), stored
// types kept unless a rule quantises a dense matrix; readable by k3 and llama.cpp.
// `k3 quantize [options] MODEL OUT.gguf PRESET` (llama-quantize's order; MODEL an HF directory or a GGUF):
// the same with a preset's rules after the --tensor-type ones, and a table of sizes per type.
#include <chrono>
#include <cstdio>
#include <map>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "cli/compute_options.h"
#include "cli/model_loader.h"
#include "k3/text/gguf_vocab.h"
#include "k3/core/error.h"
#include "k3/io/gguf.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/dummy_checkpoint.h"
#include "k3/model/gguf_export.h"
#include "k3/model/imatrix.h"
#include "k3/model/model_files.h"
#include "k3/quant/gguf_quant.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

namespace {

struct ConvertOpts {
  std::string model, out, tokenizer, imatrix, preset;
  std::vector<std::string> tensor_types;
  bool no_vocab = false;
  ComputeOptions compute;  // -t: threads that quantise rows
  // --load-format dummy: random weights at MODEL's config.json shapes (model/dummy_checkpoint.h), cut to
  // --num-layers: a benchmark GGUF of a real model's dimensions that neither k3 nor llama.cpp could get otherwise.
  std::string load_format = "auto";
  int64_t num_layers = 0;
};

// MODEL's tensors: the files (HF directory or GGUF), or with --load-format dummy random ones from its config.json.
k3::ModelFiles open_convert_input(const ConvertOpts& o) {
  if (o.load_format != "dummy") {
    if (o.num_layers > 0) throw k3::Error("--num-layers applies to --load-format dummy only");
    return k3::open_model_files(o.model);
  }
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(o.model, ec))
    throw k3::Error("--load-format dummy: '" + o.model + "' must be a directory with a config.json");
  DeviceOptions d;
  d.num_layers = o.num_layers;
  return k3::dummy_model_files(dummy_config(o.model, d));
}

// Bytes and tensors per GGUF type of what was written, the way llama-quantize reports its result.
void print_size_table(const k3::GgufWriter& w) {
  std::map<std::string, std::pair<int64_t, uint64_t>> by;
  uint64_t total = 0;
  for (const auto& [type, bytes] : w.tensor_types()) {
    const auto info = k3::ggml_type_info(type);
    auto& e = by[info ? info->name : std::to_string(type)];
    ++e.first;
    e.second += bytes;
    total += bytes;
  }
  std::printf("| type | tensors | bytes | share |\n|---|---:|---:|---:|\n");
  for (const auto& [name, e] : by)
    std::printf("| %s | %lld | %llu | %.1f%% |\n", name.c_str(), (long long)e.first, (unsigned long long)e.second,
                total ? 100.0 * double(e.second) / double(total) : 0.0);
  std::printf("| all | %zu | %llu | 100%% |\n", w.tensor_types().size(), (unsigned long long)total);
}

// The tokenizer written into the GGUF: --tokenizer, else the HF directory's, else (a GGUF input) the one
// beside it or in its own vocabulary (the rule of every other verb: cli/model_loader.h).
k3::text::Tokenizer convert_tokenizer(const ConvertOpts& o, bool gguf_input) {
  namespace fs = std::filesystem;
  if (gguf_input && o.tokenizer.empty()) {
    DeviceOptions d;
    return load_tokenizer(o.model, d);
  }
  const std::string tok_dir = o.tokenizer.empty() ? o.model : o.tokenizer;
  std::error_code ec;
  if (!fs::exists(fs::path(tok_dir) / "tiktoken.model", ec))
    throw k3::Error("'" + tok_dir + "' has no tiktoken.model: pass --tokenizer DIR, or --no-vocab to write no tokenizer metadata");
  return k3::text::Tokenizer::load(tok_dir);
}

// llama-quantize refuses the lowest i-quants without an imatrix; k3 writes them (its default weighting,
// quant/gguf_quant.h) but says where one would help.
void warn_without_imatrix(const std::vector<k3::TensorTypeRule>& rules) {
  std::string types;
  for (const k3::TensorTypeRule& r : rules)
    if (r.format && k3::quant::importance_recommended(*r.format) && types.find(k3::weight_format_name(*r.format)) == std::string::npos)
      types += std::string(types.empty() ? "" : ", ") + k3::weight_format_name(*r.format);
  if (!types.empty())
    std::fprintf(stderr,
                 "k3: warning: %s without --imatrix: these types lose most without importance weights (llama-quantize "
                 "refuses them); k3 weighs each error by sigma^2 + x^2 instead. Recommended: k3 imatrix, then --imatrix FILE\n",
                 types.c_str());
}

int run_convert(const ConvertOpts& o) {
  namespace fs = std::filesystem;
  apply_compute_options(o.compute);
  // An HF directory or a GGUF (seen under its HF names: model/gguf_model.h), as llama-quantize takes a GGUF.
  k3::ModelFiles files = open_convert_input(o);
  const k3::ModelConfig& cfg = files.config;
  const k3::Checkpoint& ck = *files.checkpoint;
  if (cfg.max_position_embeddings <= 0)
    std::fprintf(stderr,
                 "k3: warning: the config states no trained context (max_position_embeddings / model_max_length): the GGUF "
                 "gets no context_length, without which llama.cpp does not load it\n");
  k3::GgufWriter w;
  // A GGUF input keeps its general.name; else the directory's (or file's) name.
  std::string name = !files.name.empty() ? files.name
                     : files.gguf        ? fs::path(o.model).stem().string()
                                         : fs::path(o.model).lexically_normal().filename().string();
  if (o.load_format == "dummy") name += "-dummy";
  std::vector<k3::TensorTypeRule> rules;
  for (const std::string& r : o.tensor_types) rules.push_back(k3::parse_tensor_type_rule(r));
  if (!o.preset.empty())
    for (k3::TensorTypeRule& r : k3::quantize_preset(o.preset)) rules.push_back(std::move(r));
  if (o.imatrix.empty()) warn_without_imatrix(rules);
  std::optional<k3::Imatrix> im;
  if (!o.imatrix.empty()) {
    if (rules.empty()) throw k3::Error("--imatrix weights the quantisers: it needs --tensor-type rules or a preset");
    im = k3::read_imatrix(o.imatrix);
  }
  std::optional<uint32_t> ftype;
  if (!o.preset.empty()) ftype = k3::gguf_file_type_of_preset(o.preset);
  const k3::GgufExportStats st =
      k3::add_model_to_gguf(w, cfg, ck, name.empty() ? "k3" : name, rules, im ? &*im : nullptr, ftype);
  if (!o.no_vocab) k3::text::add_tokenizer_to_gguf(w, convert_tokenizer(o, files.gguf), cfg.vocab_size, cfg.bos_token_id >= 0);
  const auto t0 = std::chrono::steady_clock::now();
  int last_pct = -1;
  w.write(o.out, [&](uint64_t done, uint64_t total) {
    const int pct = total ? static_cast<int>(100 * done / total) : 100;
    if (total < (uint64_t{256} << 20) || pct / 5 == last_pct / 5) return;  // small files: just the summary
    last_pct = pct;
    std::fprintf(stderr, "k3: writing: %3d%% (%.2f of %.2f GB)\n", pct, double(done) / 1e9, double(total) / 1e9);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr,
               "wrote %s: %lld tensors (%lld quantised, %lld with imatrix weights, %lld of them a 32-element type (llama-quantize's fallback) for widths not whole "
               "256-blocks), %.2f GB in %.1f s (%lld HF tensors not part of the text model skipped)\n",
               o.out.c_str(), (long long)st.tensors, (long long)st.quantised, (long long)st.with_importance,
               (long long)st.fallbacks, double(w.tensor_bytes()) / 1e9, s, (long long)st.hf_skipped);
  if (!rules.empty()) print_size_table(w);
  return 0;
}

void add_common(CLI::App* cmd, ConvertOpts& o) {
  cmd->add_option("--tokenizer", o.tokenizer, "directory with tiktoken.model (default: the checkpoint's)");
  cmd->add_option("--tensor-type", o.tensor_types,
                  "REGEX=TYPE: write the dense matrices whose GGUF name matches as TYPE (q8_0, q6_k, q5_k, q4_k, q3_k, "
                  "q2_k, iq4_xs, iq3_s, iq3_xxs, iq2_s, iq2_xs, iq2_xxs, iq1_m, iq1_s, the 32-element q5_1, q5_0, q4_1, "
                  "q4_0, iq4_nl, or keep; first match wins; routed experts only by a pattern naming them (_exps), kv_b's halves "
                  "only by one naming attn_k_b / attn_v_b (attn_[kv]_b); "
                  "llama-quantize's flag)")
      ->allow_extra_args(false)  // one rule per flag, brackets and commas included
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);  // repeated like llama-quantize's
  cmd->add_option("--imatrix", o.imatrix, "importance matrix (k3 imatrix / llama-imatrix GGUF) weighting the quantisers");
  cmd->add_option("--load-format", o.load_format,
                  "auto (MODEL's tensors) or dummy (random weights drawn from MODEL's config.json: a GGUF of a real "
                  "model's shapes for benchmarks, as vLLM's --load-format dummy; model/dummy_checkpoint.h)")
      ->check(CLI::IsMember({"auto", "dummy"}))
      ->capture_default_str();
  cmd->add_option("--num-layers", o.num_layers, "with --load-format dummy: keep only the first N layers")
      ->check(CLI::Range(int64_t{1}, int64_t{1000}));
  cmd->add_flag("--no-vocab", o.no_vocab, "write no tokenizer metadata (k3 then needs --tokenizer; llama.cpp cannot load it)");
  add_compute_options(cmd, o.compute);
}

}  // namespace

void add_convert(CLI::App& app, Registry& reg) {
  auto o = std::make_shared<ConvertOpts>();
  auto* cmd = app.add_subcommand("convert", "Write an HF checkpoint as a GGUF (llama.cpp's kimi-k3 / kimi-linear layout)");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory or GGUF file")->required();
  cmd->add_option("-o,--out", o->out, "output .gguf path")->required();
  add_common(cmd, *o);
  cmd->callback([&reg, o] { reg.action = [o] { return run_convert(*o); }; });
}

void add_quantize(CLI::App& app, Registry& reg) {
  auto o = std::make_shared<ConvertOpts>();
  std::string names;
  for (const std::string& n : k3::quantize_preset_names()) names += (names.empty() ? "" : ", ") + n;
  auto* cmd = app.add_subcommand("quantize", "Quantise an HF checkpoint or a GGUF into a GGUF (llama-quantize's arguments and mixes)");
  cmd->add_option("model", o->model, "HF checkpoint directory or GGUF file")->required();
  cmd->add_option("output", o->out, "output .gguf path")->required();
  cmd->add_option("preset", o->preset, "quantisation mix: " + names + " (routed experts stay as shipped except under the -E presets)")->required();
  add_common(cmd, *o);
  cmd->callback([&reg, o] { reg.action = [o] { return run_convert(*o); }; });
}

}  // namespace k3cli
