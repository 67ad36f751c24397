// Structured outputs of a request (docs/serving.md "Structured outputs"): the fields that ask for one --
// OpenAI's response_format, vLLM's structured_outputs and older guided_*, llama.cpp's grammar / json_schema --
// read into one format object in xgrammar's structural-tag language, and the chat formats' envelopes
// around it (K3 XTML channels and tool-call section, K2 tool-call section), so that a grammar constrains
// exactly the answer (and each strict tool call's arguments) while the markers stay the model's own tokens.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "k3/text/chat_format.h"
#include "k3/text/chat_messages.h"

namespace k3::serve {

// Whitespace runs inside constrained JSON (a weak model could otherwise fill its budget with spaces).
inline constexpr int kJsonMaxWhitespace = 2;

// The body's format requested by `b` (a structural-tag format object), or null when nothing constrains
// the body. `param` is set to the field it came from. Throws ApiError (400, naming the field) for a
// malformed value or for more than one such field.
nlohmann::json requested_body_format(const nlohmann::json& b, std::string& param);

// The whole assistant output of a chat request in `fmt`, as a structural-tag format: the reasoning channel
// (free; K3 when the prompt leaves the model in it), the answer (`body`, or free text when null), and the
// tool-call section when tools are constrained -- strict tools' arguments by their schema, the names
// restricted to the declared tools, required for tool_choice "required" / a named function, absent for
// "none"; exactly one call when !parallel_calls (parallel_tool_calls: false). Null when nothing is
// constrained (no body, no strict tool, tool_choice auto / none, parallel calls allowed).
// `special_ids`: every special id of the tokenizer (kept out of free text). Throws k3::Error naming the field.
nlohmann::json chat_output_format(const text::ChatFormat& fmt, const text::ChatRequest& req,
                                  const nlohmann::json& body, const std::vector<int32_t>& special_ids,
                                  bool parallel_calls = true);

}  // namespace k3::serve
