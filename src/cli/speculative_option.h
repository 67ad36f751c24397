// --speculative-config (vLLM's flag) for the verbs that generate: `k3 serve`, `k3 run`, `k3 bench offline`.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>

#include "cli/model_loader.h"
#include "k3/engine/engine_api.h"
#include "k3/engine/speculative_config.h"
#include "k3/model/drafter/block_drafter.h"

namespace k3cli {

// Method "draft_model": the draft model (its "model" directory) loaded as the target is (the same
// --device, placement and cache dtypes); null for other methods or none.
std::unique_ptr<k3::ModelRunner> load_draft_model(const std::optional<k3::engine::SpeculativeConfig>& spec,
                                                  const DeviceOptions& dev);

// Method "block_drafter": the drafter (its "model" directory) for the target whose files are at
// `target_path` (the drafter maps the target's embedding and lm_head itself), run on the target's
// --device (CUDA: its own stream on that GPU, sharing the loaded `target`'s device copies of those two
// matrices); null for other methods. `target` must outlive the drafter.
std::unique_ptr<k3::drafter::BlockDrafter> load_block_drafter(const std::optional<k3::engine::SpeculativeConfig>& spec,
                                                             const std::string& target_path, const DeviceOptions& dev,
                                                             const k3::ModelRunner& target);

// Adds --speculative-config JSON (parsed by engine::parse_speculative_config when the verb runs).
void add_speculative_option(CLI::App* cmd, std::string& json);
// "1234 drafts, 4936 draft tokens, 2900 accepted (58.8%), mean acceptance length 3.35" (vLLM's
// definitions: acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts).
std::string spec_decode_summary(const k3::engine::EngineStats& st);

}  // namespace k3cli
