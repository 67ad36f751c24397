// Calibration runs shared by `k3 prune` and `k3 imatrix`: a text file cut into windows of N tokens, each run
// through the CPU model from an empty state as [BOS] + window (as `k3 perplexity` scores), with an
// activation observer attached, and progress on stderr.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "k3/backend/cpu/cpu_backend.h"
#include "k3/model/model.h"

namespace k3cli {

struct CalibrationText {
  std::vector<int32_t> ids;
  int64_t bos = -1, ctx = 512, windows = 0;
};

// Tokenises `file` with the model dir's tokenizer; at most `chunks` windows (< 0: all). Throws k3::Error.
CalibrationText read_calibration(const std::string& dir, const k3::Model& model, const std::string& file, int64_t ctx,
                                 int64_t chunks);
// Runs every window with `obs` attached; returns the tokens run (BOS included).
int64_t run_calibration(k3::Model& model, const CalibrationText& text, k3::cpu::ActivationObserver& obs);

}  // namespace k3cli
