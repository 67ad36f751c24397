// The OpenAI request parser: any bytes as a request body, on both endpoints, either become a valid
// GenRequest or throw ApiError (a 4xx). Anything else -- another exception type, a crash, UB under the
// sanitizers -- is a bug. Also renders the response of a parsed request (the estimate's per-token bound
// holds for what build_response_body writes), and /tokenize and /detokenize of the same body.
#include <cstdint>
#include <string_view>
#include <vector>

#include "serve_api_fixture.h"  // tests/unit: the API tests' tokenizer, chat adapter and context (no gtest)

namespace {

// The API tests' context with room for long prompts and a response cap the renderer must respect.
k3::serve::ApiContext fuzz_api_context() {
  k3::serve::ApiContext c = k3test::api_fixture().ctx();
  c.max_model_len = 4096;
  c.max_response_bytes = 1 << 20;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const k3::serve::ApiContext api = fuzz_api_context();
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto ep : {k3::serve::Endpoint::Chat, k3::serve::Endpoint::Completions}) {
    try {
      const nlohmann::json j = k3::serve::parse_json_body(body);
      const k3::serve::GenRequest r = k3::serve::parse_generation_request(ep, j, api);
      // What the engine is then given must satisfy its own checks.
      r.params.validate();
      if (r.n < 1 || r.n > api.max_n || r.top_logprobs > k3::serve::kMaxTopLogprobs) __builtin_trap();
      if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens > api.max_model_len)
        __builtin_trap();
      std::vector<k3::serve::ChoiceState> choices(static_cast<size_t>(r.n));
      (void)k3::serve::build_response_body(ep, r, "id", 1, choices, {}, *api.tok);
    } catch (const k3::serve::ApiError& e) {
      if (e.status < 400 || e.status > 499) __builtin_trap();
    }
  }
  // /tokenize and /detokenize on the same body: a JSON answer whose tokens are in the vocabulary, or a 4xx.
  for (const bool tokenize : {true, false}) {
    try {
      const nlohmann::json j = k3::serve::parse_json_body(body);
      const nlohmann::json r = tokenize ? k3::serve::tokenize_response(j, api) : k3::serve::detokenize_response(j, api);
      if (tokenize && r.at("count").get<size_t>() != r.at("tokens").size()) __builtin_trap();
      (void)k3::serve::dump(r);
    } catch (const k3::serve::ApiError& e) {
      if (e.status < 400 || e.status > 499) __builtin_trap();
    }
  }
  return 0;
}
