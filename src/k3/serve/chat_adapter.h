// The seam between the HTTP layer and chat formatting / output parsing.
//
// The server never formats chat prompts or interprets model output itself; it goes through a
// ChatAdapter:
//   * render(request)       : the whole /v1/chat/completions request body (messages, tools,
//                             tool_choice, reasoning_effort, chat_template_kwargs, ...) -> prompt
//                             token ids, BOS and generation prompt included. Throws k3::Error for
//                             requests it cannot format (the server answers 400, param "messages").
//   * make_parser(request, choice_id) : one ChatOutputParser per choice (choice_id is unique per
//                             choice of a response, e.g. "chatcmpl-3f2a...-0"); the server feeds it
//                             every OutputPiece of that choice in order, takes the accumulated delta
//                             after each engine step (streamed as one chunk), and calls finish()
//                             once at the end to flush anything held back (chat_step below).
// The implementation is model_chat_adapter.h (k3::text::ChatFormat + k3::text::OutputParser).
// Streamed and non-streamed responses are both assembled from the same chat_step() deltas, so
// they carry identical content / reasoning_content / tool_calls.
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "k3/engine/engine_api.h"
#include "k3/text/tokenizer.h"

namespace k3::serve {

// One tool call fragment of a streamed delta (OpenAI delta.tool_calls[i]). id/name are sent once,
// in the first fragment of a call; arguments arrive in pieces that concatenate to a JSON string.
struct ToolCallDelta {
  int index = 0;
  std::string id, name, arguments;
};

struct ChatDelta {
  std::string reasoning_content, content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
  void append(ChatDelta&& d);  // concatenates (tool call fragments are appended in order)
};

class ChatOutputParser {
 public:
  virtual ~ChatOutputParser() = default;
  virtual void feed(const engine::OutputPiece& piece) = 0;
  // What was parsed since the last take_delta() (may be empty while a marker is held back).
  virtual ChatDelta take_delta() = 0;
  // End of output: everything still held back.
  virtual ChatDelta finish() = 0;
};

class ChatAdapter {
 public:
  virtual ~ChatAdapter() = default;
  // Thread-safe (called concurrently from the server's I/O threads).
  virtual std::vector<int32_t> render(const nlohmann::json& request) const = 0;
  virtual std::unique_ptr<ChatOutputParser> make_parser(const nlohmann::json& request,
                                                        const std::string& choice_id) const = 0;
  // Structured outputs: the format (xgrammar structural-tag JSON) the whole assistant output must follow,
  // given `body` (the answer's format, or null) and the request's strict tools / tool_choice; null when
  // nothing is constrained. The default has no chat markers: the body alone. Throws k3::Error naming the field.
  virtual nlohmann::json output_format(const nlohmann::json& request, const nlohmann::json& body) const {
    (void)request;
    return body;
  }
  // Extra stop token ids for chat requests (e.g. end-of-turn markers); default none.
  virtual std::vector<int32_t> stop_token_ids() const { return {}; }
};

// One engine step of one choice: feeds `pieces` in order and returns the delta to stream (with
// finish()'s remainder appended when `finished`). Used by the server for both response modes.
ChatDelta chat_step(ChatOutputParser& parser, const std::vector<engine::OutputPiece>& pieces, bool finished);

// Text of an OpenAI message "content": a string, null, or a list of {"type":"text","text":...}
// parts (concatenated). Throws k3::Error for other shapes.
std::string message_text(const nlohmann::json& content);

}  // namespace k3::serve
