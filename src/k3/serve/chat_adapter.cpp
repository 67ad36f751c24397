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
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
        throw Error("only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
      out += part["text"].get<std::string>();
    }
    return out;
  }
  throw Error("message content must be a string, null or a list of text parts");
}

namespace {

class PassThroughParser final : public ChatOutputParser {
 public:
  void feed(const engine::OutputPiece& piece) override {
    if (piece.special_id < 0) pending_ += piece.text;
  }
  ChatDelta take_delta() override {
    ChatDelta d;
    d.content.swap(pending_);
    return d;
  }
  ChatDelta finish() override { return take_delta(); }

 private:
  std::string pending_;
};

class DefaultChatAdapter final : public ChatAdapter {
 public:
  DefaultChatAdapter(const text::Tokenizer& tok, int32_t bos) : tok_(tok), bos_(bos) {}

  std::vector<int32_t> render(const nlohmann::json& request) const override {
    const auto& msgs = request.at("messages");
    std::string text;
    for (const auto& m : msgs) {
      text += m.at("role").get<std::string>();
      text += ": ";
      text += message_text(m.contains("content") ? m["content"] : nlohmann::json());
      text += "\n";
    }
    text += "assistant:";
    std::vector<int32_t> ids;
    if (bos_ >= 0) ids.push_back(bos_);
    tok_.encode_ordinary(text, ids);
    return ids;
  }

  std::unique_ptr<ChatOutputParser> make_parser(const nlohmann::json&) const override {
    return std::make_unique<PassThroughParser>();
  }

 private:
  const text::Tokenizer& tok_;
  int32_t bos_;
};

}  // namespace

std::unique_ptr<ChatAdapter> make_default_chat_adapter(const text::Tokenizer& tok, int32_t bos) {
  return std::make_unique<DefaultChatAdapter>(tok, bos);
}

}  // namespace k3::serve
