#include "k3/text/chat_format.h"
#include "k3/text/json_escape.h"

#include <algorithm>
#include <cstdio>
#include <deque>

#include "k3/core/error.h"

namespace k3::text {

namespace {

using ojson = nlohmann::ordered_json;

// ---- JSON helpers (Python json.dumps compatible) ----------------------------------------------

void py_string(const std::string& s, std::string& out) {
  out += '"';
  json_escape_into(s, out);
  out += '"';
}

void py_scalar(const ojson& v, std::string& out) {
  if (v.is_string()) py_string(v.get_ref<const std::string&>(), out);
  else out += v.dump();  // null, true/false, integers; floats in shortest round-trip form like repr()
}

void py_dumps(const ojson& v, std::string& out) {
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += ", ";
      first = false;
      py_string(it.key(), out);
      out += ": ";
      py_dumps(it.value(), out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      py_dumps(v[i], out);
    }
    out += ']';
  } else {
    py_scalar(v, out);
  }
}

std::string ascii_lower(const std::string& s) {
  std::string r = s;
  for (char& c : r)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return r;
}

void json_sorted_impl(const ojson& v, std::string& out) {
  if (v.is_object()) {
    std::vector<std::pair<std::string, const ojson*>> items;
    for (auto it = v.begin(); it != v.end(); ++it) items.emplace_back(it.key(), &it.value());
    // Jinja's dictsort (case_sensitive=False): Python's stable sorted() on key.lower().
    std::stable_sort(items.begin(), items.end(),
                     [](const auto& a, const auto& b) { return ascii_lower(a.first) < ascii_lower(b.first); });
    out += '{';
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += ',';
      py_string(items[i].first, out);
      out += ':';
      json_sorted_impl(*items[i].second, out);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) out += ',';
      json_sorted_impl(v[i], out);
    }
    out += ']';
  } else {
    py_scalar(v, out);
  }
}

// Python str.strip() whitespace: ASCII \t\n\v\f\r, \x1c-\x1f, space, and the Unicode spaces.
size_t ws_len_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  auto at = [&](size_t k) { return i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0; };
  if (c == 0xc2 && (at(1) == 0x85 || at(1) == 0xa0)) return 2;
  if (c == 0xe1 && at(1) == 0x9a && at(2) == 0x80) return 3;  // U+1680
  if (c == 0xe2 && at(1) == 0x80 && ((at(2) >= 0x80 && at(2) <= 0x8a) || at(2) == 0xa8 || at(2) == 0xa9 || at(2) == 0xaf))
    return 3;  // U+2000-200A, U+2028, U+2029, U+202F
  if (c == 0xe2 && at(1) == 0x81 && at(2) == 0x9f) return 3;  // U+205F
  if (c == 0xe3 && at(1) == 0x80 && at(2) == 0x80) return 3;  // U+3000
  return 0;
}

bool py_is_blank(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = ws_len_at(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

// ---- the output sink: text + special markers -> text and/or ids ----------------------------------

class Emitter {
 public:
  Emitter(const Tokenizer* tok, std::vector<int32_t>* ids) : tok_(tok), ids_(ids) {}
  void text(const std::string& s) {
    text_ += s;
    if (ids_) pending_ += s;
  }
  void special(int32_t id, const char* name) {
    flush();
    text_ += name;
    if (ids_) ids_->push_back(id);
  }
  void flush() {
    if (ids_ && !pending_.empty()) {
      tok_->encode_ordinary(pending_, *ids_);
      pending_.clear();
    }
  }
  std::string& out_text() { return text_; }

 private:
  const Tokenizer* tok_;
  std::vector<int32_t>* ids_;
  std::string text_, pending_;
};

int32_t lookup(const Tokenizer& tok, const char* name, const char* fmt) {
  auto id = tok.token_id(name);
  if (!id)
    throw Error(std::string("chat format ") + fmt + ": the tokenizer has no special token " + name +
                " (wrong tokenizer_config.json for this model?)");
  return *id;
}

// ---- K3 XTML ------------------------------------------------------------------------------------

constexpr const char* kOpen = "<|open|>";
constexpr const char* kClose = "<|close|>";
constexpr const char* kSep = "<|sep|>";
constexpr const char* kEom = "<|end_of_msg|>";

class K3Renderer {
 public:
  K3Renderer(const ChatMarkers& m, Emitter& e) : m_(m), e_(e) {}

  void render(const ChatRequest& req, bool agp) {
    const bool thinking = req.thinking(true);
    if (!req.tools_json.empty()) tool_declare(req.tools_json, false);
    const std::string effort = ChatFormat::thinking_effort(req);
    if (thinking && !effort.empty())
      internal_system_message(
          "thinking-effort",
          "`thinking_effort` guides on how much to think in your thinking channel (not including the response "
          "channel), supported values include `low`, `medium`, `high`, and `max`.\nNow the system is invoked with "
          "`thinking_effort=" + effort + "`.");

    const auto& msgs = req.messages;
    for (size_t i = 0; i < msgs.size(); ++i) {
      const ChatMessage& msg = msgs[i];
      if (msg.role == "user" || (msg.role == "system" && !msg.tools)) {
        std::vector<std::pair<std::string, std::string>> attrs{{"role", msg.role}};
        if (msg.name && !msg.name->empty()) attrs.emplace_back("name", *msg.name);
        open_tag("message", attrs);
        content(msg.content);
        close_tag("message");
        e_.special(m_.end_of_msg, kEom);
      } else if (msg.role == "system") {
        tool_declare(*msg.tools, true);
      } else if (msg.role == "assistant") {
        calls_ = &msg.tool_calls;
        tool_index_ = 0;
        std::vector<std::pair<std::string, std::string>> attrs{{"role", "assistant"}};
        if (msg.name && !msg.name->empty()) attrs.emplace_back("name", *msg.name);
        open_tag("message", attrs);
        assistant(msg, thinking);
        close_tag("message");
        e_.special(m_.end_of_msg, kEom);
      } else if (msg.role == "tool" && (i == 0 || msgs[i - 1].role != "tool")) {
        tool_run(msgs, i);
      }
    }

    if (req.tool_choice.specified && req.tool_choice.mode == ToolChoice::Mode::Required)
      internal_system_message("tool-choice",
                              "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.");
    else if (req.tool_choice.specified && req.tool_choice.mode == ToolChoice::Mode::None)
      internal_system_message("tool-choice",
                              "The system is invoked with `tool_choice=none`.\nYou MUST NOT call any tools in the next message.");

    if (agp) {
      open_tag("message", {{"role", "assistant"}});
      open_tag(thinking ? "think" : "response", {});
    }
  }

 private:
  void open_tag(const std::string& tag, const std::vector<std::pair<std::string, std::string>>& attrs) {
    e_.special(m_.open, kOpen);
    std::string s = tag;
    for (const auto& [k, v] : attrs) s += " " + k + "=\"" + escape_attr(v) + "\"";
    e_.text(s);
    e_.special(m_.sep, kSep);
  }
  void close_tag(const std::string& tag) {
    e_.special(m_.close, kClose);
    e_.text(tag);
    e_.special(m_.sep, kSep);
  }
  void content(const std::optional<std::string>& c) {
    if (c) e_.text(*c);
  }
  void internal_system_message(const std::string& type, const std::string& body) {
    open_tag("message", {{"role", "system"}, {"type", type}});
    e_.text(body);  // the template trims the body; these constant bodies have no outer whitespace
    close_tag("message");
    e_.special(m_.end_of_msg, kEom);
  }
  void tool_declare(const ojson& tools, bool dynamic) {
    open_tag("message", {{"role", "system"}, {"type", "tool-declare"}});
    e_.text(std::string(dynamic ? "## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                                  "You have access to all existing and extended tools.\nHere are the specs for the "
                                  "extended tools.\n\n```json\n"
                                : "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n") +
            json_sorted(tools) + "\n```");
    close_tag("message");
    e_.special(m_.end_of_msg, kEom);
  }
  static const char* xtml_type(const ojson& v) {
    if (v.is_boolean()) return "boolean";
    if (v.is_null()) return "null";
    if (v.is_number()) return "number";
    if (v.is_string()) return "string";
    if (v.is_object()) return "object";
    return "array";
  }
  void assistant(const ChatMessage& msg, bool thinking) {
    if (thinking) {
      open_tag("think", {});
      if (msg.reasoning_content && !py_is_blank(*msg.reasoning_content)) e_.text(*msg.reasoning_content);
      close_tag("think");
    }
    open_tag("response", {});
    content(msg.content);
    close_tag("response");
    if (msg.tool_calls.empty()) return;
    open_tag("tools", {});
    for (size_t k = 0; k < msg.tool_calls.size(); ++k) {
      const ChatToolCall& tc = msg.tool_calls[k];
      open_tag("call", {{"tool", tc.name}, {"index", std::to_string(k + 1)}});
      if (tc.arguments_json) {
        for (auto it = tc.arguments_json->begin(); it != tc.arguments_json->end(); ++it) {
          open_tag("argument", {{"key", it.key()}, {"type", xtml_type(it.value())}});
          e_.text(it.value().is_string() ? it.value().get<std::string>() : py_json_dumps(it.value()));
          close_tag("argument");
        }
      } else if (!py_is_blank(tc.arguments)) {
        open_tag("json", {{"type", "object"}});
        e_.text(tc.arguments);
        close_tag("json");
      }
      close_tag("call");
    }
    close_tag("tools");
  }
  void tool_run(const std::vector<ChatMessage>& msgs, size_t start) {
    std::vector<const ChatMessage*> run;
    size_t resolved = 0;
    for (size_t j = start; j < msgs.size() && msgs[j].role == "tool"; ++j) {
      run.push_back(&msgs[j]);
      const auto& id = msgs[j].tool_call_id;
      if (id && calls_) {
        for (const auto& tc : *calls_)
          if (!tc.id.empty() && tc.id == *id) {
            ++resolved;
            break;
          }
      }
    }
    if (!run.empty() && resolved == run.size()) {
      // Every result matches a call by id: emit them in the order of the calls.
      std::vector<std::string> emitted;
      for (const auto& tc : *calls_) {
        if (tc.id.empty() || std::find(emitted.begin(), emitted.end(), tc.id) != emitted.end()) continue;
        emitted.push_back(tc.id);
        for (const ChatMessage* tm : run)
          if (tm->tool_call_id && *tm->tool_call_id == tc.id) tool_message(*tm, &tc.name, start);
      }
    } else {
      for (size_t j = 0; j < run.size(); ++j) tool_message(*run[j], nullptr, start + j);
    }
  }
  void tool_message(const ChatMessage& msg, const std::string* resolved, size_t msg_index) {
    ++tool_index_;
    std::optional<std::string> name;
    if (resolved) name = *resolved;
    else if (msg.name) name = msg.name;
    if (!name && calls_ && tool_index_ <= calls_->size()) name = (*calls_)[tool_index_ - 1].name;
    if (!name)
      throw Error("chat request: messages[" + std::to_string(msg_index) +
                  "]: a tool message needs a resolvable tool name: give `name`, or a `tool_call_id` matching a "
                  "preceding assistant tool call (Kimi K3 format)");
    open_tag("message", {{"role", "tool"}, {"tool", *name}, {"index", std::to_string(tool_index_)}});
    content(msg.content);
    close_tag("message");
    e_.special(m_.end_of_msg, kEom);
  }

  const ChatMarkers& m_;
  Emitter& e_;
  const std::vector<ChatToolCall>* calls_ = nullptr;
  size_t tool_index_ = 0;
};

// ---- K2 / Kimi-Linear -----------------------------------------------------------------------------

void render_k2(const ChatMarkers& m, Emitter& e, const ChatRequest& req, bool agp) {
  if (!req.tools_json.empty()) {
    e.special(m.im_system, "<|im_system|>");
    e.text("tool_declare");
    e.special(m.im_middle, "<|im_middle|>");
    e.text(py_json_dumps(req.tools_json));
    e.special(m.im_end, "<|im_end|>");
  }
  size_t counter = 0;
  std::deque<std::string> queue;
  const auto& msgs = req.messages;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& msg = msgs[i];
    if (i == 0 && msg.role != "system") {
      e.special(m.im_system, "<|im_system|>");
      e.text("system");
      e.special(m.im_middle, "<|im_middle|>");
      e.text("You are Kimi, an AI assistant created by Moonshot AI.");
      e.special(m.im_end, "<|im_end|>");
      e.text("\n");
    }
    const std::string role_name = msg.name && !msg.name->empty() ? *msg.name : msg.role;
    if (msg.role == "user") e.special(m.im_user, "<|im_user|>");
    else if (msg.role == "assistant") e.special(m.im_assistant, "<|im_assistant|>");
    else e.special(m.im_system, "<|im_system|>");
    e.text(role_name);
    e.special(m.im_middle, "<|im_middle|>");
    if (msg.role == "assistant" && !msg.tool_calls.empty()) {
      if (msg.content) e.text(*msg.content);
      e.special(m.section_begin, "<|tool_calls_section_begin|>");
      for (const auto& tc : msg.tool_calls) {
        std::string id = "functions." + tc.name + ":" + std::to_string(counter++);
        queue.push_back(id);
        e.special(m.call_begin, "<|tool_call_begin|>");
        e.text(id);
        e.special(m.argument_begin, "<|tool_call_argument_begin|>");
        e.text(tc.arguments_json ? py_json_dumps(*tc.arguments_json) : tc.arguments);
        e.special(m.call_end, "<|tool_call_end|>");
      }
      e.special(m.section_end, "<|tool_calls_section_end|>");
    } else if (msg.role == "tool") {
      std::string id;
      if (!queue.empty()) {
        id = queue.front();
        queue.pop_front();
      } else {
        id = "functions." + (msg.name ? *msg.name : std::string("unknown")) + ":" + std::to_string(counter);
      }
      e.text("## Return of " + id + "\n");
      if (msg.content) e.text(*msg.content);
    } else if (msg.content) {
      e.text(*msg.content);
    }
    e.special(m.im_end, "<|im_end|>");
  }
  if (agp) {
    e.special(m.im_assistant, "<|im_assistant|>");
    e.text("assistant");
    e.special(m.im_middle, "<|im_middle|>");
  }
}

}  // namespace

std::string py_json_dumps(const ojson& value) {
  std::string out;
  py_dumps(value, out);
  return out;
}

std::string json_sorted(const ojson& value) {
  std::string out;
  json_sorted_impl(value, out);
  return out;
}

ChatFormat::ChatFormat(ChatFormatKind kind, const Tokenizer& tok) : kind_(kind) {
  if (kind == ChatFormatKind::K3Xtml) {
    const char* f = "k3-xtml";
    m_.open = lookup(tok, kOpen, f);
    m_.close = lookup(tok, kClose, f);
    m_.sep = lookup(tok, kSep, f);
    m_.end_of_msg = lookup(tok, kEom, f);
  } else {
    const char* f = "k2";
    m_.im_end = lookup(tok, "<|im_end|>", f);
    m_.im_user = lookup(tok, "<|im_user|>", f);
    m_.im_assistant = lookup(tok, "<|im_assistant|>", f);
    m_.im_system = lookup(tok, "<|im_system|>", f);
    m_.im_middle = lookup(tok, "<|im_middle|>", f);
    m_.section_begin = lookup(tok, "<|tool_calls_section_begin|>", f);
    m_.section_end = lookup(tok, "<|tool_calls_section_end|>", f);
    m_.call_begin = lookup(tok, "<|tool_call_begin|>", f);
    m_.argument_begin = lookup(tok, "<|tool_call_argument_begin|>", f);
    m_.call_end = lookup(tok, "<|tool_call_end|>", f);
  }
}

ChatFormatKind ChatFormat::kind_from_name(const std::string& n) {
  if (n == "k3" || n == "xtml" || n == "k3-xtml" || n == "kimi_k3") return ChatFormatKind::K3Xtml;
  if (n == "k2" || n == "kimi_linear" || n == "kimi_k2" || n == "deepseek_v3") return ChatFormatKind::K2;
  throw Error("unknown chat format '" + n + "' (expected k3 | k2)");
}

ChatFormat ChatFormat::for_model_type(const std::string& model_type, const Tokenizer& tok) {
  if (model_type == "kimi_k3") return ChatFormat(ChatFormatKind::K3Xtml, tok);
  if (model_type == "kimi_linear" || model_type == "kimi_k2" || model_type == "deepseek_v3")
    return ChatFormat(ChatFormatKind::K2, tok);
  throw Error("no chat format for model_type '" + model_type + "' (known: kimi_k3, kimi_linear, kimi_k2)");
}

std::string ChatFormat::thinking_effort(const ChatRequest& req) {
  auto it = req.chat_template_kwargs.find("thinking_effort");
  if (it != req.chat_template_kwargs.end()) return it->is_null() ? "" : it->get<std::string>();
  if (req.reasoning_effort) return *req.reasoning_effort == "low" ? "low" : "high";
  return "max";
}

std::vector<int32_t> ChatFormat::render(const ChatRequest& req, const Tokenizer& tok, bool agp) const {
  std::vector<int32_t> ids;
  Emitter e(&tok, &ids);
  if (kind_ == ChatFormatKind::K3Xtml) K3Renderer(m_, e).render(req, agp);
  else render_k2(m_, e, req, agp);
  e.flush();
  return ids;
}

std::string ChatFormat::render_text(const ChatRequest& req, bool agp) const {
  Emitter e(nullptr, nullptr);
  if (kind_ == ChatFormatKind::K3Xtml) K3Renderer(m_, e).render(req, agp);
  else render_k2(m_, e, req, agp);
  return std::move(e.out_text());
}

std::vector<int32_t> ChatFormat::stop_token_ids() const {
  return {kind_ == ChatFormatKind::K3Xtml ? m_.end_of_msg : m_.im_end};
}

bool ChatFormat::generation_starts_in_reasoning(const ChatRequest& req) const {
  return kind_ == ChatFormatKind::K3Xtml && req.thinking(true);
}

std::string escape_attr(const std::string& v) {
  std::string r;
  for (char c : v) {
    if (c == '&') r += "&amp;";
    else if (c == '"') r += "&quot;";
    else r += c;
  }
  return r;
}

}  // namespace k3::text
