// Request parsing / validation and response JSON of the OpenAI API layer (no sockets).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "k3/core/error.h"
#include "k3/serve/chat_adapter.h"
#include "k3/serve/model_chat_adapter.h"
#include "k3/text/chat_format.h"
#include "k3/serve/openai_api.h"
#include "serve_api_fixture.h"
#include "test_util.h"

using k3::serve::ApiError;
using k3::serve::Endpoint;
using nlohmann::json;

namespace {

k3test::ApiFixture& fx() { return k3test::api_fixture(); }

ApiError expect_error(Endpoint ep, const json& body) {
  try {
    k3::serve::parse_generation_request(ep, body, fx().ctx());
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body.dump();
  return ApiError(0, "");
}

std::string long_prompt() {  // > 512 tokens
  std::string s;
  for (int i = 0; i < 40; ++i) s += " b c d e f g h i j k l m n o p q r s t u v w x y z";
  return s;
}

}  // namespace

TEST(ServeApi, TinyTokenizerLayout) {
  EXPECT_EQ(fx().tok.n_vocab(), 1024);
  EXPECT_EQ(fx().tok.bos_id(), 768);
  EXPECT_EQ(fx().tok.eos_id(), 770);
}

TEST(ServeApi, ParseJsonBody) {
  EXPECT_EQ(k3::serve::parse_json_body(R"({"a": 1})")["a"], 1);
  for (std::string bad : {std::string("{\"a\": "), std::string("[1]"), std::string("{\"p\": \"\xff\"}"), std::string()}) {
    try {
      k3::serve::parse_json_body(bad);
      ADD_FAILURE() << bad;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
    }
  }
  try {
    k3::serve::parse_json_body("{\"p\": \"\xc3\"}");
    ADD_FAILURE() << "truncated UTF-8 accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("UTF-8"), std::string::npos);
  }
}

TEST(ServeApi, ParseJsonBodyDepthLimit) {
  // Regression (load test): a body nested a million levels deep crashed the server (recursive
  // nlohmann copy/destroy on the I/O thread's stack). Now 400 before parsing.
  auto nested = [](int d, const char* open, const char* close, const char* mid) {
    std::string s = "{\"a\":";
    for (int i = 0; i < d; ++i) s += open;
    s += mid;
    for (int i = 0; i < d; ++i) s += close;
    return s + "}";
  };
  for (const std::string& bad : {nested(1000000, "[", "]", "1"), nested(200000, "{\"k\":", "}", "1"),
                                 nested(600, "[", "]", "")}) {
    try {
      k3::serve::parse_json_body(bad);
      ADD_FAILURE() << "accepted depth " << bad.size();
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(e.message.find("deeper"), std::string::npos) << e.message;
    }
  }
  // within the limit, and brackets inside strings do not count
  EXPECT_EQ(k3::serve::parse_json_body(nested(k3::serve::kMaxJsonDepth - 2, "[", "]", "7")).size(), 1u);
  EXPECT_EQ(k3::serve::parse_json_body("{\"s\": \"" + std::string(5000, '[') + "\\\"[\"}")["s"].get<std::string>().size(), 5002u);
}

TEST(ServeApi, CompletionDefaults) {
  auto r = k3::serve::parse_generation_request(Endpoint::Completions, {{"prompt", "Hello"}}, fx().ctx());
  EXPECT_EQ(r.model, "tiny");
  ASSERT_FALSE(r.prompt.empty());
  EXPECT_EQ(r.prompt[0], 768);  // BOS
  auto ids = fx().tok.encode("Hello");
  EXPECT_EQ(std::vector<int32_t>(r.prompt.begin() + 1, r.prompt.end()), ids);
  EXPECT_EQ(r.params.max_tokens, 16);
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.top_logprobs, -1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.params.seed.has_value());
}

TEST(ServeApi, CompletionParams) {
  json b = {{"model", "tiny"}, {"prompt", json::array({768, 5, 6})}, {"max_tokens", 10}, {"temperature", 0},
            {"top_p", 0.5}, {"top_k", 7}, {"min_p", 0.1}, {"seed", 42}, {"stop", "ab"}, {"presence_penalty", 1},
            {"frequency_penalty", -1}, {"repetition_penalty", 1.2}, {"n", 3}, {"logprobs", 2}, {"stream", true},
            {"stream_options", {{"include_usage", true}}}, {"ignore_eos", true}};
  auto r = k3::serve::parse_generation_request(Endpoint::Completions, b, fx().ctx());
  EXPECT_EQ(r.prompt, (std::vector<int32_t>{768, 5, 6}));
  EXPECT_EQ(r.params.max_tokens, 10);
  EXPECT_EQ(r.params.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.params.top_p, 0.5f);
  EXPECT_EQ(r.params.top_k, 7);
  EXPECT_EQ(*r.params.seed, 42u);
  EXPECT_EQ(r.params.stop, std::vector<std::string>{"ab"});
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.top_logprobs, 2);
  EXPECT_TRUE(r.stream && r.include_usage && r.params.ignore_eos);
  b["stop"] = json::array({"x", "yz"});
  b.erase("stream_options");
  b["stream"] = false;
  r = k3::serve::parse_generation_request(Endpoint::Completions, b, fx().ctx());
  EXPECT_EQ(r.params.stop.size(), 2u);
}

TEST(ServeApi, ValidationErrorsNameTheParam) {
  const json base = {{"model", "tiny"}, {"prompt", "x"}};
  struct Case {
    json patch;
    std::string param;
    int status = 400;
  };
  std::vector<Case> cases = {
      {{{"temperature", -1}}, "temperature"},      {{{"temperature", "hot"}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},                    {{{"top_p", 1.5}}, "top_p"},
      {{{"min_p", 2}}, "min_p"},                    {{{"top_k", -5}}, "top_k"},
      {{{"top_k", 1.5}}, "top_k"},                  {{{"presence_penalty", 3}}, "presence_penalty"},
      {{{"frequency_penalty", -3}}, "frequency_penalty"}, {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"max_tokens", 0}}, "max_tokens"},          {{{"max_tokens", 511}}, "max_tokens"},
      {{{"n", 0}}, "n"},                            {{{"n", 1000}}, "n"},
      {{{"stop", json::array({""})}}, "stop"},       {{{"stop", 5}}, "stop"},
      {{{"logprobs", 21}}, "logprobs"},             {{{"logprobs", true}}, "logprobs"},
      {{{"stream", "yes"}}, "stream"},              {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},
      {{{"prompt", json::array({2000})}}, "prompt"}, {{{"prompt", 5}}, "prompt"},
      {{{"prompt", long_prompt()}}, "prompt"},
      {{{"seed", "s"}}, "seed"},                    {{{"ignore_eos", 1}}, "ignore_eos"},
      {{{"model", "other"}}, "model", 404},         {{{"model", 3}}, "model"},
  };
  for (const auto& c : cases) {
    json b = base;
    b.update(c.patch);
    auto e = expect_error(Endpoint::Completions, b);
    EXPECT_EQ(e.status, c.status) << b.dump();
    EXPECT_EQ(e.param, c.param) << b.dump() << " -> " << e.message;
    EXPECT_FALSE(e.message.empty());
  }
  json nop = {{"model", "tiny"}};
  EXPECT_EQ(expect_error(Endpoint::Completions, nop).param, "prompt");
}

TEST(ServeApi, ChatParsing) {
  json b = {{"model", "tiny"},
            {"messages", json::array({{{"role", "system"}, {"content", "sys"}}, {{"role", "user"}, {"content", "hi"}}})},
            {"max_completion_tokens", 5}, {"max_tokens", 9}, {"logprobs", true}, {"top_logprobs", 4}};
  auto r = k3::serve::parse_generation_request(Endpoint::Chat, b, fx().ctx());
  EXPECT_EQ(r.params.max_tokens, 5);
  EXPECT_EQ(r.top_logprobs, 4);
  // Independent expectation: the official Jinja template's text for a system + user request
  // (tests/data/chat/k3_goldens.json "system_user") with this request's contents, after [BOS].
  std::vector<int32_t> expect{768};
  {
    std::ifstream gf(k3test::source_path("tests/data/chat/k3_goldens.json"));
    const json goldens = json::parse(gf);
    std::string text;
    for (const auto& c : goldens["cases"])
      if (c["name"] == "system_user") text = c["text"].get<std::string>();
    for (auto [from, to] : {std::pair{"You are a terse assistant.", "sys"}, std::pair{"What is 2+2?", "hi"}}) {
      const size_t at = text.find(from);
      ASSERT_NE(at, std::string::npos) << from;
      text.replace(at, std::strlen(from), to);
    }
    const auto p = fx().tok.encode(text, /*allow_special=*/true);
    expect.insert(expect.end(), p.begin(), p.end());
  }
  EXPECT_EQ(r.prompt, expect);
  EXPECT_EQ(r.params.stop_token_ids, std::vector<int32_t>{770});  // <|end_of_msg|> (= eos here, once)
  // chat default max_tokens: the rest of the context
  b.erase("max_completion_tokens");
  b.erase("max_tokens");
  r = k3::serve::parse_generation_request(Endpoint::Chat, b, fx().ctx());
  EXPECT_EQ(r.params.max_tokens, 512 - static_cast<int>(expect.size()));

  auto bad = [&](json patch, const std::string& param) {
    json x = b;
    x.update(patch);
    EXPECT_EQ(expect_error(Endpoint::Chat, x).param, param) << x.dump();
  };
  bad({{"messages", json::array()}}, "messages");
  bad({{"messages", "hi"}}, "messages");
  bad({{"messages", json::array({{{"role", "wizard"}, {"content", "x"}}})}}, "messages");
  bad({{"messages", json::array({{{"content", "x"}}})}}, "messages");
  bad({{"messages", json::array({{{"role", "user"}, {"content", 5}}})}}, "messages");
  bad({{"logprobs", false}, {"top_logprobs", 2}}, "top_logprobs");
  bad({{"top_logprobs", 30}}, "top_logprobs");
  bad({{"tools", "x"}}, "tools");
  bad({{"tool_choice", 3}}, "tool_choice");
  bad({{"reasoning_effort", 1}}, "reasoning_effort");
  bad({{"chat_template_kwargs", "x"}}, "chat_template_kwargs");
}

TEST(ServeApi, ErrorJsonShape) {
  auto j = k3::serve::error_json(ApiError(400, "bad", "top_p"));
  EXPECT_EQ(j["error"]["message"], "bad");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "top_p");
  EXPECT_TRUE(j["error"]["code"].is_null());
  j = k3::serve::error_json(ApiError(401, "key", "", "invalid_request_error", "invalid_api_key"));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
}

TEST(ServeApi, ResponseShapes) {
  auto r = k3::serve::parse_generation_request(
      Endpoint::Chat, {{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}, {"max_tokens", 3}},
      fx().ctx());
  std::vector<k3::serve::ChoiceState> ch(2);
  ch[0].message.content = "Hi!";
  ch[0].finish_reason = "length";
  ch[1].message.reasoning_content = "think";
  ch[1].message.tool_calls = {{0, "call_1", "f", "{\"a\":"}, {0, "", "", "1}"}};
  ch[1].finish_reason = "stop";
  k3::serve::Usage u{10, 6, 2};
  r.show_cached_tokens = true;  // --enable-prompt-tokens-details
  auto j = k3::serve::build_response(Endpoint::Chat, r, "chatcmpl-x", 123, ch, u, fx().tok);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"], "chatcmpl-x");
  EXPECT_EQ(j["created"], 123);
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["message"]["reasoning_content"], "think");
  EXPECT_EQ(j["choices"][1]["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\":1}");
  EXPECT_EQ(j["choices"][1]["message"]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "tool_calls");
  EXPECT_EQ(j["usage"]["total_tokens"], 16);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 2);

  // streaming: first chunk carries the role, later ones only the delta
  int64_t off = 0;
  k3::serve::ChatDelta d;
  auto c0 = k3::serve::build_chunk(Endpoint::Chat, r, "chatcmpl-x", 1, 0, true, d, "", {}, "", fx().tok, off);
  EXPECT_EQ(c0["object"], "chat.completion.chunk");
  EXPECT_EQ(c0["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(c0["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(c0["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c0.contains("usage"));
  d.content = "yo";
  auto c1 = k3::serve::build_chunk(Endpoint::Chat, r, "chatcmpl-x", 1, 0, false, d, "", {}, "stop", fx().tok, off);
  EXPECT_FALSE(c1["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(c1["choices"][0]["delta"]["content"], "yo");
  EXPECT_EQ(c1["choices"][0]["finish_reason"], "stop");
  r.include_usage = true;
  auto cu = k3::serve::build_usage_chunk(Endpoint::Chat, r, "chatcmpl-x", 1, u);
  EXPECT_TRUE(cu["choices"].empty());
  EXPECT_EQ(cu["usage"]["completion_tokens"], 6);
}

TEST(ServeApi, CompletionLogprobs) {
  auto r = k3::serve::parse_generation_request(Endpoint::Completions, {{"prompt", "x"}, {"logprobs", 1}}, fx().ctx());
  std::vector<k3::engine::TokenLogprob> lps(2);
  lps[0] = {int32_t('a'), -0.5f, {{int32_t('a'), -0.5f}, {int32_t('b'), -1.5f}}};
  lps[1] = {int32_t('b'), -0.25f, {{int32_t('b'), -0.25f}}};
  // byte tokens of the Kimi ranks: find the ids of "a" and "b"
  const int32_t ia = fx().tok.encode("a")[0], ib = fx().tok.encode("b")[0];
  lps[0] = {ia, -0.5f, {{ia, -0.5f}, {ib, -1.5f}}};
  lps[1] = {ib, -0.25f, {{ib, -0.25f}}};
  int64_t off = 0;
  auto j = k3::serve::completion_logprobs(lps, fx().tok, r.top_logprobs, off);
  EXPECT_EQ(j["tokens"], json::array({"a", "b"}));
  EXPECT_EQ(j["token_logprobs"][1], -0.25);
  EXPECT_EQ(j["top_logprobs"][0].size(), 1u);
  EXPECT_EQ(j["top_logprobs"][0]["a"], -0.5);
  EXPECT_EQ(j["text_offset"], json::array({0, 1}));
  EXPECT_EQ(off, 2);
  auto c = k3::serve::chat_logprobs(lps, fx().tok, 2);
  EXPECT_EQ(c[0]["token"], "a");
  EXPECT_EQ(c[0]["bytes"], json::array({97}));
  EXPECT_EQ(c[0]["top_logprobs"].size(), 2u);
}

TEST(ServeApi, DumpReplacesInvalidUtf8) {
  EXPECT_EQ(k3::serve::dump(json("a\xff")), "\"a\xEF\xBF\xBD\"");
}

TEST(ServeApi, ResponseIds) {
  auto a = k3::serve::new_response_id(Endpoint::Chat), b = k3::serve::new_response_id(Endpoint::Chat);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(k3::serve::new_response_id(Endpoint::Completions).rfind("cmpl-", 0), 0u);
}

// /tokenize and /detokenize answers are bounded by --max-response-bytes before they are built (8 MB of one letter
// with pieces was a 184 MB answer built in 5 s); within the bound they round-trip.
TEST(ServeApi, TokenizeAnswersAreBounded) {
  k3::serve::ApiContext ctx = fx().ctx();
  ctx.max_response_bytes = 1 << 20;
  const std::string text(200000, 'a');
  const json t = k3::serve::tokenize_response(json{{"content", "hello world"}, {"with_pieces", true}}, ctx);
  ASSERT_GE(t["tokens"].size(), 1u);
  std::vector<int32_t> ids;
  for (const auto& p : t["tokens"]) ids.push_back(p["id"].get<int32_t>());
  EXPECT_EQ(k3::serve::detokenize_response(json{{"tokens", ids}}, ctx)["content"], "hello world");
  for (const json& body : {json{{"prompt", text}}, json{{"content", text}, {"with_pieces", true}}}) {
    try {
      (void)k3::serve::tokenize_response(body, ctx);
      ADD_FAILURE() << "no error";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_NE(e.message.find("--max-response-bytes"), std::string::npos) << e.message;
    }
  }
  const std::vector<int32_t> many(200000, ids[0]);
  EXPECT_THROW((void)k3::serve::detokenize_response(json{{"tokens", many}}, ctx), ApiError);
  ctx.max_response_bytes = 0;  // no bound configured
  EXPECT_EQ(k3::serve::detokenize_response(json{{"tokens", many}}, ctx)["content"].get<std::string>().size() % 200000, 0u);
}
