// --speculative-config (vLLM's flag) for the verbs that generate: `k3 serve`, `k3 run`, `k3 bench offline`.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "k3/engine/engine_api.h"

namespace k3cli {

// Adds --speculative-config JSON (parsed by engine::parse_speculative_config when the verb runs).
void add_speculative_option(CLI::App* cmd, std::string& json);
// "1234 drafts, 4936 draft tokens, 2900 accepted (58.8%), mean acceptance length 3.35" (vLLM's
// definitions: acceptance rate = accepted / draft tokens, mean acceptance length = 1 + accepted / drafts).
std::string spec_decode_summary(const k3::engine::EngineStats& st);

}  // namespace k3cli
