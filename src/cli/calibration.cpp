#include "cli/calibration.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cli/common.h"
#include "k3/core/error.h"
#include "k3/io/regular_file.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

std::vector<int32_t> read_text_ids(const std::string& path, const k3::text::Tokenizer& tok, bool parse_special) {
  return tok.encode(k3::read_regular_file(path, kMaxTextFileBytes, "text file"), parse_special);
}

void add_parse_special_flag(CLI::App* cmd, bool& parse_special) {
  cmd->add_flag("--parse-special", parse_special, "tokenise special-token text (a chat template's markers) as its ids");
}

CalibrationText read_calibration(const std::string& dir, const k3::Model& model, const std::string& file, int64_t ctx,
                                 int64_t chunks, bool parse_special) {
  auto tok = k3::text::Tokenizer::load(dir);
  check_tokenizer_fits(tok.n_vocab(), model.config().vocab_size);
  CalibrationText t;
  t.ids = read_text_ids(file, tok, parse_special);
  t.bos = model.config().bos_token_id >= 0 ? model.config().bos_token_id : tok.bos_id();
  if (t.bos < 0) throw k3::Error("the model has no BOS token id; calibration windows start with BOS");
  t.ctx = ctx;
  t.windows = (static_cast<int64_t>(t.ids.size()) + ctx - 1) / ctx;
  if (chunks >= 0) t.windows = std::min(t.windows, chunks);
  if (t.windows == 0) throw k3::Error("'" + file + "' holds no tokens to calibrate with");
  return t;
}

int64_t run_calibration(k3::Model& model, const CalibrationText& text, k3::cpu::ActivationObserver& obs,
                        k3::AttnPath path) {
  model.set_activation_observer(&obs);
  k3::ForwardOptions opt;
  opt.path = path;
  std::vector<float> logits;
  std::vector<int32_t> win;
  int64_t ran = 0;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t N = static_cast<int64_t>(text.ids.size());
  try {
    for (int64_t w = 0; w < text.windows; ++w) {
      const int64_t b = w * text.ctx, e = std::min(N, b + text.ctx);
      win.assign(1, static_cast<int32_t>(text.bos));
      win.insert(win.end(), text.ids.begin() + b, text.ids.begin() + e);
      auto st = model.new_cache();
      model.forward(win, *st, logits, opt);
      ran += static_cast<int64_t>(win.size());
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::fprintf(stderr, "\rcalibrating: [%lld/%lld] windows, %lld tokens, %.0f tok/s", (long long)(w + 1),
                   (long long)text.windows, (long long)ran, ran / std::max(secs, 1e-9));
    }
  } catch (...) {
    model.set_activation_observer(nullptr);
    throw;
  }
  std::fprintf(stderr, "\n");
  model.set_activation_observer(nullptr);
  return ran;
}

}  // namespace k3cli
