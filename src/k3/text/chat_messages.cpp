#include "k3/text/chat_messages.h"

#include "k3/core/error.h"

namespace k3::text {

namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& field, const std::string& what) {
  throw Error("chat request: " + field + ": " + what);
}

std::string type_name(const ojson& j) { return j.type_name(); }

const ojson* get(const ojson& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return nullptr;
  return &*it;
}

std::string get_string(const ojson& obj, const char* key, const std::string& field, bool required) {
  const ojson* v = get(obj, key);
  if (!v || v->is_null()) {
    if (required) fail(field + "." + key, "is required");
    return {};
  }
  if (!v->is_string()) fail(field + "." + key, std::string("must be a string, got ") + type_name(*v));
  return v->get<std::string>();
}

std::optional<std::string> get_opt_string(const ojson& obj, const char* key, const std::string& field) {
  const ojson* v = get(obj, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_string()) fail(field + "." + key, std::string("must be a string, got ") + type_name(*v));
  return v->get<std::string>();
}

std::optional<std::string> parse_content(const ojson& msg, const std::string& field) {
  const ojson* c = get(msg, "content");
  if (!c || c->is_null()) return std::nullopt;
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) fail(field + ".content", "must be a string, an array of content parts or null, got " + type_name(*c));
  std::string out;
  for (size_t i = 0; i < c->size(); ++i) {
    const ojson& part = (*c)[i];
    const std::string pf = field + ".content[" + std::to_string(i) + "]";
    if (!part.is_object()) fail(pf, "must be an object, got " + type_name(part));
    const std::string type = get_string(part, "type", pf, true);
    if (type == "text") {
      out += get_string(part, "text", pf, true);
    } else if (type == "image_url" || type == "image" || type == "input_image" || type == "input_audio" ||
               type == "video_url") {
      fail(pf + ".type", "'" + type + "' content is not supported (text-only model front end)");
    } else {
      fail(pf + ".type", "unknown content part type '" + type + "' (expected 'text')");
    }
  }
  return out;
}

ChatToolCall parse_tool_call(const ojson& tc, const std::string& field) {
  if (!tc.is_object()) fail(field, "must be an object, got " + type_name(tc));
  ChatToolCall out;
  out.id = get_string(tc, "id", field, false);
  const std::string type = get_string(tc, "type", field, false);
  if (!type.empty() && type != "function") fail(field + ".type", "must be 'function', got '" + type + "'");
  const ojson* fn = get(tc, "function");
  if (!fn) fail(field + ".function", "is required");
  if (!fn->is_object()) fail(field + ".function", "must be an object, got " + type_name(*fn));
  out.name = get_string(*fn, "name", field + ".function", true);
  if (out.name.empty()) fail(field + ".function.name", "must not be empty");
  const ojson* args = get(*fn, "arguments");
  if (!args || args->is_null()) {
    out.arguments = "";
  } else if (args->is_string()) {
    out.arguments = args->get<std::string>();
  } else if (args->is_object()) {
    out.arguments_json = *args;
    out.arguments = args->dump();
  } else {
    fail(field + ".function.arguments", "must be a JSON string (or an object), got " + type_name(*args));
  }
  return out;
}

ChatMessage parse_message(const ojson& m, size_t i) {
  const std::string field = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) fail(field, "must be an object, got " + type_name(m));
  ChatMessage out;
  out.original_role = get_string(m, "role", field, true);
  out.role = out.original_role;
  if (out.role == "developer") out.role = "system";
  if (out.role != "system" && out.role != "user" && out.role != "assistant" && out.role != "tool")
    fail(field + ".role", "must be one of system, developer, user, assistant, tool; got '" + out.original_role + "'");
  out.content = parse_content(m, field);
  out.name = get_opt_string(m, "name", field);
  if (out.role == "assistant") {
    // The K3 template reads `reasoning_content or reasoning`: an empty string falls through too.
    out.reasoning_content = get_opt_string(m, "reasoning_content", field);
    if (!out.reasoning_content || out.reasoning_content->empty()) {
      if (auto r = get_opt_string(m, "reasoning", field)) out.reasoning_content = r;
    }
    if (const ojson* tcs = get(m, "tool_calls"); tcs && !tcs->is_null()) {
      if (!tcs->is_array()) fail(field + ".tool_calls", "must be an array, got " + type_name(*tcs));
      for (size_t k = 0; k < tcs->size(); ++k)
        out.tool_calls.push_back(parse_tool_call((*tcs)[k], field + ".tool_calls[" + std::to_string(k) + "]"));
    }
  } else if (out.role == "tool") {
    out.tool_call_id = get_opt_string(m, "tool_call_id", field);
  } else if (out.role == "system") {
    if (const ojson* t = get(m, "tools"); t && !t->is_null()) {
      if (!t->is_array()) fail(field + ".tools", "must be an array, got " + type_name(*t));
      if (!t->empty()) out.tools = *t;
    }
  }
  return out;
}

ChatToolDef parse_tool(const ojson& t, size_t i) {
  const std::string field = "tools[" + std::to_string(i) + "]";
  if (!t.is_object()) fail(field, "must be an object, got " + type_name(t));
  const std::string type = get_string(t, "type", field, true);
  if (type != "function") fail(field + ".type", "must be 'function', got '" + type + "'");
  const ojson* fn = get(t, "function");
  if (!fn) fail(field + ".function", "is required");
  if (!fn->is_object()) fail(field + ".function", "must be an object, got " + type_name(*fn));
  ChatToolDef out;
  out.name = get_string(*fn, "name", field + ".function", true);
  if (out.name.empty()) fail(field + ".function.name", "must not be empty");
  out.description = get_string(*fn, "description", field + ".function", false);
  if (const ojson* p = get(*fn, "parameters"); p && !p->is_null()) {
    if (!p->is_object()) fail(field + ".function.parameters", "must be an object (a JSON Schema), got " + type_name(*p));
    out.parameters = *p;
  }
  return out;
}

ToolChoice parse_tool_choice(const ojson& v) {
  ToolChoice tc;
  tc.specified = true;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "none") tc.mode = ToolChoice::Mode::None;
    else if (s == "auto") tc.mode = ToolChoice::Mode::Auto;
    else if (s == "required") tc.mode = ToolChoice::Mode::Required;
    else fail("tool_choice", "must be 'none', 'auto', 'required' or {type, function: {name}}; got '" + s + "'");
    return tc;
  }
  if (!v.is_object()) fail("tool_choice", "must be a string or an object, got " + type_name(v));
  const std::string type = get_string(v, "type", "tool_choice", true);
  if (type != "function") fail("tool_choice.type", "must be 'function', got '" + type + "'");
  const ojson* fn = get(v, "function");
  if (!fn || !fn->is_object()) fail("tool_choice.function", "must be an object with a name");
  tc.mode = ToolChoice::Mode::Function;
  tc.function_name = get_string(*fn, "name", "tool_choice.function", true);
  return tc;
}

}  // namespace

ChatRequest ChatRequest::from_json(const nlohmann::json& body) { return from_json(ojson::parse(body.dump())); }

ChatRequest ChatRequest::from_json(const ojson& body) {
  if (!body.is_object()) throw Error("chat request: the body must be a JSON object, got " + type_name(body));
  ChatRequest r;
  const ojson* msgs = get(body, "messages");
  if (!msgs) fail("messages", "is required");
  if (!msgs->is_array()) fail("messages", "must be an array, got " + type_name(*msgs));
  if (msgs->empty()) fail("messages", "must not be empty");
  for (size_t i = 0; i < msgs->size(); ++i) r.messages.push_back(parse_message((*msgs)[i], i));

  if (const ojson* t = get(body, "tools"); t && !t->is_null()) {
    if (!t->is_array()) fail("tools", "must be an array, got " + type_name(*t));
    for (size_t i = 0; i < t->size(); ++i) r.tools.push_back(parse_tool((*t)[i], i));
    r.tools_json = *t;
  }
  if (const ojson* tc = get(body, "tool_choice"); tc && !tc->is_null()) r.tool_choice = parse_tool_choice(*tc);
  if (const ojson* e = get(body, "reasoning_effort"); e && !e->is_null()) {
    if (!e->is_string()) fail("reasoning_effort", "must be a string, got " + type_name(*e));
    const std::string s = e->get<std::string>();
    if (s != "low" && s != "medium" && s != "high")
      fail("reasoning_effort", "must be 'low', 'medium' or 'high'; got '" + s + "'");
    r.reasoning_effort = s;
  }
  if (const ojson* k = get(body, "chat_template_kwargs"); k && !k->is_null()) {
    if (!k->is_object()) fail("chat_template_kwargs", "must be an object, got " + type_name(*k));
    if (const ojson* th = get(*k, "thinking"); th && !th->is_null() && !th->is_boolean())
      fail("chat_template_kwargs.thinking", "must be a boolean, got " + type_name(*th));
    if (const ojson* te = get(*k, "thinking_effort"); te && !te->is_null()) {
      if (!te->is_string()) fail("chat_template_kwargs.thinking_effort", "must be a string or null, got " + type_name(*te));
      const std::string s = te->get<std::string>();
      if (s != "low" && s != "high" && s != "max")
        fail("chat_template_kwargs.thinking_effort", "must be 'low', 'high', 'max' or null; got '" + s + "'");
    }
    r.chat_template_kwargs = *k;
  }
  return r;
}

bool ChatRequest::thinking(bool def) const {
  auto it = chat_template_kwargs.find("thinking");
  if (it == chat_template_kwargs.end() || it->is_null()) return def;
  return it->get<bool>();
}

}  // namespace k3::text
