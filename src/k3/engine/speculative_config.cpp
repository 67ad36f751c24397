#include "k3/engine/speculative_config.h"

#include <nlohmann/json.hpp>

#include "k3/core/error.h"

namespace k3::engine {

namespace {

[[noreturn]] void fail(const std::string& what) { throw Error("--speculative-config: " + what); }

int64_t int_in(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer()) fail(std::string(key) + " must be an integer");
  // Compared as the JSON's own type first (nlohmann keeps every non-negative integer unsigned): a value
  // past int64 must not wrap into range.
  const bool out = v.is_number_unsigned()
                       ? (v.get<uint64_t>() > static_cast<uint64_t>(hi) || v.get<uint64_t>() < static_cast<uint64_t>(lo))
                       : (v.get<int64_t>() < lo || v.get<int64_t>() > hi);
  if (out)
    fail(std::string(key) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return v.get<int64_t>();
}

}  // namespace

std::optional<SpeculativeConfig> parse_speculative_config(const std::string& text) {
  if (text.empty()) return std::nullopt;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    fail("not valid JSON (expected e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}')");
  }
  if (!j.is_object()) fail("expected a JSON object");
  for (const auto& [key, value] : j.items())
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_min" && key != "prompt_lookup_max" &&
        key != "rollback" && key != "model")
      fail("unknown key \"" + key + "\" (known: method, model, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, rollback)");
  SpeculativeConfig c;
  if (j.contains("model") && (!j["model"].is_string() || j["model"].get<std::string>().empty()))
    fail("\"model\" must be a non-empty string (the draft model's or the drafter's directory)");
  if (j.contains("model")) c.model = j["model"].get<std::string>();
  // vLLM: a config naming a model and no method is a draft model.
  if (!j.contains("method") && !c.model.empty()) j["method"] = "draft_model";
  if (!j.contains("method") || !j["method"].is_string()) fail("\"method\" (a string) is required");
  c.method = j["method"].get<std::string>();
  if (c.method == "[ngram]") c.method = "ngram";  // vLLM's alias
  if (c.method == "dspark") c.method = "block_drafter";  // the published drafter of this kind
  if (c.method != "ngram" && c.method != "draft_model" && c.method != "block_drafter")
    fail("method \"" + c.method + "\" is not supported (supported: ngram, draft_model, block_drafter)");
  if (c.method == "draft_model" && c.model.empty()) fail("method \"draft_model\" needs \"model\": the draft model's directory");
  if (c.method == "block_drafter" && c.model.empty())
    fail("method \"block_drafter\" needs \"model\": the drafter's directory (docs/block-drafter.md)");
  if (c.method == "ngram" && !c.model.empty()) fail("\"model\" is for methods \"draft_model\" and \"block_drafter\", not \"ngram\"");
  if (c.method != "ngram" && (j.contains("prompt_lookup_min") || j.contains("prompt_lookup_max")))
    fail("prompt_lookup_min / prompt_lookup_max are for method \"ngram\"");
  if (!j.contains("num_speculative_tokens")) fail("\"num_speculative_tokens\" is required");
  c.num_speculative_tokens = int_in(j, "num_speculative_tokens", 1, kMaxSpeculativeTokens);
  const bool has_min = j.contains("prompt_lookup_min"), has_max = j.contains("prompt_lookup_max");
  if (has_min) c.prompt_lookup_min = int_in(j, "prompt_lookup_min", 1, kMaxPromptLookup);
  if (has_max) c.prompt_lookup_max = int_in(j, "prompt_lookup_max", 1, kMaxPromptLookup);
  if (has_min && !has_max) c.prompt_lookup_max = c.prompt_lookup_min;
  if (has_max && !has_min) c.prompt_lookup_min = c.prompt_lookup_max;
  if (j.contains("rollback")) {
    const nlohmann::json& r = j["rollback"];
    if (r == "snapshots")
      c.rollback = SpeculativeConfig::Rollback::Snapshots;
    else if (r == "replay")
      c.rollback = SpeculativeConfig::Rollback::Replay;
    else
      fail("rollback must be \"snapshots\" or \"replay\"");
  }
  if (c.prompt_lookup_min > c.prompt_lookup_max)
    fail("prompt_lookup_min (" + std::to_string(c.prompt_lookup_min) + ") must be <= prompt_lookup_max (" +
         std::to_string(c.prompt_lookup_max) + ")");
  return c;
}

std::string describe(const SpeculativeConfig& c) {
  const std::string how = c.method == "draft_model"     ? " draft " + c.model
                          : c.method == "block_drafter" ? " drafter " + c.model
                                                        : " lookup " + std::to_string(c.prompt_lookup_min) + ".." +
                                                              std::to_string(c.prompt_lookup_max);
  return c.method + " k=" + std::to_string(c.num_speculative_tokens) + how +
         (c.rollback == SpeculativeConfig::Rollback::Replay ? " rollback replay" : " rollback snapshots");
}

}  // namespace k3::engine
