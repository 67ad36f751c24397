// --speculative-config parser: any bytes either parse into a validated SpeculativeConfig (k and the lookup
// bounds in range, min <= max) or throw k3::Error.
#include <cstdlib>
#include <string>

#include "k3/core/error.h"
#include "k3/engine/speculative_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto c = k3::engine::parse_speculative_config(std::string(reinterpret_cast<const char*>(data), size));
    if (c && (c->num_speculative_tokens < 1 || c->num_speculative_tokens > k3::engine::kMaxSpeculativeTokens ||
              c->prompt_lookup_min < 1 || c->prompt_lookup_min > c->prompt_lookup_max ||
              c->prompt_lookup_max > k3::engine::kMaxPromptLookup))
      std::abort();  // accepted out of range
  } catch (const k3::Error&) {
  }
  return 0;
}
