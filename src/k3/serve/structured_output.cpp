#include "k3/serve/structured_output.h"

#include "k3/core/error.h"
#include "k3/serve/openai_api.h"
#include "k3/text/chat_format.h"

namespace k3::serve {

using json = nlohmann::json;

namespace {

bool present(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

[[noreturn]] void bad(const std::string& param, const std::string& what) { throw ApiError(400, what, param); }

json schema_format(const json& schema) {
  return json{{"type", "json_schema"}, {"json_schema", schema}, {"max_whitespace_cnt", kJsonMaxWhitespace}};
}

// A JSON schema given as an object (or boolean), or as JSON text (vLLM accepts both).
json schema_value(const json& v, const std::string& param) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    try {
      json s = json::parse(v.get<std::string>());
      if (s.is_object() || s.is_boolean()) return s;
    } catch (const json::exception&) {
    }
    bad(param, "'" + param + "' must be a JSON schema (an object, or its JSON text)");
  }
  bad(param, "'" + param + "' must be a JSON schema object");
}

json string_field(const json& v, const std::string& param) {
  if (!v.is_string() || v.get_ref<const std::string&>().empty()) bad(param, "'" + param + "' must be a non-empty string");
  return v;
}

json choice_format(const json& v, const std::string& param) {
  if (!v.is_array() || v.empty()) bad(param, "'" + param + "' must be a non-empty list of strings");
  json alts = json::array();
  for (const auto& c : v) {
    if (!c.is_string()) bad(param, "'" + param + "' must be a non-empty list of strings");
    alts.push_back({{"type", "const_string"}, {"value", c}});
  }
  return json{{"type", "or"}, {"elements", alts}};
}

json regex_format(const json& v, const std::string& param) {
  return json{{"type", "regex"}, {"pattern", string_field(v, param)}};
}
json grammar_format(const json& v, const std::string& param) {
  return json{{"type", "grammar"}, {"grammar", string_field(v, param)}};
}

json response_format(const json& f) {
  const std::string p = "response_format";
  if (!f.is_object() || !f.contains("type") || !f["type"].is_string())
    bad(p, "'response_format' must be an object with a string 'type'");
  const std::string type = f["type"].get<std::string>();
  if (type == "text") return nullptr;
  if (type == "json_object") return schema_format(json{{"type", "object"}});
  if (type == "json_schema") {
    if (!present(f, "json_schema") || !f["json_schema"].is_object())
      bad(p, "'response_format.json_schema' must be an object with a 'schema'");
    const json& js = f["json_schema"];
    if (present(js, "name") && !js["name"].is_string()) bad(p, "'response_format.json_schema.name' must be a string");
    if (present(js, "strict") && !js["strict"].is_boolean())
      bad(p, "'response_format.json_schema.strict' must be a boolean");
    // Without a schema OpenAI's json_schema means any JSON object; strict or not, the output follows the
    // schema (the grammar cannot do "mostly").
    if (!present(js, "schema")) return schema_format(json{{"type", "object"}});
    return schema_format(schema_value(js["schema"], "response_format"));
  }
  if (type == "structural_tag") {  // vLLM / SGLang: xgrammar's own language, passed through
    if (!present(f, "format") || !f["format"].is_object()) bad(p, "'response_format.format' must be an object");
    return f["format"];
  }
  bad(p, "'response_format.type' must be text, json_object, json_schema or structural_tag; got '" +
             type.substr(0, 64) + "'");
}

// vLLM's structured_outputs object: exactly one of json, regex, choice, grammar, json_object, structural_tag.
json structured_outputs(const json& so) {
  const std::string p = "structured_outputs";
  if (!so.is_object()) bad(p, "'structured_outputs' must be an object");
  json out;
  int n = 0;
  for (auto it = so.begin(); it != so.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (v.is_null()) continue;
    const std::string at = p + "." + k;
    if (k == "json") out = schema_format(schema_value(v, at)), ++n;
    else if (k == "regex") out = regex_format(v, at), ++n;
    else if (k == "choice") out = choice_format(v, at), ++n;
    else if (k == "grammar") out = grammar_format(v, at), ++n;
    else if (k == "json_object") {
      if (!v.is_boolean()) bad(p, "'" + at + "' must be a boolean");
      if (v.get<bool>()) out = schema_format(json{{"type", "object"}}), ++n;
    } else if (k == "structural_tag") {
      json st = v;
      if (v.is_string()) {
        try {
          st = json::parse(v.get<std::string>());
        } catch (const json::exception&) {
          bad(p, "'" + at + "' must be a structural tag (an object or its JSON text)");
        }
      }
      if (!st.is_object() || !st.contains("format") || !st["format"].is_object())
        bad(p, "'" + at + "' must be an object with a 'format'");
      out = st["format"], ++n;
    } else if (k == "disable_any_whitespace" || k == "disable_fallback" || k == "disable_additional_properties") {
      if (!v.is_boolean()) bad(p, "'" + at + "' must be a boolean");
      if (k == "disable_any_whitespace" && v.get<bool>())
        bad(p, "'" + at + "' is not supported (JSON whitespace runs are at most " + std::to_string(kJsonMaxWhitespace) +
                   " characters)");
    } else {
      bad(p, "'" + at + "' is not supported (json, regex, choice, grammar, json_object, structural_tag are)");
    }
  }
  if (n > 1) bad(p, "'structured_outputs' must hold exactly one of json, regex, choice, grammar, json_object, structural_tag");
  return out;
}

}  // namespace

json requested_body_format(const json& b, std::string& param) {
  json out;
  std::string first;
  auto take = [&](const char* k, json f) {
    if (f.is_null()) return;
    if (!first.empty())
      bad(k, "'" + std::string(k) + "' and '" + first + "' both constrain the output; give one of them");
    first = k;
    out = std::move(f);
  };
  if (present(b, "response_format")) take("response_format", response_format(b["response_format"]));
  if (present(b, "structured_outputs")) take("structured_outputs", structured_outputs(b["structured_outputs"]));
  // vLLM's older names.
  if (present(b, "guided_json")) take("guided_json", schema_format(schema_value(b["guided_json"], "guided_json")));
  if (present(b, "guided_regex")) take("guided_regex", regex_format(b["guided_regex"], "guided_regex"));
  if (present(b, "guided_choice")) take("guided_choice", choice_format(b["guided_choice"], "guided_choice"));
  if (present(b, "guided_grammar")) take("guided_grammar", grammar_format(b["guided_grammar"], "guided_grammar"));
  if (present(b, "guided_decoding_backend")) {
    const auto& v = b["guided_decoding_backend"];
    if (!v.is_string() || (v != "xgrammar" && v != "auto"))
      bad("guided_decoding_backend", "'guided_decoding_backend' must be \"xgrammar\" or \"auto\" (the only engine here)");
  }
  // llama.cpp's names: a GBNF grammar (xgrammar reads GBNF as its EBNF) and a JSON schema.
  if (present(b, "grammar")) take("grammar", grammar_format(b["grammar"], "grammar"));
  if (present(b, "json_schema")) take("json_schema", schema_format(schema_value(b["json_schema"], "json_schema")));
  param = first;
  return out;
}

namespace {

json tok(int32_t id) { return json{{"type", "token"}, {"token", id}}; }
json lit(const std::string& s) { return json{{"type", "const_string"}, {"value", s}}; }
json seq(json elements) { return json{{"type", "sequence"}, {"elements", std::move(elements)}}; }

struct ToolRule {
  std::string name;
  json arguments;  // a structural-tag format
};

// The tools a constrained tool-call section may call, and whether the section is constrained at all.
std::vector<ToolRule> tool_rules(const text::ChatRequest& req, bool parallel_calls, bool& constrained, bool& required) {
  using Mode = text::ToolChoice::Mode;
  const auto& tc = req.tool_choice;
  required = tc.specified && (tc.mode == Mode::Required || tc.mode == Mode::Function);
  bool any_strict = false;
  std::vector<ToolRule> rules;
  for (size_t i = 0; i < req.tools.size(); ++i) {
    const auto& t = req.tools[i];
    bool strict = false;
    if (i < req.tools_json.size() && req.tools_json[i].is_object()) {
      const auto& fn = req.tools_json[i].value("function", nlohmann::ordered_json::object());
      if (fn.is_object() && fn.contains("strict") && !fn["strict"].is_null()) {
        if (!fn["strict"].is_boolean()) throw Error("chat request: tools[" + std::to_string(i) + "].function.strict: must be a boolean");
        strict = fn["strict"].get<bool>();
      }
    }
    if (tc.specified && tc.mode == Mode::Function && t.name != tc.function_name) continue;
    any_strict = any_strict || strict;
    json schema = json{{"type", "object"}};
    if (strict && !t.parameters.is_null()) schema = json::parse(t.parameters.dump());
    rules.push_back({t.name, schema_format(schema)});
  }
  constrained = !(tc.specified && tc.mode == Mode::None) && (any_strict || required || !parallel_calls) && !rules.empty();
  return rules;
}

// K3 XTML: <|open|>tools<|sep|> (<|open|>call tool="NAME" index="k"<|sep|><|open|>json type="object"<|sep|>
// ARGS<|close|>json<|sep|><|close|>call<|sep|>)+ <|close|>tools<|sep|>
json k3_tools(const text::ChatMarkers& m, const std::vector<ToolRule>& rules, bool parallel_calls) {
  json calls = json::array();
  for (const auto& r : rules)
    calls.push_back(seq({tok(m.open), lit("call tool=\"" + text::escape_attr(r.name) + "\" index=\""),
                         json{{"type", "regex"}, {"pattern", "[1-9][0-9]{0,2}"}}, lit("\""), tok(m.sep), tok(m.open),
                         lit("json type=\"object\""), tok(m.sep), r.arguments, tok(m.close), lit("json"), tok(m.sep),
                         tok(m.close), lit("call"), tok(m.sep)}));
  const json one = calls.size() == 1 ? calls[0] : json{{"type", "or"}, {"elements", calls}};
  return seq({tok(m.open), lit("tools"), tok(m.sep), parallel_calls ? json{{"type", "plus"}, {"content", one}} : one, tok(m.close),
              lit("tools"), tok(m.sep)});
}

// K2: <|tool_calls_section_begin|> (<|tool_call_begin|>functions.NAME:N<|tool_call_argument_begin|>ARGS
// <|tool_call_end|>)+ <|tool_calls_section_end|>
json k2_tools(const text::ChatMarkers& m, const std::vector<ToolRule>& rules, bool parallel_calls) {
  json calls = json::array();
  for (const auto& r : rules)
    calls.push_back(seq({tok(m.call_begin), lit("functions." + r.name + ":"),
                         json{{"type", "regex"}, {"pattern", "[0-9]{1,3}"}}, tok(m.argument_begin), r.arguments,
                         tok(m.call_end)}));
  const json one = calls.size() == 1 ? calls[0] : json{{"type", "or"}, {"elements", calls}};
  return seq({tok(m.section_begin), parallel_calls ? json{{"type", "plus"}, {"content", one}} : one, tok(m.section_end)});
}

}  // namespace

json chat_output_format(const text::ChatFormat& fmt, const text::ChatRequest& req, const json& body,
                        const std::vector<int32_t>& special_ids, bool parallel_calls) {
  bool tools_constrained = false, required = false;
  const std::vector<ToolRule> rules = tool_rules(req, parallel_calls, tools_constrained, required);
  if (body.is_null() && !tools_constrained) return nullptr;
  const json free_text = json{{"type", "any_tokens"}, {"exclude_tokens", special_ids}};
  const text::ChatMarkers& m = fmt.markers();
  json el = json::array();
  if (fmt.kind() == text::ChatFormatKind::K3Xtml) {
    // The prompt ends inside <|open|>think<|sep|> or <|open|>response<|sep|> (ChatFormat::render).
    if (fmt.generation_starts_in_reasoning(req)) {
      for (json e : {free_text, tok(m.close), lit("think"), tok(m.sep), tok(m.open), lit("response"), tok(m.sep)})
        el.push_back(std::move(e));
    }
    // tool_choice "required" / a named function: the answer is the call(s) alone (as vLLM and OpenAI
    // models answer), so a model cannot spend its budget on text before the call.
    if (!body.is_null()) el.push_back(body);
    else if (!(tools_constrained && required)) el.push_back(free_text);
    for (json e : {tok(m.close), lit("response"), tok(m.sep)}) el.push_back(std::move(e));
    if (tools_constrained) {
      const json section = k3_tools(m, rules, parallel_calls);
      el.push_back(required ? section : json{{"type", "optional"}, {"content", section}});
    }
  } else {
    if (!body.is_null()) el.push_back(body);
    else if (!(tools_constrained && required)) el.push_back(free_text);
    if (tools_constrained) {
      const json section = k2_tools(m, rules, parallel_calls);
      el.push_back(required ? section : json{{"type", "optional"}, {"content", section}});
    }
  }
  return seq(std::move(el));
}

}  // namespace k3::serve
