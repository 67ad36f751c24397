// Per-request sampling parameters (OpenAI / vLLM names and conventions). See docs/sampling.md.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace k3::engine {

struct SamplingParams {
  float temperature = 1.0f;          // 0 => greedy (argmax, ties to the lowest id); else >0, finite
  int top_k = 0;                     // 0 or -1 => off; else keep the k most likely (ties at the k-th kept)
  float top_p = 1.0f;                // (0, 1]; 1 => off
  float min_p = 0.0f;                // [0, 1]; 0 => off
  float repetition_penalty = 1.0f;   // > 0; 1 => off (HF/CTRL style, prompt + generated tokens)
  float presence_penalty = 0.0f;     // [-2, 2]; OpenAI, generated tokens only
  float frequency_penalty = 0.0f;    // [-2, 2]; OpenAI, generated tokens only
  std::optional<uint64_t> seed;      // none => the engine-provided default seed
  int max_tokens = 16;               // >= 0 (vLLM's default of 16)
  std::vector<std::string> stop;     // non-empty strings; not emitted when matched
  std::vector<int32_t> stop_token_ids;  // >= 0
  bool ignore_eos = false;
  // OpenAI's logit_bias: added to the id's logit before sampling; ids distinct and >= 0, values in
  // [-100, 100] (-100 in effect bans the id, 100 forces it). Sorted by id.
  std::vector<int32_t> logit_bias_ids;
  std::vector<float> logit_bias_values;

  // Throws k3::Error naming the offending field and its allowed range.
  void validate() const;
};

}  // namespace k3::engine
