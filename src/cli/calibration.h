// Text through the model for `k3 perplexity`, `k3 prune` and `k3 imatrix`; calibration runs (prune, imatrix): a text file cut into windows of N tokens, each run
// through the CPU model from an empty state as [BOS] + window (as `k3 perplexity` scores), with an
// activation observer attached, and progress on stderr.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/model/model.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

// A text file's tokens: encode_ordinary, or with `parse_special` special-token text (`<|end_of_msg|>`, a chat
// template's markers) as its ids -- llama-imatrix / llama-perplexity's --parse-special, so that chat-formatted
// calibration text is tokenised as the server tokenises a rendered chat. Read through io/regular_file.h, bounded:
// a FIFO, a device (/dev/zero) or a file over kMaxTextFileBytes is a clear error, not a hang or unbounded memory.
constexpr size_t kMaxTextFileBytes = size_t{1} << 30;
// --parse-special on a verb that reads a text file (imatrix, prune, perplexity).
void add_parse_special_flag(CLI::App* cmd, bool& parse_special);
std::vector<int32_t> read_text_ids(const std::string& path, const k3::text::Tokenizer& tok, bool parse_special = false);

struct CalibrationText {
  std::vector<int32_t> ids;
  int64_t bos = -1, ctx = 512, windows = 0;
};

// Tokenises `file` with the model dir's tokenizer (special-token text as ids with `parse_special`); at most `chunks`
// windows (< 0: all). Throws k3::Error.
CalibrationText read_calibration(const std::string& dir, const k3::Model& model, const std::string& file, int64_t ctx,
                                 int64_t chunks, bool parse_special = false);
// Runs every window with `obs` attached, in the forms `path` picks (k3 imatrix: AttnPath::Decode, so that the
// absorbed MLA form shows kv_b's per-head inputs); returns the tokens run (BOS included).
int64_t run_calibration(k3::Model& model, const CalibrationText& text, k3::cpu::ActivationObserver& obs,
                        k3::AttnPath path = k3::AttnPath::Auto);

}  // namespace k3cli
