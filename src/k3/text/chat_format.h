// Chat formats: OpenAI chat requests -> prompt token ids, for Kimi K3 ("XTML") and the K2 /
// Kimi-Linear format. The rendered text is byte-identical to the reference Jinja templates
// (../shared/data/chat-templates/Kimi-K3.jinja, Kimi-K2-Instruct.jinja), checked against goldens
// rendered by python/gen_chat_goldens.py; see docs/chat-format.md.
//
// Token ids: control markers are emitted as special token ids (looked up by name; a tokenizer
// without them is a k3::Error at construction), and every text run between two markers -- template
// text and user/system/tool/assistant text alike -- is encoded with allow_special=false, so marker
// strings typed by a user stay plain text. For text without marker strings the ids equal
// tokenizer.encode(render_text(...), /*allow_special=*/true).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "k3/text/chat_messages.h"
#include "k3/text/tokenizer.h"

namespace k3::text {

enum class ChatFormatKind { K3Xtml, K2 };

// Special-token ids of the control markers of a format (-1 where the format has none).
struct ChatMarkers {
  // K3 XTML
  int32_t open = -1, close = -1, sep = -1, end_of_msg = -1;
  // K2 / Kimi-Linear
  int32_t im_end = -1, im_user = -1, im_assistant = -1, im_system = -1, im_middle = -1;
  int32_t section_begin = -1, section_end = -1, call_begin = -1, argument_begin = -1, call_end = -1;
};

class ChatFormat {
 public:
  // Resolves the format's control markers in `tok`; throws k3::Error naming a missing one.
  ChatFormat(ChatFormatKind kind, const Tokenizer& tok);
  // From config.json's model_type: "kimi_k3" -> K3Xtml; "kimi_linear", "kimi_k2", "deepseek_v3" -> K2.
  static ChatFormat for_model_type(const std::string& model_type, const Tokenizer& tok);
  // Explicit choice by name: "k3" | "xtml" | "kimi_k3" -> K3Xtml; "k2" | "kimi_linear" | "kimi_k2" -> K2.
  static ChatFormatKind kind_from_name(const std::string& name);

  ChatFormatKind kind() const { return kind_; }
  const char* name() const { return kind_ == ChatFormatKind::K3Xtml ? "k3-xtml" : "k2"; }
  const ChatMarkers& markers() const { return m_; }

  // Prompt token ids (no BOS: neither template adds one).
  std::vector<int32_t> render(const ChatRequest& req, const Tokenizer& tok, bool add_generation_prompt) const;
  // The same prompt as text (special markers spelled out), equal to the Jinja template's output.
  std::string render_text(const ChatRequest& req, bool add_generation_prompt) const;

  // Tokens that end the assistant turn: K3 <|end_of_msg|>, K2 <|im_end|>.
  std::vector<int32_t> stop_token_ids() const;
  // Whether the generation prompt leaves the model inside its reasoning channel (K3 with thinking
  // on: the prompt ends with <|open|>think<|sep|>). Feed this to OutputParserOptions.
  bool generation_starts_in_reasoning(const ChatRequest& req) const;
  // K3: the thinking_effort the template sees ("low" | "high" | "max"), "" for none.
  // chat_template_kwargs.thinking_effort wins; else reasoning_effort low->low, medium->high,
  // high->high; else the template default "max".
  static std::string thinking_effort(const ChatRequest& req);

 private:
  ChatFormatKind kind_;
  ChatMarkers m_;
};

// Python json.dumps(value, ensure_ascii=False) (separators ", " and ": ", key order kept): what the
// templates' tojson filter produces under transformers' apply_chat_template.
std::string py_json_dumps(const nlohmann::ordered_json& value);
// The K3 template's json_sorted macro: compact, object keys sorted case-insensitively (stable).
std::string json_sorted(const nlohmann::ordered_json& value);
// An XTML attribute value as the K3 template writes it (`&` and `"` escaped): the renderer's tool names
// and the structured-output grammar's tool-call prefix must agree byte for byte.
std::string escape_attr(const std::string& v);

}  // namespace k3::text
