// The OpenAI request parser: any bytes as a request body, on both endpoints, either become a valid
// GenRequest or throw ApiError (a 4xx). Anything else -- another exception type, a crash, UB under the
// sanitizers -- is a bug. Also renders the response of a parsed request (the estimate's per-token bound
// holds for what build_response_body writes).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "k3/serve/model_chat_adapter.h"
#include "k3/serve/openai_api.h"
#include "k3/text/tokenizer.h"

namespace {

struct Ctx {
  k3::text::Tokenizer tok = k3::text::Tokenizer::load(std::string(K3_SOURCE_DIR) + "/tests/data/tiny-tokenizer");
  std::unique_ptr<k3::serve::ChatAdapter> chat =
      k3::serve::make_model_chat_adapter("kimi_k3", tok, k3::serve::ModelChatAdapterOptions{768, {770}});
  k3::serve::ApiContext api;
  Ctx() {
    api.model_name = "tiny";
    api.tok = &tok;
    api.chat = chat.get();
    api.bos = 768;
    api.max_model_len = 4096;
    api.vocab_size = 1024;
    api.max_response_bytes = 1 << 20;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Ctx ctx;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (auto ep : {k3::serve::Endpoint::Chat, k3::serve::Endpoint::Completions}) {
    try {
      const nlohmann::json j = k3::serve::parse_json_body(body);
      const k3::serve::GenRequest r = k3::serve::parse_generation_request(ep, j, ctx.api);
      // What the engine is then given must satisfy its own checks.
      r.params.validate();
      if (r.n < 1 || r.n > ctx.api.max_n || r.top_logprobs > k3::serve::kMaxTopLogprobs) __builtin_trap();
      if (r.prompt.empty() || static_cast<int64_t>(r.prompt.size()) + r.params.max_tokens > ctx.api.max_model_len)
        __builtin_trap();
      std::vector<k3::serve::ChoiceState> choices(static_cast<size_t>(r.n));
      (void)k3::serve::build_response_body(ep, r, "id", 1, choices, {}, ctx.tok);
    } catch (const k3::serve::ApiError& e) {
      if (e.status < 400 || e.status > 499) __builtin_trap();
    }
  }
  return 0;
}
