// `k3 imatrix -m DIR -f CALIB [-o imatrix.gguf] [--ctx N] [--chunks K]`: an importance matrix over calibration
// text (model/imatrix.h), in llama-imatrix's GGUF format, for `k3 convert --imatrix` and `llama-quantize --imatrix`.
#include <cstdio>
#include <filesystem>

#include "cli/calibration.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cli/compute_options.h"
#include "k3/core/error.h"
#include "k3/model/imatrix.h"
#include "k3/model/model.h"

namespace k3cli {

void add_imatrix(CLI::App& app, Registry& reg) {
  struct Opts {
    std::string model, file, out = "imatrix.gguf";
    int64_t ctx = 512, chunks = -1;
    bool parse_special = false;
    ComputeOptions compute;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("imatrix", "Importance matrix over calibration text (llama-imatrix's GGUF format)");
  cmd->add_option("-m,--model", o->model, "HF checkpoint directory (default: the built-in model)");
  cmd->add_option("-f,--file", o->file, "calibration text (UTF-8; chat-formatted data for chat use)")->required();
  cmd->add_option("-o,--output-file", o->out, "output path")->capture_default_str();
  cmd->add_option("--ctx,-c", o->ctx, "window length in tokens")->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  cmd->add_option("--chunks", o->chunks, "use at most this many windows (default: all)");
  add_parse_special_flag(cmd, o->parse_special);
  add_compute_options(cmd, o->compute);
  cmd->callback([&reg, o] {
    reg.action = [o] {
      apply_compute_options(o->compute);
      const std::string dir = resolve_model_dir(o->model);
      auto model = k3::Model::load(dir);
      const CalibrationText text = read_calibration(dir, *model, o->file, o->ctx, o->chunks, o->parse_special);
      k3::ImatrixCollector col(model->config(), model->weights(), model->checkpoint());
      // The decode forms: kv_b's per-head inputs (llama.cpp's attn_k_b / attn_v_b) exist only in the absorbed MLA form.
      const int64_t ran = run_calibration(*model, text, col, k3::AttnPath::Decode);
      k3::Imatrix& im = col.result();
      im.datasets = {std::filesystem::path(o->file).filename().string()};
      im.chunk_count = text.windows;
      im.chunk_size = o->ctx;
      k3::write_imatrix(im, o->out);
      int64_t partial = 0;
      for (const auto& [name, e] : im.entries)
        for (double c : e.counts) partial += c == 0;
      std::printf("imatrix: %lld tokens in %lld windows, %zu matrices (%lld matrix slots never reached: experts no token "
                  "was routed to), wrote %s\n",
                  (long long)ran, (long long)text.windows, im.entries.size(), (long long)partial, o->out.c_str());
      return 0;
    };
  });
}

}  // namespace k3cli
