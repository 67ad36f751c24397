// OpenAI chat-completion request structures (the parts that shape the prompt), parsed from JSON
// with k3::Error messages that name the offending field ("messages[2].tool_calls[0].function.name").
//
// Key order matters for the K2 format (tools are rendered with json.dumps, insertion order), so the
// raw tool declarations and object-valued tool arguments are kept as nlohmann::ordered_json. Parse
// the HTTP body with nlohmann::ordered_json to preserve the client's order; the nlohmann::json
// overload works but its objects are already key-sorted.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace k3::text {

struct ChatToolCall {
  std::string id;    // may be empty
  std::string type = "function";
  std::string name;
  // OpenAI sends arguments as a JSON *string*; that is kept verbatim in `arguments`. A client may
  // also send an object: then arguments_json holds it (and `arguments` is its compact dump).
  std::string arguments;
  std::optional<nlohmann::ordered_json> arguments_json;
};

struct ChatMessage {
  // "system" | "user" | "assistant" | "tool". "developer" is accepted and stored as "system"
  // (original_role keeps "developer").
  std::string role;
  std::string original_role;
  // Text content: a string, or the concatenation of the text parts of an array. nullopt when the
  // content is null or absent.
  std::optional<std::string> content;
  std::optional<std::string> name;
  std::optional<std::string> reasoning_content;  // assistant only ("reasoning" is accepted too)
  std::vector<ChatToolCall> tool_calls;          // assistant only
  std::optional<std::string> tool_call_id;       // tool only
  // Kimi K3 extension: a system message carrying "tools" declares tools dynamically.
  std::optional<nlohmann::ordered_json> tools;
};

struct ChatToolDef {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // null when absent
};

struct ToolChoice {
  enum class Mode { Auto, None, Required, Function };
  Mode mode = Mode::Auto;
  bool specified = false;     // false: absent from the request
  std::string function_name;  // Mode::Function
};

struct ChatRequest {
  std::vector<ChatMessage> messages;
  std::vector<ChatToolDef> tools;
  nlohmann::ordered_json tools_json = nlohmann::ordered_json::array();  // the raw "tools" array
  ToolChoice tool_choice;
  std::optional<std::string> reasoning_effort;  // "low" | "medium" | "high"
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();

  // Parses the prompt-shaping fields of a /v1/chat/completions body; other fields are ignored.
  // Throws k3::Error naming the field for anything malformed or unsupported (e.g. image parts).
  static ChatRequest from_json(const nlohmann::ordered_json& body);
  static ChatRequest from_json(const nlohmann::json& body);

  // chat_template_kwargs.thinking (bool); `def` when absent or null.
  bool thinking(bool def = true) const;
};

}  // namespace k3::text
