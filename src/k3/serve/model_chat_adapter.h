// The real chat adapter of `k3 serve`: OpenAI chat requests rendered with the model's chat format
// (k3::text::ChatFormat: Kimi K3 XTML for model_type kimi_k3, K2 for kimi_linear / kimi_k2) and
// model output parsed by k3::text::OutputParser into reasoning_content / content / tool_calls.
// Behaviour (tool_choice, reasoning, stop tokens): docs/serving.md, "Chat formats".
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "k3/serve/chat_adapter.h"
#include "k3/text/chat_format.h"
#include "k3/text/tokenizer.h"

namespace k3::serve {

struct ModelChatAdapterOptions {
  int32_t bos = -1;                  // prepended to every prompt when >= 0 (the model's bos_token_id)
  std::vector<int32_t> extra_stop;   // stop ids besides the format's end-of-turn marker (config eos)
};

// `model_type`: config.json's model_type (ChatFormat::for_model_type). Throws k3::Error when the
// tokenizer lacks the format's control markers or the model type has no chat format.
// `tok` must outlive the adapter.
std::unique_ptr<ChatAdapter> make_model_chat_adapter(const std::string& model_type, const text::Tokenizer& tok,
                                                     ModelChatAdapterOptions opts = {});
std::unique_ptr<ChatAdapter> make_model_chat_adapter(text::ChatFormatKind kind, const text::Tokenizer& tok,
                                                     ModelChatAdapterOptions opts = {});

}  // namespace k3::serve
