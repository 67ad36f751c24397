// OpenAI-compatible request parsing / validation and response JSON building. No sockets here: the
// HTTP layer (http_server.cpp) calls these, and the unit tests call them directly.
#pragma once
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "k3/engine/engine_api.h"
#include "k3/grammar/grammar_engine.h"
#include "k3/serve/chat_adapter.h"
#include "k3/text/tokenizer.h"

namespace k3::serve {

// An error answered as {"error": {"message", "type", "param", "code"}} with an HTTP status.
struct ApiError : std::exception {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
  ApiError(int st, std::string msg, std::string param_ = {}, std::string type_ = "invalid_request_error",
           std::string code_ = {})
      : status(st), message(std::move(msg)), type(std::move(type_)), param(std::move(param_)), code(std::move(code_)) {}
  const char* what() const noexcept override { return message.c_str(); }
};
nlohmann::json error_json(const ApiError& e);

// Compact JSON; invalid UTF-8 in strings (e.g. a lone byte token's text) becomes U+FFFD.
std::string dump(const nlohmann::json& j);

// Deepest array/object nesting a request body may have. nlohmann::json parses iteratively but copies,
// compares and dumps recursively: an 8 MiB body of `[[[[...` nested a million deep overflowed the stack.
inline constexpr int kMaxJsonDepth = 512;

// Body -> JSON object. 400 for invalid UTF-8, invalid JSON, nesting deeper than kMaxJsonDepth or a non-object.
nlohmann::json parse_json_body(std::string_view body);

enum class Endpoint { Chat, Completions };

// Per-request bounds (docs/serving.md "Request limits"). OpenAI's caps where it has one.
inline constexpr int kMaxN = 128;                      // OpenAI: n <= 128 (ApiContext::max_n may be lower)
inline constexpr int kMaxTopLogprobs = 20;             // OpenAI: top_logprobs <= 20; completions logprobs too
inline constexpr size_t kMaxStopStrings = 64;          // OpenAI allows 4; vLLM any number
inline constexpr size_t kMaxStopBytes = 1024;          // per stop string: the matcher holds back this much text
inline constexpr size_t kMaxStopTokenIds = 1024;
inline constexpr size_t kMaxCacheSaltBytes = 1024;
inline constexpr size_t kMaxUserBytes = 1024;
inline constexpr size_t kMaxModelNameBytes = 1024;
inline constexpr size_t kMaxLogitBias = 1024;          // logit_bias entries (OpenAI documents no cap; vLLM none)
inline constexpr double kMaxLogitBiasValue = 100;      // OpenAI: [-100, 100]
inline constexpr double kMaxTemperature = 1e6;
inline constexpr double kGreedyTemperature = 1e-5;     // below: greedy (vLLM's _SAMPLING_EPS)
// Keeps penalised logits finite: |logit| / 0.01 and * 100 stay far inside float range.
inline constexpr double kMinRepetitionPenalty = 0.01, kMaxRepetitionPenalty = 100;
// What a non-streamed response holds per generated token and choice until it is sent: its text and
// books, plus per logprob entry (the chosen token and each alternative) the stored (id, logprob) and
// its JSON text ({"token":...,"logprob":...,"bytes":[...]}: ~48 + 5 x the token's bytes), for tokens of
// up to 16 bytes (test ServeLimits.ResponseBodyFitsThePerTokenEstimate).
inline constexpr int64_t kResponseBytesPerToken = 64, kResponseBytesPerLogprob = 144;
int64_t response_bytes_per_token(int top_logprobs);

struct ApiContext {
  std::string model_name;              // the served model name (requests naming another -> 404)
  // GET /v1/models "root": the served model's path (vLLM's field), so that a client on this host, such as
  // `k3 bench serve`, can load its tokenizer. Empty: the model name.
  std::string model_root;
  const text::Tokenizer* tok = nullptr;
  const ChatAdapter* chat = nullptr;
  int32_t bos = -1;                    // prepended to string prompts of /v1/completions
  int64_t max_model_len = 4096;
  int64_t vocab_size = 0;
  int max_n = 16;                      // cap on n (at most kMaxN)
  // Non-streamed requests: n * max_tokens * response_bytes_per_token(top_logprobs) must fit; explicit
  // max_tokens beyond it -> 400, the default max_tokens is lowered to fit. 0: no bound.
  int64_t max_response_bytes = int64_t{64} << 20;
  bool prompt_tokens_details = false;  // usage.prompt_tokens_details.cached_tokens shown (a side channel)
  // Structured outputs (response_format, structured_outputs, guided_*, grammar, strict tools); null: such
  // requests get 400.
  const grammar::GrammarEngine* grammar = nullptr;
  std::vector<int32_t> eos_ids;        // what ends a /v1/completions output under a grammar (default: tok's EOS)
  // Request fields this server does not know: 400 naming the field (OpenAI), or with this set
  // (--allow-unknown-fields) a warning on stderr, once per field name.
  bool allow_unknown_fields = false;
};

// POST /tokenize (vLLM: "prompt" with add_special_tokens, default true, or "messages" through the chat
// template; llama-server: "content" with add_special, default false, and with_pieces) ->
// {"tokens", "count", "max_model_len"}; POST /detokenize ({"tokens": [ids]}) -> {"prompt", "content"}: the
// text, under both projects' names. 400 for anything malformed, 404 for another model's name.
nlohmann::json tokenize_response(const nlohmann::json& body, const ApiContext& ctx);
nlohmann::json detokenize_response(const nlohmann::json& body, const ApiContext& ctx);

struct GenRequest {
  Endpoint endpoint = Endpoint::Completions;
  nlohmann::json body;                 // the request, kept for chat only (its output parser reads tools)
  std::string model;
  std::vector<int32_t> prompt;
  engine::SamplingParams params;       // seed: choice i uses seed + i
  int n = 1;
  int top_logprobs = -1;               // engine convention: -1 none, else alternatives per token
  bool stream = false, include_usage = false;
  std::string cache_salt;              // prefix-cache hits only between requests with the same salt
  bool show_cached_tokens = false;     // ApiContext::prompt_tokens_details
  std::shared_ptr<const grammar::CompiledGrammar> grammar;  // structured outputs; null: unconstrained
};

// The request fields of an endpoint this server honours (or checks and refuses a value of); anything else
// is a 400 naming it unless ctx.allow_unknown_fields.
const std::vector<std::string>& known_request_fields(Endpoint ep);

// Validates everything and builds the prompt (chat: through ctx.chat->render). Throws ApiError.
GenRequest parse_generation_request(Endpoint ep, const nlohmann::json& body, const ApiContext& ctx);
// The same, taking the body over: the server's path, which so avoids a copy of a body of megabytes.
GenRequest parse_generation_request(Endpoint ep, nlohmann::json&& body, const ApiContext& ctx);

// ---- responses --------------------------------------------------------------------------------

// Accumulated result of one choice.
struct ChoiceState {
  std::string text;                     // completions: generated text
  ChatDelta message;                    // chat: accumulated reasoning / content / tool call fragments
  std::vector<engine::TokenLogprob> logprobs;
  int64_t text_offset = 0;              // completions logprobs: offset of the next token
  std::string finish_reason;            // empty while running
  int64_t completion_tokens = 0;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
// prompt_tokens_details (cached_tokens) only when show_cached_tokens.
nlohmann::json usage_json(const Usage& u, bool show_cached_tokens = true);

// Request ids: "chatcmpl-<hex>" / "cmpl-<hex>".
std::string new_response_id(Endpoint ep);

// OpenAI's finish_reason for an engine one (+ "tool_calls" when the parser produced calls).
std::string openai_finish_reason(const std::string& engine_reason, bool has_tool_calls);

// chat logprobs.content entries / completions logprobs object for some tokens.
nlohmann::json chat_logprobs(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok, int top_n);
nlohmann::json completion_logprobs(const std::vector<engine::TokenLogprob>& lps, const text::Tokenizer& tok,
                                   int top_n, int64_t& text_offset);

// Merges consecutive tool-call fragments of the same index into complete calls.
nlohmann::json tool_calls_json(const std::vector<ToolCallDelta>& frags);

// Non-streaming response body as JSON text (logprobs written directly: no per-entry DOM nodes).
std::string build_response_body(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created,
                                const std::vector<ChoiceState>& choices, const Usage& usage,
                                const text::Tokenizer& tok);
// The same, parsed (for tests).
nlohmann::json build_response(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created,
                              const std::vector<ChoiceState>& choices, const Usage& usage,
                              const text::Tokenizer& tok);

// One streaming chunk for one choice. For chat, `delta` is what to send (role added by the caller
// for the first chunk through `first`); for completions, `text`. logprobs may be empty.
nlohmann::json build_chunk(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created, int index,
                           bool first, const ChatDelta& delta, const std::string& text,
                           const std::vector<engine::TokenLogprob>& lps, const std::string& finish_reason,
                           const text::Tokenizer& tok, int64_t& text_offset);
// Final usage-only chunk (stream_options.include_usage): "choices": [].
nlohmann::json build_usage_chunk(Endpoint ep, const GenRequest& req, const std::string& id, int64_t created,
                                 const Usage& usage);

// GET /v1/models body.
nlohmann::json models_json(const std::string& model_name, const std::string& root, int64_t created, int64_t max_model_len);

}  // namespace k3::serve
