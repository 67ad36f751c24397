// `k3 bench offline --speculative-config JSON`: decode speed with speculative decoding on and off, in the
// same run (alternating repetitions), through the serving engine (drafts depend on the generated text,
// so this cannot run on random tokens as the pp/tg tests do), with the acceptance statistics.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "k3/engine/speculative_config.h"
#include "k3/model/drafter/block_drafter.h"
#include "k3/runtime/model_runner.h"
#include "k3/text/tokenizer.h"

namespace k3cli {

struct SpecBenchOptions {
  k3::engine::SpeculativeConfig spec;
  std::vector<int64_t> batches{1};
  int64_t n_gen = 128;
  int reps = 3;
  const k3::ModelRunner* draft = nullptr;  // method "draft_model": the loaded draft model
  const k3::drafter::BlockDrafter* block_drafter = nullptr;  // method "block_drafter": the loaded drafter
};

// Runs every task (built-in code-like and summary-like prompts, and a chat turn through the model's chat
// format) x batch, greedy, `n_gen` tokens per
// request; decode tok/s = tokens after each request's first / (shortest run time - shortest time of the
// same batch asked for one token) over `reps` alternating off/on repetitions. Prints a markdown table to stdout
// and returns the rows as JSON.
nlohmann::json run_spec_bench(const k3::ModelRunner& model, const k3::text::Tokenizer& tok, const SpecBenchOptions& o);

}  // namespace k3cli
