// Single-sequence generation: prefill the prompt, then sample token by token with stop tokens, stop
// strings and max_tokens, streaming text that is always valid UTF-8. The path of `k3 run`; the
// server's continuous-batching engine will reuse Sampler / StopMatcher / StreamDecoder per request.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/sampling_params.h"
#include "k3/model/model_runner.h"
#include "k3/text/tokenizer.h"

namespace k3::engine {

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (a stop token is not included)
  std::string text;             // emitted text (a matched stop string is not included)
  std::string finish_reason;    // "stop" (eos, stop token or stop string) | "length"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
};

struct GenerateOptions {
  int64_t prefill_chunk = 512;    // prompt tokens per forward call (bounds activation memory)
  uint64_t default_seed = 0;      // used when params.seed is unset
};

GenerateResult generate(const ModelRunner& model, const text::Tokenizer& tok, std::span<const int32_t> prompt,
                        const SamplingParams& params, const std::function<void(std::string_view)>& on_text,
                        const GenerateOptions& opt = {});

}  // namespace k3::engine
