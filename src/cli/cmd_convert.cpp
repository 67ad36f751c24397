// `k3 convert -m HF_DIR -o OUT.gguf [--tokenizer DIR]`: an HF checkpoint as the GGUF llama.cpp's converter
// writes for kimi-k3 / kimi-linear (model/gguf_export.h), stored types kept; readable by k3 and llama.cpp.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cli/commands.h"
#include "k3/text/gguf_vocab.h"
#include "k3/core/error.h"
#include "k3/io/safetensors.h"
#include "k3/model/config.h"
#include "k3/model/gguf_export.h"
#include "k3/model/imatrix.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

void add_convert(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, out, tokenizer;
    std::vector<std::string> tensor_types;
    std::string imatrix;
    bool no_vocab = false;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("convert", "Write an HF checkpoint as a GGUF (llama.cpp's kimi-k3 / kimi-linear layout)");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory")->required();
  cmd->add_option("-o,--out", o->out, "output .gguf path")->required();
  cmd->add_option("--tokenizer", o->tokenizer, "directory with tiktoken.model (default: the checkpoint's)");
  cmd->add_option("--tensor-type", o->tensor_types,
                  "REGEX=TYPE: write the dense matrices whose GGUF name matches quantised to TYPE (q8_0, q6_k, q5_k, q4_k, "
                  "q3_k, q2_k, iq4_xs; first match wins; llama-quantize's flag)");
  cmd->add_option("--imatrix", o->imatrix, "importance matrix (k3 imatrix / llama-imatrix GGUF) weighting the quantisers");
  cmd->add_flag("--no-vocab", o->no_vocab, "write no tokenizer metadata (k3 then needs --tokenizer; llama.cpp cannot load it)");
  cmd->callback([&reg, o] {
    reg.action = [o] {
      namespace fs = std::filesystem;
      const k3::ModelConfig cfg = k3::load_model_config(o->model);
      const k3::Checkpoint ck(o->model);
      k3::GgufWriter w;
      const std::string name = fs::path(o->model).lexically_normal().filename().string();
      std::vector<k3::TensorTypeRule> rules;
      for (const std::string& r : o->tensor_types) rules.push_back(k3::parse_tensor_type_rule(r));
      std::optional<k3::Imatrix> im;
      if (!o->imatrix.empty()) {
        if (rules.empty()) throw k3::Error("--imatrix weights the quantisers: it needs --tensor-type rules");
        im = k3::read_imatrix(o->imatrix);
      }
      const k3::GgufExportStats st = k3::add_model_to_gguf(w, cfg, ck, name.empty() ? "k3" : name, rules, im ? &*im : nullptr);
      const std::string tok_dir = o->tokenizer.empty() ? o->model : o->tokenizer;
      std::error_code ec;
      if (!o->no_vocab) {
        if (!fs::exists(fs::path(tok_dir) / "tiktoken.model", ec))
          throw k3::Error("'" + tok_dir + "' has no tiktoken.model: pass --tokenizer DIR, or --no-vocab to write "
                          "no tokenizer metadata");
        k3::text::add_tokenizer_to_gguf(w, k3::text::Tokenizer::load(tok_dir), cfg.vocab_size, cfg.bos_token_id >= 0);
      }
      const auto t0 = std::chrono::steady_clock::now();
      int last_pct = -1;
      w.write(o->out, [&](uint64_t done, uint64_t total) {
        const int pct = total ? static_cast<int>(100 * done / total) : 100;
        if (total < (uint64_t{256} << 20) || pct / 5 == last_pct / 5) return;  // small files: just the summary
        last_pct = pct;
        std::fprintf(stderr, "k3: convert: %3d%% (%.2f of %.2f GB)\n", pct, double(done) / 1e9, double(total) / 1e9);
      });
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "wrote %s: %lld tensors (%lld quantised, %lld with imatrix weights, %lld of them Q8_0 for widths not whole 256-blocks), %.2f GB in %.1f s (%lld HF tensors not part of the text model skipped)\n",
                   o->out.c_str(), (long long)st.tensors, (long long)st.quantised, (long long)st.with_importance, (long long)st.fallbacks, double(w.tensor_bytes()) / 1e9, s,
                   (long long)st.hf_skipped);
      return 0;
    };
  });
}

}  // namespace k3cli
