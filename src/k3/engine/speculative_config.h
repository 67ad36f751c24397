// --speculative-config, as vLLM spells it: a JSON object
//   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
//   {"method": "draft_model", "model": "DIR", "num_speculative_tokens": 4}   ("method" may be left out)
//   {"method": "block_drafter", "model": "DIR", "num_speculative_tokens": 4}  (alias "dspark"; DIR: a
//   K3BlockDrafter made for the target, docs/block-drafter.md; k <= its block_size)
// Defaults follow vLLM: with neither lookup bound given both are 5; with one given, the other equals it.
// One key of k3's own: "rollback", how rejected drafts leave the KDA state (docs/perf/speculative.md):
// "snapshots" (default; the state after every draft position is kept, k extra state slots per sequence)
// or "replay" (one snapshot before the drafts; the accepted drafts run again at the head of the next step).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace k3::engine {

struct SpeculativeConfig {
  std::string method;  // "ngram", "draft_model" or "block_drafter"
  std::string model;   // draft_model: the draft model's directory (same tokenizer as the target); block_drafter: the drafter's
  int64_t num_speculative_tokens = 0;  // k: draft tokens verified per step, 1..kMaxSpeculativeTokens
  int64_t prompt_lookup_min = 5, prompt_lookup_max = 5;
  enum class Rollback { Snapshots, Replay } rollback = Rollback::Snapshots;
  // Extra KDA state slots each running sequence needs (HybridCache's state_snapshots).
  int64_t state_slots() const { return rollback == Rollback::Snapshots ? num_speculative_tokens : 1; }
};

inline constexpr int64_t kMaxSpeculativeTokens = 32;
inline constexpr int64_t kMaxPromptLookup = 64;

// Parses and validates the flag's JSON. Throws k3::Error naming the key and the allowed values (bad
// JSON, unknown key or method, a value out of range). Empty text: nullopt (speculation off).
std::optional<SpeculativeConfig> parse_speculative_config(const std::string& json_text);
// A one-line description for start-up logs and bench output: "ngram k=4 lookup 1..4".
std::string describe(const SpeculativeConfig& c);

}  // namespace k3::engine
