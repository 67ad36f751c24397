#include "k3/serve/chat_adapter.h"

#include "k3/core/error.h"

namespace k3::serve {

void ChatDelta::append(ChatDelta&& d) {
  reasoning_content += d.reasoning_content;
  content += d.content;
  for (auto& t : d.tool_calls) tool_calls.push_back(std::move(t));
}

std::string message_text(const nlohmann::json& content) {
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string out;
    for (const auto& part : content) {
      // Compared as JSON, not through value("type", ""): a non-string type threw json::type_error (a 500).
      if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
          !part["text"].is_string())
        throw Error("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw Error("message content must be a string, null or a list of text parts");
}

ChatDelta chat_step(ChatOutputParser& parser, const std::vector<engine::OutputPiece>& pieces, bool finished) {
  for (const auto& p : pieces) parser.feed(p);
  ChatDelta d = parser.take_delta();
  if (finished) d.append(parser.finish());
  return d;
}

}  // namespace k3::serve
