#include "k3/serve/openai_api.h"

#include <algorithm>

#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "k3/core/error.h"
#include "k3/text/utf8.h"

namespace k3::serve {

using json = nlohmann::json;

json error_json(const ApiError& e) {
  json err = {{"message", e.message}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

namespace {
// Nesting depth of the JSON text's arrays/objects (brackets inside strings do not count); stops
// counting once past `limit`. Invalid JSON is the parser's business.
int json_depth(std::string_view s, int limit) {
  int depth = 0, max_depth = 0;
  bool in_str = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_str) {
      if (c == '\\') ++i;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth && (max_depth = depth) > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}
}  // namespace

json parse_json_body(std::string_view body) {
  if (!text::is_valid_utf8(body)) throw ApiError(400, "the request body is not valid UTF-8");
  if (json_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    throw ApiError(400, "the request body nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("invalid JSON in the request body: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

bool present(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

double get_number(const json& b, const char* k) {
  const auto& v = b[k];
  if (!v.is_number()) throw ApiError(400, std::string("'") + k + "' must be a number", k);
  return v.get<double>();
}

int64_t get_int(const json& b, const char* k) {
  const auto& v = b[k];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  throw ApiError(400, std::string("'") + k + "' must be an integer", k);
}

bool get_bool(const json& b, const char* k) {
  if (!b[k].is_boolean()) throw ApiError(400, std::string("'") + k + "' must be a boolean", k);
  return b[k].get<bool>();
}

int clamp_int(int64_t v, const char* k, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    throw ApiError(400, std::string("'") + k + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(v), k);
  return static_cast<int>(v);
}

// The field named in a SamplingParams::validate() message ("SamplingParams: top_p must be ...").
std::string param_of(const std::string& msg) {
  const std::string pre = "SamplingParams: ";
  if (msg.rfind(pre, 0) != 0) return {};
  const auto end = msg.find(' ', pre.size());
  return msg.substr(pre.size(), end == std::string::npos ? std::string::npos : end - pre.size());
}

std::vector<int32_t> token_list(const json& arr, const ApiContext& ctx, const char* param) {
  std::vector<int32_t> ids;
  for (const auto& v : arr) {
    if (!v.is_number_integer()) throw ApiError(400, std::string("'") + param + "' token ids must be integers", param);
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= ctx.vocab_size)
      throw ApiError(400, "token id " + std::to_string(id) + " in '" + param + "' is outside the vocabulary [0, " +
                              std::to_string(ctx.vocab_size) + ")", param);
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

std::vector<int32_t> completion_prompt(const json& b, const ApiContext& ctx) {
  if (!present(b, "prompt")) throw ApiError(400, "'prompt' is required", "prompt");
  json p = b["prompt"];
  // A batch of exactly one prompt is accepted as that prompt.
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) p = json(p[0]);
  if (p.is_string()) {
    std::vector<int32_t> ids;
    if (ctx.bos >= 0) ids.push_back(ctx.bos);
    auto enc = ctx.tok->encode(p.get<std::string>(), /*allow_special=*/true);
    ids.insert(ids.end(), enc.begin(), enc.end());
    return ids;
  }
  if (p.is_array()) {
    if (p.empty()) throw ApiError(400, "'prompt' must not be empty", "prompt");
    if (!p[0].is_number_integer())
      throw ApiError(400, "'prompt' must be a string, a list of token ids, or a list of one of these "
                          "(batches of several prompts are not supported; use n or several requests)", "prompt");
    return token_list(p, ctx, "prompt");
  }
  throw ApiError(400, "'prompt' must be a string or a list of token ids", "prompt");
}

void check_messages(const json& b) {
  if (!present(b, "messages")) throw ApiError(400, "'messages' is required", "messages");
  const auto& m = b["messages"];
  if (!m.is_array() || m.empty()) throw ApiError(400, "'messages' must be a non-empty list", "messages");
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m[i].is_object()) throw ApiError(400, at + " must be an object", "messages");
    if (!m[i].contains("role") || !m[i]["role"].is_string())
      throw ApiError(400, at + ".role must be a string", "messages");
    const auto role = m[i]["role"].get<std::string>();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool" && role != "developer")
      throw ApiError(400, at + ".role must be one of system, developer, user, assistant, tool; got '" + role + "'",
                     "messages");
    if (m[i].contains("content")) {
      try {
        (void)message_text(m[i]["content"]);
      } catch (const Error& e) {
        throw ApiError(400, at + ".content: " + e.what(), "messages");
      }
    }
  }
}

// The top-level request field named by a chat-format error ("chat request: tools[0].function.name: ...");
// "messages" when none can be read off.
std::string chat_error_param(const std::string& msg) {
  const std::string pre = "chat request: ";
  if (msg.rfind(pre, 0) != 0) return "messages";
  const size_t end = msg.find_first_of(".[: ", pre.size());
  const std::string f = msg.substr(pre.size(), end == std::string::npos ? std::string::npos : end - pre.size());
  for (const char* k : {"messages", "tools", "tool_choice", "reasoning_effort", "chat_template_kwargs"})
    if (f == k) return f;
  return "messages";
}

}  // namespace

GenRequest parse_generation_request(Endpoint ep, const json& b, const ApiContext& ctx) {
  GenRequest r;
  r.endpoint = ep;
  r.body = b;
  const bool chat = ep == Endpoint::Chat;

  r.model = ctx.model_name;
  if (present(b, "model")) {
    if (!b["model"].is_string()) throw ApiError(400, "'model' must be a string", "model");
    r.model = b["model"].get<std::string>();
    if (r.model != ctx.model_name)
      throw ApiError(404, "The model '" + r.model + "' does not exist; this server serves '" + ctx.model_name + "'",
                     "model", "invalid_request_error", "model_not_found");
  }

  auto& p = r.params;
  p.max_tokens = 16;
  if (present(b, "temperature")) p.temperature = static_cast<float>(get_number(b, "temperature"));
  if (present(b, "top_p")) p.top_p = static_cast<float>(get_number(b, "top_p"));
  if (present(b, "min_p")) p.min_p = static_cast<float>(get_number(b, "min_p"));
  if (present(b, "top_k")) p.top_k = clamp_int(get_int(b, "top_k"), "top_k", -1, std::numeric_limits<int>::max());
  if (present(b, "presence_penalty")) p.presence_penalty = static_cast<float>(get_number(b, "presence_penalty"));
  if (present(b, "frequency_penalty")) p.frequency_penalty = static_cast<float>(get_number(b, "frequency_penalty"));
  if (present(b, "repetition_penalty")) p.repetition_penalty = static_cast<float>(get_number(b, "repetition_penalty"));
  if (present(b, "seed")) p.seed = static_cast<uint64_t>(get_int(b, "seed"));
  if (present(b, "ignore_eos")) p.ignore_eos = get_bool(b, "ignore_eos");
  if (present(b, "stop")) {
    const auto& s = b["stop"];
    if (s.is_string()) {
      p.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      for (const auto& x : s) {
        if (!x.is_string()) throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
        p.stop.push_back(x.get<std::string>());
      }
    } else {
      throw ApiError(400, "'stop' must be a string or a list of strings", "stop");
    }
  }
  if (present(b, "stop_token_ids")) {
    if (!b["stop_token_ids"].is_array()) throw ApiError(400, "'stop_token_ids' must be a list of integers", "stop_token_ids");
    p.stop_token_ids = token_list(b["stop_token_ids"], ctx, "stop_token_ids");
  }
  if (present(b, "n")) r.n = clamp_int(get_int(b, "n"), "n", 1, ctx.max_n);
  if (present(b, "stream")) r.stream = get_bool(b, "stream");
  if (present(b, "stream_options")) {
    const auto& so = b["stream_options"];
    if (!so.is_object()) throw ApiError(400, "'stream_options' must be an object", "stream_options");
    if (!r.stream) throw ApiError(400, "'stream_options' is only allowed when 'stream' is true", "stream_options");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw ApiError(400, "'stream_options.include_usage' must be a boolean", "stream_options");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(b, "echo") && b["echo"].is_boolean() && b["echo"].get<bool>())
    throw ApiError(400, "'echo' is not supported", "echo");
  if (present(b, "best_of") && !(b["best_of"].is_number_integer() && b["best_of"].get<int64_t>() == r.n))
    throw ApiError(400, "'best_of' is not supported (only best_of == n)", "best_of");

  // logprobs
  if (chat) {
    bool lp = false;
    if (present(b, "logprobs")) lp = get_bool(b, "logprobs");
    int top = 0;
    if (present(b, "top_logprobs")) {
      top = clamp_int(get_int(b, "top_logprobs"), "top_logprobs", 0, 20);
      if (!lp) throw ApiError(400, "'top_logprobs' requires 'logprobs': true", "top_logprobs");
    }
    r.top_logprobs = lp ? top : -1;
  } else if (present(b, "logprobs")) {
    if (b["logprobs"].is_boolean()) throw ApiError(400, "'logprobs' must be an integer for completions", "logprobs");
    r.top_logprobs = clamp_int(get_int(b, "logprobs"), "logprobs", 0, 20);
  }

  // chat-only fields: type checks; their meaning belongs to the chat adapter
  if (chat) {
    if (present(b, "tools") && !b["tools"].is_array()) throw ApiError(400, "'tools' must be a list", "tools");
    if (present(b, "tool_choice") && !b["tool_choice"].is_string() && !b["tool_choice"].is_object())
      throw ApiError(400, "'tool_choice' must be a string or an object", "tool_choice");
    if (present(b, "reasoning_effort") && !b["reasoning_effort"].is_string())
      throw ApiError(400, "'reasoning_effort' must be a string", "reasoning_effort");
    if (present(b, "chat_template_kwargs") && !b["chat_template_kwargs"].is_object())
      throw ApiError(400, "'chat_template_kwargs' must be an object", "chat_template_kwargs");
  }

  // prompt
  const char* prompt_param = chat ? "messages" : "prompt";
  if (chat) {
    check_messages(b);
    try {
      r.prompt = ctx.chat->render(b);
    } catch (const Error& e) {
      throw ApiError(400, std::string("cannot format the request: ") + e.what(), chat_error_param(e.what()));
    } catch (const json::exception& e) {
      throw ApiError(400, std::string("cannot format the messages: ") + e.what(), "messages");
    }
    // end-of-turn ids act like EOS: ignore_eos drops them too (as vLLM does with the model's
    // generation_config eos ids); the client's own stop_token_ids always apply
    if (!p.ignore_eos)
      for (int32_t id : ctx.chat->stop_token_ids())
        if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), id) == p.stop_token_ids.end())
          p.stop_token_ids.push_back(id);
  } else {
    r.prompt = completion_prompt(b, ctx);
  }
  if (r.prompt.empty()) throw ApiError(400, "the prompt is empty", prompt_param);
  const int64_t np = static_cast<int64_t>(r.prompt.size());
  if (np >= ctx.max_model_len)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                            " tokens. However, your prompt has " + std::to_string(np) + " tokens.", prompt_param);

  // max tokens: max_completion_tokens (chat) wins over max_tokens; chat defaults to the rest of the context
  const char* mt_key = chat && present(b, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  if (present(b, mt_key)) {
    const int64_t mt = get_int(b, mt_key);
    if (mt < 1) throw ApiError(400, std::string("'") + mt_key + "' must be >= 1, got " + std::to_string(mt), mt_key);
    if (np + mt > ctx.max_model_len)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                              " tokens. However, you requested " + std::to_string(np + mt) + " tokens (" +
                              std::to_string(np) + " in the prompt, " + std::to_string(mt) + " for the completion).",
                     mt_key);
    p.max_tokens = static_cast<int>(mt);
  } else {
    p.max_tokens = static_cast<int>(chat ? ctx.max_model_len - np : std::min<int64_t>(16, ctx.max_model_len - np));
  }

  try {
    p.validate();
  } catch (const Error& e) {
    std::string msg = e.what();
    std::string param = param_of(msg);
    if (msg.rfind("SamplingParams: ", 0) == 0) msg = msg.substr(16);
    throw ApiError(400, msg, param);
  }
  return r;
}

// ---- responses --------------------------------------------------------------------------------

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

std::string new_response_id(Endpoint ep) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = [] {
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }();
  uint64_t x = salt + 0x9E3779B97F4A7C15ull * (++counter);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return std::string(ep == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + buf;
}

std::string openai_finish_reason(const std::string& r, bool has_tool_calls) {
  if (r == "stop" && has_tool_calls) return "tool_calls";
  return r;  // stop | length | abort | error
}

namespace {
json bytes_of(const std::string& s) {
  json a = json::array();
  for (unsigned char c : s) a.push_back(static_cast<int>(c));
  return a;
}
std::string token_text(const text::Tokenizer& tok, int32_t id) {
  try {
    return text::utf8_lossy(tok.token_bytes(id));
  } catch (const Error&) {
    return {};
  }
}
std::string token_raw(const text::Tokenizer& tok, int32_t id) {
  try {
    return tok.token_bytes(id);
  } catch (const Error&) {
    return {};
  }
}
}  // namespace

json chat_logprobs(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok, int top_n) {
  json content = json::array();
  for (const auto& lp : lps) {
    json e = {{"token", token_text(tok, lp.id)}, {"logprob", lp.logprob}, {"bytes", bytes_of(token_raw(tok, lp.id))}};
    json top = json::array();
    for (int i = 0; i < top_n && i < static_cast<int>(lp.top.size()); ++i) {
      const auto& [id, l] = lp.top[i];
      top.push_back({{"token", token_text(tok, id)}, {"logprob", l}, {"bytes", bytes_of(token_raw(tok, id))}});
    }
    e["top_logprobs"] = top;
    content.push_back(std::move(e));
  }
  return content;
}

json completion_logprobs(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok, int top_n,
                         int64_t& text_offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
  for (const auto& lp : lps) {
    const std::string t = token_text(tok, lp.id);
    tokens.push_back(t);
    token_lps.push_back(lp.logprob);
    json top = json::object();
    for (int i = 0; i < top_n && i < static_cast<int>(lp.top.size()); ++i)
      top[token_text(tok, lp.top[i].first)] = lp.top[i].second;
    tops.push_back(top_n > 0 ? top : json(nullptr));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(t.size());
  }
  return json{{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json tool_calls_json(const std::vector<ToolCallDelta>& frags) {
  json calls = json::array();
  int cur = -1;
  for (const auto& f : frags) {
    if (f.index != cur) {
      calls.push_back({{"id", f.id}, {"type", "function"}, {"function", {{"name", f.name}, {"arguments", ""}}}});
      cur = f.index;
    }
    auto& c = calls.back();
    if (!f.id.empty() && c["id"].get<std::string>().empty()) c["id"] = f.id;
    if (!f.name.empty() && c["function"]["name"].get<std::string>().empty()) c["function"]["name"] = f.name;
    c["function"]["arguments"] = c["function"]["arguments"].get<std::string>() + f.arguments;
  }
  return calls;
}

json build_response(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created,
                    const std::vector<ChoiceState>& choices, const Usage& usage, const text::Tokenizer& tok) {
  const bool chat = ep == Endpoint::Chat;
  json out = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
              {"model", req.model}};
  json arr = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    json ch = {{"index", static_cast<int>(i)}};
    if (chat) {
      json msg = {{"role", "assistant"}, {"content", c.message.content}};
      if (!c.message.reasoning_content.empty()) msg["reasoning_content"] = c.message.reasoning_content;
      if (!c.message.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(c.message.tool_calls);
      ch["message"] = msg;
      ch["logprobs"] = req.top_logprobs >= 0 ? json{{"content", chat_logprobs(c.logprobs, tok, req.top_logprobs)}}
                                             : json(nullptr);
    } else {
      ch["text"] = c.text;
      int64_t off = 0;
      ch["logprobs"] = req.top_logprobs >= 0 ? completion_logprobs(c.logprobs, tok, req.top_logprobs, off)
                                             : json(nullptr);
    }
    ch["finish_reason"] = openai_finish_reason(c.finish_reason, !c.message.tool_calls.empty());
    arr.push_back(std::move(ch));
  }
  out["choices"] = arr;
  out["usage"] = usage_json(usage);
  return out;
}

json build_chunk(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created, int index, bool first,
                 const ChatDelta& delta, const std::string& text, const std::vector<engine::TokenLogprob>& lps,
                 const std::string& finish_reason, const text::Tokenizer& tok, int64_t& text_offset) {
  const bool chat = ep == Endpoint::Chat;
  json out = {{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"}, {"created", created},
              {"model", req.model}};
  json ch = {{"index", index}};
  if (chat) {
    json d = json::object();
    if (first) d["role"] = "assistant";
    if (!delta.reasoning_content.empty()) d["reasoning_content"] = delta.reasoning_content;
    if (!delta.content.empty() || (first && delta.reasoning_content.empty() && delta.tool_calls.empty()))
      d["content"] = delta.content;
    if (!delta.tool_calls.empty()) {
      json tcs = json::array();
      for (const auto& f : delta.tool_calls) {
        json t = {{"index", f.index}, {"function", {{"arguments", f.arguments}}}};
        if (!f.id.empty()) {
          t["id"] = f.id;
          t["type"] = "function";
        }
        if (!f.name.empty()) t["function"]["name"] = f.name;
        tcs.push_back(std::move(t));
      }
      d["tool_calls"] = tcs;
    }
    ch["delta"] = d;
    ch["logprobs"] = req.top_logprobs >= 0 && !lps.empty()
                         ? json{{"content", chat_logprobs(lps, tok, req.top_logprobs)}}
                         : json(nullptr);
  } else {
    ch["text"] = text;
    ch["logprobs"] = req.top_logprobs >= 0 && !lps.empty()
                         ? completion_logprobs(lps, tok, req.top_logprobs, text_offset)
                         : json(nullptr);
  }
  ch["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  out["choices"] = json::array({ch});
  if (req.include_usage) out["usage"] = nullptr;
  return out;
}

json build_usage_chunk(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created, const Usage& usage) {
  return json{{"id", id},
              {"object", ep == Endpoint::Chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", req.model},
              {"choices", json::array()},
              {"usage", usage_json(usage)}};
}

json models_json(const std::string& model_name, int64_t created, int64_t max_model_len) {
  return json{{"object", "list"},
              {"data", json::array({json{{"id", model_name},
                                         {"object", "model"},
                                         {"created", created},
                                         {"owned_by", "k3.cpp"},
                                         {"root", model_name},
                                         {"parent", nullptr},
                                         {"max_model_len", max_model_len}}})}};
}

}  // namespace k3::serve
