#include "k3/serve/openai_api.h"

#include <algorithm>
#include <cctype>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

#include "k3/core/error.h"
#include "k3/serve/structured_output.h"
#include "k3/text/chat_messages.h"
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

namespace {
// The key whose value is the number literal `lit` (for nlohmann's "number overflow parsing '1e400'",
// which names no field): the last `"key" :` before the literal's first occurrence; "" if none.
std::string overflow_param(std::string_view body, const std::string& msg) {
  const size_t a = msg.find('\''), b = msg.rfind('\'');
  if (a == std::string::npos || b <= a + 1) return {};
  const size_t at = body.find(msg.substr(a + 1, b - a - 1));
  if (at == std::string::npos) return {};
  size_t i = at;
  while (i > 0 && std::isspace(static_cast<unsigned char>(body[i - 1]))) --i;
  if (i == 0 || body[i - 1] != ':') return {};
  --i;
  while (i > 0 && std::isspace(static_cast<unsigned char>(body[i - 1]))) --i;
  if (i == 0 || body[i - 1] != '"') return {};
  const size_t end = i - 1, start = body.rfind('"', end - 1);
  if (start == std::string::npos || end - start - 1 > 64) return {};
  return std::string(body.substr(start + 1, end - start - 1));
}
}  // namespace

json parse_json_body(std::string_view body) {
  if (!text::is_valid_utf8(body)) throw ApiError(400, "the request body is not valid UTF-8");
  if (json_depth(body, kMaxJsonDepth) > kMaxJsonDepth)
    throw ApiError(400, "the request body nests arrays/objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::out_of_range& e) {
    // A number beyond double range (1e400): not a parse_error, it escaped as a 500.
    const std::string param = text::utf8_lossy(overflow_param(body, e.what()));
    throw ApiError(400, (param.empty() ? std::string("a number") : "'" + param + "'") +
                            " in the request body is beyond the range of a double: " + e.what(), param);
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("invalid JSON in the request body: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

namespace {

bool present(const json& b, const char* k) { return b.contains(k) && !b[k].is_null(); }

[[noreturn]] void bad_field(const char* k, const std::string& what) {
  throw ApiError(400, std::string("'") + k + "' " + what, k);
}

std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A finite number in [lo, hi]. Checked on the double, before any narrowing to float: 1e300 -> float is
// undefined behaviour, and nlohmann parses 1e400 as inf.
double get_number(const json& b, const char* k, double lo, double hi) {
  const auto& v = b[k];
  if (!v.is_number()) bad_field(k, "must be a number");
  const double d = v.get<double>();
  if (!std::isfinite(d)) bad_field(k, "must be a finite number");
  if (d < lo || d > hi) bad_field(k, "must be in [" + num_str(lo) + ", " + num_str(hi) + "], got " + num_str(d));
  return d;
}

// An integer in [lo, hi]. Integers beyond int64 (nlohmann: unsigned, or a float past 2^64) and floats
// with a fraction are rejected here, before any caller does arithmetic with the value.
int64_t get_int(const json& b, const char* k, int64_t lo, int64_t hi) {
  const auto& v = b[k];
  const auto range = [&](const std::string& got) {
    bad_field(k, "must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + got);
  };
  int64_t x = 0;
  if (v.is_number_unsigned()) {  // nlohmann: every integer >= 0 (0 included), up to 2^64-1
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) range(std::to_string(u));
    x = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::floor(d) != d) bad_field(k, "must be an integer");
    if (d < static_cast<double>(lo) || d > static_cast<double>(hi)) range(num_str(d));
    x = static_cast<int64_t>(d);
  } else {
    bad_field(k, "must be an integer");
  }
  if (x < lo || x > hi) range(std::to_string(x));
  return x;
}

bool get_bool(const json& b, const char* k) {
  if (!b[k].is_boolean()) bad_field(k, "must be a boolean");
  return b[k].get<bool>();
}

std::string get_string(const json& b, const char* k, size_t max_bytes) {
  if (!b[k].is_string()) bad_field(k, "must be a string");
  std::string s = b[k].get<std::string>();
  if (s.size() > max_bytes) bad_field(k, "must be at most " + std::to_string(max_bytes) + " bytes long");
  return s;
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
  ids.reserve(arr.size());
  for (const auto& v : arr) {
    if (!v.is_number_integer()) throw ApiError(400, std::string("'") + param + "' token ids must be integers", param);
    // Unsigned first: get<int64_t>() of 2^64-1 would wrap to -1.
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() < static_cast<uint64_t>(ctx.vocab_size)
                                                 : v.get<int64_t>() >= 0 && v.get<int64_t>() < ctx.vocab_size;
    if (!in_range)
      throw ApiError(400, "token id " + v.dump() + " in '" + param + "' is outside the vocabulary [0, " +
                              std::to_string(ctx.vocab_size) + ")", param);
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
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
      throw ApiError(400, at + ".role must be one of system, developer, user, assistant, tool; got '" +
                              text::utf8_lossy(role.substr(0, 64)) + "'", "messages");
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

// OpenAI's logit_bias: {"token id": bias}, ids in [0, vocab), biases in [-100, 100].
void parse_logit_bias(const json& lb, const ApiContext& ctx, engine::SamplingParams& p) {
  if (!lb.is_object()) bad_field("logit_bias", "must be an object mapping token ids (as strings) to numbers");
  if (lb.size() > kMaxLogitBias)
    bad_field("logit_bias", "may hold at most " + std::to_string(kMaxLogitBias) + " entries");
  std::map<int32_t, float> sorted;
  for (auto it = lb.begin(); it != lb.end(); ++it) {
    const std::string& key = it.key();
    const std::string shown = "'" + text::utf8_lossy(key.substr(0, 32)) + "'";
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 && key.find_first_not_of("0123456789") == std::string::npos) id = std::stoll(key);
    if (id < 0 || id >= ctx.vocab_size)
      bad_field("logit_bias", "keys must be token ids in [0, " + std::to_string(ctx.vocab_size) + "), got " + shown);
    const json& v = it.value();
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() < -kMaxLogitBiasValue ||
        v.get<double>() > kMaxLogitBiasValue)
      bad_field("logit_bias", "values must be numbers in [-100, 100], got " + text::utf8_lossy(v.dump().substr(0, 32)) +
                                  " for " + shown);
    sorted[static_cast<int32_t>(id)] = static_cast<float>(v.get<double>());
  }
  for (const auto& [id, bias] : sorted) {
    p.logit_bias_ids.push_back(id);
    p.logit_bias_values.push_back(bias);
  }
}

// Sampling fields. Ranges are checked on the JSON value, before any narrowing or arithmetic; they
// keep every logit the sampler computes finite (repetition_penalty 1e-45 divided logits to inf: 500).
void parse_sampling(const json& b, const ApiContext& ctx, engine::SamplingParams& p) {
  if (present(b, "temperature")) {
    p.temperature = static_cast<float>(get_number(b, "temperature", 0, kMaxTemperature));
    // vLLM's rule: below 1e-5 is greedy (logits / 1e-30 overflow float).
    if (p.temperature < kGreedyTemperature) p.temperature = 0;
  }
  if (present(b, "top_p")) {
    p.top_p = static_cast<float>(get_number(b, "top_p", 0, 1));
    if (!(p.top_p > 0)) bad_field("top_p", "must be in (0, 1]");  // also a positive value that rounds to 0 as float
  }
  if (present(b, "min_p")) p.min_p = static_cast<float>(get_number(b, "min_p", 0, 1));
  if (present(b, "top_k")) p.top_k = static_cast<int>(get_int(b, "top_k", -1, std::numeric_limits<int32_t>::max()));
  if (present(b, "presence_penalty")) p.presence_penalty = static_cast<float>(get_number(b, "presence_penalty", -2, 2));
  if (present(b, "frequency_penalty"))
    p.frequency_penalty = static_cast<float>(get_number(b, "frequency_penalty", -2, 2));
  if (present(b, "repetition_penalty"))
    p.repetition_penalty =
        static_cast<float>(get_number(b, "repetition_penalty", kMinRepetitionPenalty, kMaxRepetitionPenalty));
  if (present(b, "seed")) {
    // Any 64-bit integer, signed or not (negative seeds wrap to their two's complement).
    const auto& v = b["seed"];
    if (v.is_number_unsigned()) p.seed = v.get<uint64_t>();
    else p.seed = static_cast<uint64_t>(get_int(b, "seed", std::numeric_limits<int64_t>::min(),
                                                 std::numeric_limits<int64_t>::max()));
  }
  if (present(b, "ignore_eos")) p.ignore_eos = get_bool(b, "ignore_eos");
  if (present(b, "stop")) {
    const auto& s = b["stop"];
    if (!s.is_string() && !s.is_array()) bad_field("stop", "must be a string or a list of strings");
    const json list = s.is_string() ? json::array({s}) : s;
    if (list.size() > kMaxStopStrings) bad_field("stop", "may hold at most " + std::to_string(kMaxStopStrings) + " strings");
    for (const auto& x : list) {
      if (!x.is_string()) bad_field("stop", "must be a string or a list of strings");
      if (x.get_ref<const std::string&>().size() > kMaxStopBytes)
        bad_field("stop", "strings must be at most " + std::to_string(kMaxStopBytes) + " bytes long");
      p.stop.push_back(x.get<std::string>());
    }
  }
  if (present(b, "logit_bias")) parse_logit_bias(b["logit_bias"], ctx, p);
  if (present(b, "stop_token_ids")) {
    const auto& s = b["stop_token_ids"];
    if (!s.is_array()) bad_field("stop_token_ids", "must be a list of integers");
    if (s.size() > kMaxStopTokenIds)
      bad_field("stop_token_ids", "may hold at most " + std::to_string(kMaxStopTokenIds) + " ids");
    p.stop_token_ids = token_list(s, ctx, "stop_token_ids");
  }
}

// Fields this server does not implement: rejected when they would change the output, so that a client
// never silently gets something other than what it asked for.
void reject_unsupported(const json& b, bool chat, int n) {
  if (present(b, "echo") && get_bool(b, "echo")) bad_field("echo", "is not supported");
  if (present(b, "best_of") && get_int(b, "best_of", 1, kMaxN) != n)
    bad_field("best_of", "is not supported (only best_of == n)");
  if (!chat && present(b, "suffix") && !(b["suffix"].is_string() && b["suffix"].get_ref<const std::string&>().empty()))
    bad_field("suffix", "is not supported");
  if (present(b, "user")) (void)get_string(b, "user", kMaxUserBytes);
  if (chat && present(b, "parallel_tool_calls")) (void)get_bool(b, "parallel_tool_calls");
}

// logprobs / top_logprobs -> the engine convention (-1: none, else alternatives per token).
int parse_logprobs(const json& b, bool chat) {
  if (chat) {
    const bool lp = present(b, "logprobs") && get_bool(b, "logprobs");
    int top = 0;
    if (present(b, "top_logprobs")) {
      top = static_cast<int>(get_int(b, "top_logprobs", 0, kMaxTopLogprobs));
      if (!lp) bad_field("top_logprobs", "requires 'logprobs': true");
    }
    return lp ? top : -1;
  }
  if (!present(b, "logprobs")) return -1;
  if (b["logprobs"].is_boolean()) bad_field("logprobs", "must be an integer for completions");
  return static_cast<int>(get_int(b, "logprobs", 0, kMaxTopLogprobs));
}

void check_context(int64_t np, int64_t max_model_len, const char* prompt_param) {
  if (np >= max_model_len)
    throw ApiError(400, "This model's maximum context length is " + std::to_string(max_model_len) +
                            " tokens. However, your prompt has " + std::to_string(np) + " tokens.", prompt_param);
}

// max_tokens / max_completion_tokens. Explicit values must fit the context (checked without forming
// np + mt: a value near 2^63 overflowed) and, for a non-streamed request, the response budget. The
// default is vLLM's: 16 for completions, the rest of the context for chat -- lowered for a
// non-streamed request to what the response budget allows.
void parse_max_tokens(const json& b, const ApiContext& ctx, GenRequest& r, int64_t np) {
  const bool chat = r.endpoint == Endpoint::Chat;
  const int64_t room = ctx.max_model_len - np;  // >= 1 (check_context)
  int64_t explicit_mt = -1;
  const char* key = nullptr;
  for (const char* k : {"max_tokens", "max_completion_tokens"}) {
    if (!present(b, k) || (!chat && std::string_view(k) == "max_completion_tokens")) continue;
    const int64_t mt = get_int(b, k, 1, std::numeric_limits<int64_t>::max());
    if (mt > room)
      throw ApiError(400, "This model's maximum context length is " + std::to_string(ctx.max_model_len) +
                              " tokens. However, you requested " + std::to_string(mt) + " completion tokens and the "
                              "prompt has " + std::to_string(np) + " tokens ('" + k + "' may be at most " +
                              std::to_string(room) + ").", k);
    if (explicit_mt < 0 || std::string_view(k) == "max_completion_tokens") explicit_mt = mt, key = k;  // it wins
  }
  const int64_t per_token = response_bytes_per_token(r.top_logprobs);
  const bool bounded = !r.stream && ctx.max_response_bytes > 0;  // a stream holds no logprobs, only its text
  const int64_t fits = bounded ? std::max<int64_t>(1, ctx.max_response_bytes / (per_token * r.n)) : room;
  if (explicit_mt >= 0) {
    if (bounded && explicit_mt > fits)
      throw ApiError(400, "a non-streamed response this large would hold about " +
                              std::to_string(r.n * explicit_mt * per_token >> 20) + " MiB (n " + std::to_string(r.n) +
                              " x '" + key + "' " + std::to_string(explicit_mt) + " x " + std::to_string(per_token) +
                              " bytes per token with these logprobs); the limit is " +
                              std::to_string(ctx.max_response_bytes >> 20) +
                              " MiB: lower 'n', '" + key + "' or 'top_logprobs'/'logprobs', or set 'stream': true",
                     key);
    r.params.max_tokens = static_cast<int>(explicit_mt);
  } else {
    r.params.max_tokens = static_cast<int>(std::min({chat ? room : int64_t{16}, room, fits}));
  }
}

}  // namespace

int64_t response_bytes_per_token(int top_logprobs) {
  return kResponseBytesPerToken + (top_logprobs >= 0 ? (1 + top_logprobs) * kResponseBytesPerLogprob : 0);
}

namespace {
// Everything but GenRequest::body, which the two overloads below copy or move in.
// The request's "model" (the served one when absent); 404 for another, as OpenAI answers.
std::string checked_model(const json& b, const ApiContext& ctx) {
  if (!present(b, "model")) return ctx.model_name;
  std::string m = get_string(b, "model", kMaxModelNameBytes);
  if (m != ctx.model_name)
    throw ApiError(404, "The model '" + text::utf8_lossy(m) + "' does not exist; this server serves '" + ctx.model_name + "'",
                   "model", "invalid_request_error", "model_not_found");
  return m;
}

// The chat template applied to "messages" (a chat request's prompt, or /tokenize of messages).
std::vector<int32_t> render_messages(const json& b, const ApiContext& ctx) {
  check_messages(b);
  try {
    return ctx.chat->render(b);
  } catch (const Error& e) {
    throw ApiError(400, std::string("cannot format the request: ") + e.what(), chat_error_param(e.what()));
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("cannot format the messages: ") + e.what(), "messages");
  }
}

// Fields nobody here reads: 400 naming the first (OpenAI's answer to an unknown parameter), or a warning
// once per name with --allow-unknown-fields.
void check_unknown_fields(Endpoint ep, const json& b, const ApiContext& ctx) {
  const auto& known = known_request_fields(ep);
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    const std::string name = text::utf8_lossy(it.key().substr(0, 64));
    if (!ctx.allow_unknown_fields)
      throw ApiError(400, "Unrecognized request argument supplied: '" + name + "' (k3 serve refuses fields it would "
                          "ignore; start it with --allow-unknown-fields to ignore them with a warning)", name);
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard lk(mu);
    if (warned.size() < 256 && warned.insert(name).second)
      std::fprintf(stderr, "k3 serve: warning: ignoring the unknown request field '%s' (--allow-unknown-fields)\n",
                   name.c_str());
  }
}

// Structured outputs: the body's format (response_format, structured_outputs, guided_*, grammar, json_schema)
// inside the chat format's envelope (with strict tools), compiled off the engine thread.
void parse_structured_output(const json& b, const ApiContext& ctx, GenRequest& r) {
  const bool chat = r.endpoint == Endpoint::Chat;
  std::string param;
  const json body = requested_body_format(b, param);
  json format = body;
  if (chat) {
    try {
      format = ctx.chat->output_format(b, body);
    } catch (const Error& e) {
      throw ApiError(400, std::string("cannot constrain the output: ") + e.what(), param.empty() ? "tools" : param);
    }
    if (param.empty()) param = "tools";  // only strict tools / tool_choice constrain it
  }
  if (format.is_null()) return;
  if (!ctx.grammar)
    throw ApiError(400, "'" + param + "': structured outputs are not available on this server", param);
  grammar::GrammarSpec spec;
  spec.kind = grammar::GrammarSpec::Kind::StructuralTag;
  spec.source = dump(json{{"type", "structural_tag"}, {"format", format}});
  if (chat) {
    spec.stop_ids = ctx.chat->stop_token_ids();
  } else {
    spec.stop_ids = ctx.eos_ids;
    if (spec.stop_ids.empty() && ctx.tok && ctx.tok->eos_id() >= 0) spec.stop_ids.push_back(ctx.tok->eos_id());
  }
  try {
    r.grammar = ctx.grammar->compile(spec);
  } catch (const grammar::GrammarError& e) {
    throw ApiError(400, "'" + param + "': invalid or unsupported grammar / schema: " + text::utf8_lossy(e.what()), param);
  } catch (const grammar::GrammarBusy& e) {
    throw ApiError(503, e.what(), param, "server_error");
  }
}

GenRequest parse_fields(Endpoint ep, const json& b, const ApiContext& ctx) {
  GenRequest r;
  r.endpoint = ep;
  const bool chat = ep == Endpoint::Chat;
  r.show_cached_tokens = ctx.prompt_tokens_details;
  check_unknown_fields(ep, b, ctx);

  r.model = checked_model(b, ctx);

  parse_sampling(b, ctx, r.params);
  if (present(b, "n")) r.n = static_cast<int>(get_int(b, "n", 1, std::min(ctx.max_n, kMaxN)));
  if (present(b, "stream")) r.stream = get_bool(b, "stream");
  if (present(b, "stream_options")) {
    const auto& so = b["stream_options"];
    if (!so.is_object()) bad_field("stream_options", "must be an object");
    if (!r.stream) bad_field("stream_options", "is only allowed when 'stream' is true");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean())
        throw ApiError(400, "'stream_options.include_usage' must be a boolean", "stream_options");
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(b, "cache_salt")) {
    r.cache_salt = get_string(b, "cache_salt", kMaxCacheSaltBytes);
    if (r.cache_salt.empty()) bad_field("cache_salt", "must be a non-empty string");
  }
  reject_unsupported(b, chat, r.n);
  r.top_logprobs = parse_logprobs(b, chat);

  // chat-only fields: type checks; their meaning belongs to the chat adapter
  if (chat) {
    if (present(b, "tools") && !b["tools"].is_array()) bad_field("tools", "must be a list");
    if (present(b, "tool_choice") && !b["tool_choice"].is_string() && !b["tool_choice"].is_object())
      bad_field("tool_choice", "must be a string or an object");
    if (present(b, "reasoning_effort")) (void)get_string(b, "reasoning_effort", 64);
    if (present(b, "chat_template_kwargs") && !b["chat_template_kwargs"].is_object())
      bad_field("chat_template_kwargs", "must be an object");
  }

  // prompt
  const char* prompt_param = chat ? "messages" : "prompt";
  auto& p = r.params;
  if (chat) {
    r.prompt = render_messages(b, ctx);
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
  check_context(np, ctx.max_model_len, prompt_param);
  parse_max_tokens(b, ctx, r, np);
  parse_structured_output(b, ctx, r);

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
}  // namespace

const std::vector<std::string>& known_request_fields(Endpoint ep) {
  // Both endpoints: sampling, output, caching and structured-output fields (OpenAI, vLLM, llama.cpp names).
  static const std::vector<std::string> common = {
      "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
      "presence_penalty", "frequency_penalty", "repetition_penalty", "n", "best_of", "logprobs", "stream",
      "stream_options", "ignore_eos", "cache_salt", "user", "logit_bias", "response_format", "structured_outputs",
      "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend", "grammar",
      "json_schema"};
  static const std::vector<std::string> chat = [] {
    std::vector<std::string> v = common;
    for (const char* k : {"messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice",
                          "parallel_tool_calls", "reasoning_effort", "chat_template_kwargs"})
      v.push_back(k);
    return v;
  }();
  static const std::vector<std::string> completions = [] {
    std::vector<std::string> v = common;
    for (const char* k : {"prompt", "echo", "suffix"}) v.push_back(k);
    return v;
  }();
  return ep == Endpoint::Chat ? chat : completions;
}

GenRequest parse_generation_request(Endpoint ep, const json& b, const ApiContext& ctx) {
  GenRequest r = parse_fields(ep, b, ctx);
  if (ep == Endpoint::Chat) r.body = b;
  return r;
}

GenRequest parse_generation_request(Endpoint ep, json&& b, const ApiContext& ctx) {
  GenRequest r = parse_fields(ep, b, ctx);
  if (ep == Endpoint::Chat) r.body = std::move(b);
  return r;
}

// ---- responses --------------------------------------------------------------------------------

json usage_json(const Usage& u, bool show_cached_tokens) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  // Off by default (vLLM's --enable-prompt-tokens-details): the count tells a client whether someone
  // else sent the same prompt prefix recently.
  if (show_cached_tokens) j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
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

namespace {
void check_answer_bytes(int64_t bytes, const ApiContext& ctx, const char* what) {
  if (ctx.max_response_bytes > 0 && bytes > ctx.max_response_bytes)
    throw ApiError(400, std::string("the ") + what + " answer would take up to " + std::to_string(bytes >> 20) +
                            " MiB, more than the server's limit of " + std::to_string(ctx.max_response_bytes >> 20) +
                            " MiB (--max-response-bytes); send less at once");
}
}  // namespace

json tokenize_response(const json& b, const ApiContext& ctx) {
  (void)checked_model(b, ctx);
  const bool llama_style = present(b, "content");  // llama-server's field; vLLM's is "prompt" (or "messages")
  if (llama_style + present(b, "prompt") + present(b, "messages") != 1)
    throw ApiError(400, "exactly one of 'prompt' (vLLM), 'content' (llama-server) or 'messages' is required", "prompt");
  std::vector<int32_t> ids;
  if (present(b, "messages")) {
    ids = render_messages(b, ctx);
  } else {
    const char* field = llama_style ? "content" : "prompt";
    if (!b[field].is_string()) throw ApiError(400, std::string("'") + field + "' must be a string", field);
    // Special tokens: vLLM's add_special_tokens defaults to true, llama-server's add_special to false.
    const char* special = llama_style ? "add_special" : "add_special_tokens";
    const bool add_bos = present(b, special) ? get_bool(b, special) : !llama_style;
    if (add_bos && ctx.bos >= 0) ids.push_back(ctx.bos);
    const auto enc = ctx.tok->encode(b[field].get<std::string>(), /*allow_special=*/true);
    ids.insert(ids.end(), enc.begin(), enc.end());
  }
  const bool pieces = present(b, "with_pieces") && get_bool(b, "with_pieces");
  // The answer is bounded like a generation's (--max-response-bytes): 8 MB of one letter is ~8 M tokens, and
  // with pieces each is a JSON object (its text escaped: <= 6 bytes per byte).
  int64_t bytes = 0;
  for (int32_t id : ids) bytes += pieces ? 32 + 6 * static_cast<int64_t>(ctx.tok->token_bytes(id).size()) : 12;
  check_answer_bytes(bytes, ctx, "/tokenize");
  json r = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", ctx.max_model_len}};
  if (pieces) {  // llama-server: the text of each token
    json pieces = json::array();
    for (int32_t id : ids) pieces.push_back({{"id", id}, {"piece", token_text(*ctx.tok, id)}});
    r["tokens"] = std::move(pieces);
  }
  return r;
}

json detokenize_response(const json& b, const ApiContext& ctx) {
  (void)checked_model(b, ctx);
  if (!present(b, "tokens") || !b["tokens"].is_array()) throw ApiError(400, "'tokens' must be a list of token ids", "tokens");
  const std::vector<int32_t> ids = token_list(b["tokens"], ctx, "tokens");
  int64_t bytes = 0;  // the text twice (two field names), each byte escaped to <= 6
  for (int32_t id : ids) bytes += 12 * static_cast<int64_t>(ctx.tok->token_bytes(id).size());
  check_answer_bytes(bytes, ctx, "/detokenize");
  const std::string text = ctx.tok->decode(ids);
  return {{"prompt", text}, {"content", text}};  // vLLM's and llama-server's field names
}

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
    for (int i = 0; i < top_n && i < static_cast<int>(lp.top.size()); ++i)  // equal texts: the first (likelier) wins
      top.emplace(token_text(tok, lp.top[i].first), lp.top[i].second);
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

namespace {

// ---- logprobs written as JSON text ------------------------------------------------------------
// A non-streamed response once built its logprobs as an nlohmann DOM (an object node per entry, a
// json value per byte): ~16 KB per token with 20 alternatives, +789 MB for n=16 x 3,000 tokens. The
// text itself is ~1.3 KB per such token, so it is written directly.

void put_string(std::string& out, const std::string& s) { out += dump(json(s)); }
void put_number(std::string& out, double v) { out += json(v).dump(); }
void put_bytes(std::string& out, const std::string& raw) {
  out += '[';
  for (size_t i = 0; i < raw.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(static_cast<unsigned char>(raw[i]));
  }
  out += ']';
}
void put_chat_entry(std::string& out, const text::Tokenizer& tok, int32_t id, float logprob) {
  out += "{\"token\":";
  put_string(out, token_text(tok, id));
  out += ",\"logprob\":";
  put_number(out, logprob);
  out += ",\"bytes\":";
  put_bytes(out, token_raw(tok, id));
}

void put_chat_logprobs(std::string& out, const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok,
                       int top_n) {
  out += "{\"content\":[";
  for (size_t t = 0; t < lps.size(); ++t) {
    if (t) out += ',';
    put_chat_entry(out, tok, lps[t].id, lps[t].logprob);
    out += ",\"top_logprobs\":[";
    for (int i = 0; i < top_n && i < static_cast<int>(lps[t].top.size()); ++i) {
      if (i) out += ',';
      put_chat_entry(out, tok, lps[t].top[i].first, lps[t].top[i].second);
      out += '}';
    }
    out += "]}";
  }
  out += "]}";
}

void put_completion_logprobs(std::string& out, const std::vector<engine::TokenLogprob>& lps,
                             const text::Tokenizer& tok, int top_n) {
  std::vector<std::string> texts;
  texts.reserve(lps.size());
  for (const auto& lp : lps) texts.push_back(token_text(tok, lp.id));
  out += "{\"tokens\":[";
  for (size_t t = 0; t < lps.size(); ++t) {
    if (t) out += ',';
    put_string(out, texts[t]);
  }
  out += "],\"token_logprobs\":[";
  for (size_t t = 0; t < lps.size(); ++t) {
    if (t) out += ',';
    put_number(out, lps[t].logprob);
  }
  out += "],\"top_logprobs\":[";
  for (size_t t = 0; t < lps.size(); ++t) {
    if (t) out += ',';
    if (top_n <= 0) {
      out += "null";
      continue;
    }
    // Keyed by text: two ids with the same text keep the first (more likely) one.
    std::vector<std::string> seen;
    out += '{';
    for (int i = 0; i < top_n && i < static_cast<int>(lps[t].top.size()); ++i) {
      std::string key = token_text(tok, lps[t].top[i].first);
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
      if (!seen.empty()) out += ',';
      put_string(out, key);
      out += ':';
      put_number(out, lps[t].top[i].second);
      seen.push_back(std::move(key));
    }
    out += '}';
  }
  out += "],\"text_offset\":[";
  int64_t off = 0;
  for (size_t t = 0; t < lps.size(); ++t) {
    if (t) out += ',';
    out += std::to_string(off);
    off += static_cast<int64_t>(texts[t].size());
  }
  out += "]}";
}

}  // namespace

std::string build_response_body(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created,
                                 const std::vector<ChoiceState>& choices, const Usage& usage,
                                 const text::Tokenizer& tok) {
  const bool chat = ep == Endpoint::Chat;
  json head = {{"id", id}, {"object", chat ? "chat.completion" : "text_completion"}, {"created", created},
               {"model", req.model}, {"usage", usage_json(usage, req.show_cached_tokens)}};
  std::string out = dump(head);
  out.pop_back();  // '}'
  out += ",\"choices\":[";
  for (size_t i = 0; i < choices.size(); ++i) {
    const auto& c = choices[i];
    json ch = {{"index", static_cast<int>(i)}};
    if (chat) {
      json msg = {{"role", "assistant"}, {"content", c.message.content}};
      if (!c.message.reasoning_content.empty()) msg["reasoning_content"] = c.message.reasoning_content;
      if (!c.message.tool_calls.empty()) msg["tool_calls"] = tool_calls_json(c.message.tool_calls);
      ch["message"] = msg;
    } else {
      ch["text"] = c.text;
    }
    ch["finish_reason"] = openai_finish_reason(c.finish_reason, !c.message.tool_calls.empty());
    if (req.top_logprobs < 0) ch["logprobs"] = nullptr;
    std::string cs = dump(ch);
    if (req.top_logprobs >= 0) {
      cs.pop_back();  // '}'
      cs += ",\"logprobs\":";
      if (chat)
        put_chat_logprobs(cs, c.logprobs, tok, req.top_logprobs);
      else
        put_completion_logprobs(cs, c.logprobs, tok, req.top_logprobs);
      cs += '}';
    }
    if (i) out += ',';
    out += cs;
  }
  out += "]}";
  return out;
}

json build_response(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created,
                    const std::vector<ChoiceState>& choices, const Usage& usage, const text::Tokenizer& tok) {
  return json::parse(build_response_body(ep, req, id, created, choices, usage, tok));
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
              {"usage", usage_json(usage, req.show_cached_tokens)}};
}

json models_json(const std::string& model_name, const std::string& root, int64_t created, int64_t max_model_len) {
  return json{{"object", "list"},
              {"data", json::array({json{{"id", model_name},
                                         {"object", "model"},
                                         {"created", created},
                                         {"owned_by", "k3.cpp"},
                                         {"root", root.empty() ? model_name : root},
                                         {"parent", nullptr},
                                         {"max_model_len", max_model_len}}})}};
}

}  // namespace k3::serve
