#include "k3/serve/model_chat_adapter.h"

#include <algorithm>

#include "k3/core/error.h"
#include "k3/serve/structured_output.h"
#include "k3/text/chat_messages.h"
#include "k3/text/output_parser.h"

namespace k3::serve {

namespace {

using text::ChatFormat;
using text::ChatRequest;
using text::ToolChoice;

// Tool names the request declares: `tools` plus (K3 extension) system messages carrying "tools".
bool declares_tool(const ChatRequest& req, const std::string& name, bool* any) {
  bool found = false;
  auto scan = [&](const nlohmann::ordered_json& arr) {
    if (!arr.is_array()) return;
    for (const auto& t : arr) {
      *any = true;
      if (t.is_object() && t.contains("function") && t["function"].is_object() &&
          t["function"].value("name", "") == name)
        found = true;
    }
  };
  for (const auto& t : req.tools) {
    *any = true;
    if (t.name == name) found = true;
  }
  for (const auto& m : req.messages)
    if (m.tools) scan(*m.tools);
  return found;
}

// vLLM's checks: tool_choice "required" / a named function needs declared tools, and a named
// function must be one of them. Errors name the field ("chat request: tool_choice: ...").
void check_tool_choice(const ChatRequest& req) {
  const auto& tc = req.tool_choice;
  if (!tc.specified || (tc.mode != ToolChoice::Mode::Required && tc.mode != ToolChoice::Mode::Function)) return;
  bool any = false;
  const bool found = declares_tool(req, tc.function_name, &any);
  if (!any)
    throw Error(std::string("chat request: tool_choice: '") +
                (tc.mode == ToolChoice::Mode::Required ? "required" : "function") + "' requires 'tools'");
  if (tc.mode == ToolChoice::Mode::Function && !found)
    throw Error("chat request: tool_choice.function.name: tool '" + tc.function_name + "' is not declared in 'tools'");
}

ToolCallDelta to_serve(text::ToolCallDelta&& t) {
  ToolCallDelta o;
  o.index = t.index;
  o.id = std::move(t.id);
  o.name = std::move(t.name);
  o.arguments = std::move(t.arguments);
  return o;
}

class ModelChatParser final : public ChatOutputParser {
 public:
  ModelChatParser(const ChatFormat& fmt, text::OutputParserOptions opts, bool drop_tool_calls)
      : p_(fmt, std::move(opts)), drop_tool_calls_(drop_tool_calls) {}

  void feed(const engine::OutputPiece& piece) override { p_.feed(piece); }
  ChatDelta take_delta() override { return convert(p_.take_delta()); }
  ChatDelta finish() override {
    p_.finish();
    return take_delta();
  }

 private:
  ChatDelta convert(text::ParserDelta&& d) {
    ChatDelta out;
    out.reasoning_content = std::move(d.reasoning_content);
    out.content = std::move(d.content);
    if (!drop_tool_calls_)
      for (auto& t : d.tool_calls) out.tool_calls.push_back(to_serve(std::move(t)));
    return out;
  }

  text::OutputParser p_;
  bool drop_tool_calls_;
};

class ModelChatAdapter final : public ChatAdapter {
 public:
  ModelChatAdapter(ChatFormat fmt, const text::Tokenizer& tok, ModelChatAdapterOptions opts)
      : fmt_(std::move(fmt)), tok_(tok), bos_(opts.bos) {
    stop_ = fmt_.stop_token_ids();
    for (int32_t id : opts.extra_stop)
      if (id >= 0 && std::find(stop_.begin(), stop_.end(), id) == stop_.end()) stop_.push_back(id);
    for (int32_t id = tok.n_ranks(); id < tok.n_vocab(); ++id) specials_.push_back(id);
  }

  nlohmann::json output_format(const nlohmann::json& body, const nlohmann::json& answer) const override {
    const ChatRequest req = ChatRequest::from_json(body);  // render() already validated it
    // parallel_tool_calls (OpenAI, default true; type-checked by the API layer): false -> at most one call.
    const bool parallel = !(body.contains("parallel_tool_calls") && body["parallel_tool_calls"].is_boolean() &&
                            !body["parallel_tool_calls"].get<bool>());
    return chat_output_format(fmt_, req, answer, specials_, parallel);
  }

  std::vector<int32_t> render(const nlohmann::json& body) const override {
    const ChatRequest req = ChatRequest::from_json(body);
    check_tool_choice(req);
    std::vector<int32_t> ids;
    if (bos_ >= 0) ids.push_back(bos_);
    const auto p = fmt_.render(req, tok_, /*add_generation_prompt=*/true);
    ids.insert(ids.end(), p.begin(), p.end());
    return ids;
  }

  std::unique_ptr<ChatOutputParser> make_parser(const nlohmann::json& body, const std::string& choice_id) const override {
    const ChatRequest req = ChatRequest::from_json(body);  // render() already validated it
    text::OutputParserOptions o;
    o.start_in_reasoning = fmt_.generation_starts_in_reasoning(req);
    // "chatcmpl-<hex>-<choice>" -> "call_<hex>-<choice>_": tool-call ids unique across requests.
    std::string suffix = choice_id;
    if (const auto dash = suffix.find('-'); dash != std::string::npos && suffix.rfind("chatcmpl-", 0) == 0)
      suffix = suffix.substr(dash + 1);
    o.call_id_prefix = "call_" + suffix + "_";
    // No tool calls are extracted when tool_choice is "none" or when the request declares no tools
    // (OpenAI semantics: without tools there are no tool_calls); a call the model writes anyway is dropped.
    bool any_tools = false;
    declares_tool(req, "", &any_tools);
    const bool none = !any_tools || (req.tool_choice.specified && req.tool_choice.mode == ToolChoice::Mode::None);
    return std::make_unique<ModelChatParser>(fmt_, std::move(o), none);
  }

  std::vector<int32_t> stop_token_ids() const override { return stop_; }

 private:
  ChatFormat fmt_;
  const text::Tokenizer& tok_;
  int32_t bos_;
  std::vector<int32_t> stop_;
  std::vector<int32_t> specials_;  // kept out of free text under a grammar
};

}  // namespace

std::unique_ptr<ChatAdapter> make_model_chat_adapter(const std::string& model_type, const text::Tokenizer& tok,
                                                     ModelChatAdapterOptions opts) {
  return std::make_unique<ModelChatAdapter>(ChatFormat::for_model_type(model_type, tok), tok, std::move(opts));
}

std::unique_ptr<ChatAdapter> make_model_chat_adapter(text::ChatFormatKind kind, const text::Tokenizer& tok,
                                                     ModelChatAdapterOptions opts) {
  return std::make_unique<ModelChatAdapter>(ChatFormat(kind, tok), tok, std::move(opts));
}

}  // namespace k3::serve
