// Issue 11: every request field is range-checked before use (a bad value is a 400 naming the field,
// never UB or a 500), what one request may hold is bounded, and cached-token counts are hidden by default.
#include <gtest/gtest.h>

#include <map>

#include "k3/serve/model_chat_adapter.h"
#include "k3/serve/openai_api.h"
#include "k3/text/utf8.h"
#include "serve_api_fixture.h"
#include "test_util.h"

using k3::serve::ApiError;
using k3::serve::Endpoint;
using nlohmann::json;

namespace {

k3test::ApiFixture& fx() { return k3test::api_fixture(); }

// A request body with one extra field given as raw JSON text (so that 1e400 etc. reach the parser).
std::string body_with(Endpoint ep, const std::string& field, const std::string& raw) {
  const std::string base = ep == Endpoint::Chat ? R"({"messages":[{"role":"user","content":"hi"}])" : R"({"prompt":"hi")";
  return base + ",\"" + field + "\":" + raw + "}";
}

k3::serve::GenRequest parse_text(Endpoint ep, const std::string& text, const k3::serve::ApiContext& ctx) {
  return k3::serve::parse_generation_request(ep, k3::serve::parse_json_body(text), ctx);
}

struct BadCase {
  Endpoint ep;
  std::string field, raw;
};

}  // namespace

TEST(ServeLimits, EveryBadFieldValueIs400NamingTheField) {
  const Endpoint C = Endpoint::Chat, P = Endpoint::Completions;
  const std::string many_stops = [] {
    json a = json::array();
    for (int i = 0; i < 65; ++i) a.push_back("s" + std::to_string(i));
    return a.dump();
  }();
  const std::string many_ids = [] {
    json a = json::array();
    for (int i = 0; i < 1025; ++i) a.push_back(5);
    return a.dump();
  }();
  const std::vector<BadCase> cases = {
      {C, "temperature", "1e400"}, {C, "temperature", "-1"}, {C, "temperature", "1e300"}, {C, "temperature", "\"1\""},
      {C, "top_p", "0"}, {C, "top_p", "1.5"}, {C, "top_p", "1e-60"}, {C, "top_p", "-1e400"},
      {C, "min_p", "-0.1"}, {C, "min_p", "1e400"},
      {C, "top_k", "-2"}, {C, "top_k", "1e300"}, {C, "top_k", "3000000000"}, {C, "top_k", "1.5"},
      {C, "presence_penalty", "3"}, {C, "frequency_penalty", "-1e400"},
      {C, "repetition_penalty", "1e-45"}, {C, "repetition_penalty", "0"}, {C, "repetition_penalty", "1e30"},
      {C, "seed", "1.5"}, {C, "seed", "\"1\""}, {C, "seed", "1e300"}, {C, "seed", "18446744073709551616"},
      {C, "max_tokens", "9223372036854775807"}, {P, "max_tokens", "9223372036854775807"},
      {P, "max_tokens", "18446744073709551615"}, {P, "max_tokens", "1e400"}, {P, "max_tokens", "0"},
      {P, "max_tokens", "-1"}, {P, "max_tokens", "1.5"}, {P, "max_tokens", "511"},
      {C, "max_completion_tokens", "9223372036854775807"}, {C, "max_completion_tokens", "0"},
      {C, "n", "0"}, {C, "n", "17"}, {C, "n", "129"}, {C, "n", "9223372036854775807"},
      {P, "logprobs", "21"}, {P, "logprobs", "-1"}, {P, "logprobs", "true"}, {C, "logprobs", "1"},
      {C, "top_logprobs", "21"},
      {C, "stop", many_stops}, {C, "stop", "\"" + std::string(1025, 'x') + "\""}, {C, "stop", "[1]"},
      {C, "stop", "5"}, {C, "stop", "[\"\"]"},
      {P, "stop_token_ids", many_ids}, {P, "stop_token_ids", "[-1]"}, {P, "stop_token_ids", "[18446744073709551615]"},
      {P, "stop_token_ids", "[1.5]"}, {P, "stop_token_ids", "[1024]"},
      {P, "logit_bias", "{\"5\": 101}"}, {P, "logit_bias", "[]"},
      {P, "echo", "true"}, {P, "echo", "\"yes\""}, {P, "best_of", "2"}, {P, "best_of", "1e400"},
      {C, "cache_salt", "\"\""}, {C, "cache_salt", "5"}, {C, "cache_salt", "\"" + std::string(1025, 's') + "\""},
      {C, "response_format", "{\"type\": \"json_object\"}"}, {P, "suffix", "\"tail\""},
      {C, "user", "5"}, {C, "stream", "\"yes\""}, {C, "ignore_eos", "1"}, {C, "parallel_tool_calls", "\"no\""},
      {C, "reasoning_effort", "5"}, {C, "tools", "{}"},
  };
  for (const auto& c : cases) {
    const std::string text = body_with(c.ep, c.field, c.raw);
    try {
      parse_text(c.ep, text, fx().ctx());
      ADD_FAILURE() << "accepted: " << text.substr(0, 200);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << text.substr(0, 200);
      EXPECT_EQ(e.param, c.field) << text.substr(0, 200) << " -> " << e.message;
      EXPECT_NE(e.message.find(c.field), std::string::npos) << e.message;
    }
  }
}

TEST(ServeLimits, EdgeValuesThatAreValid) {
  auto ctx = fx().ctx();
  auto ok = [&](Endpoint ep, const std::string& f, const std::string& raw) { return parse_text(ep, body_with(ep, f, raw), ctx); };
  EXPECT_EQ(*ok(Endpoint::Chat, "seed", "18446744073709551615").params.seed, 18446744073709551615ull);
  EXPECT_EQ(*ok(Endpoint::Chat, "seed", "-1").params.seed, 18446744073709551615ull);
  EXPECT_EQ(ok(Endpoint::Chat, "temperature", "1e-30").params.temperature, 0.0f);  // greedy, not logits / 1e-30
  EXPECT_EQ(ok(Endpoint::Chat, "top_k", "-1").params.top_k, -1);
  EXPECT_EQ(ok(Endpoint::Chat, "max_tokens", "2.0").params.max_tokens, 2);
  EXPECT_EQ(ok(Endpoint::Completions, "logit_bias", "{}").params.max_tokens, 16);
  EXPECT_EQ(ok(Endpoint::Chat, "response_format", "{\"type\":\"text\"}").n, 1);
  EXPECT_EQ(ok(Endpoint::Chat, "cache_salt", "\"tenant-a\"").cache_salt, "tenant-a");
  EXPECT_EQ(ok(Endpoint::Chat, "best_of", "1").n, 1);
  // Exactly the rest of the context.
  const auto r = ok(Endpoint::Completions, "max_tokens", "1");
  const std::string room = std::to_string(ctx.max_model_len - static_cast<int64_t>(r.prompt.size()));
  EXPECT_EQ(ok(Endpoint::Completions, "max_tokens", room).params.max_tokens, std::stoi(room));
}

TEST(ServeLimits, MaxTokensDefaults) {
  auto ctx = fx().ctx();
  const auto chat = parse_text(Endpoint::Chat, body_with(Endpoint::Chat, "n", "1"), ctx);
  EXPECT_EQ(chat.params.max_tokens, ctx.max_model_len - static_cast<int64_t>(chat.prompt.size()));
  EXPECT_EQ(parse_text(Endpoint::Completions, body_with(Endpoint::Completions, "n", "1"), ctx).params.max_tokens, 16);
  // max_completion_tokens wins over max_tokens, but both are checked.
  auto both = parse_text(Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"max_completion_tokens":7})", ctx);
  EXPECT_EQ(both.params.max_tokens, 7);
}

TEST(ServeLimits, NonStreamedResponseBytesAreBounded) {
  auto ctx = fx().ctx();
  ctx.max_n = 16;
  const int64_t per = k3::serve::response_bytes_per_token(20);
  ctx.max_response_bytes = 16 * 100 * per;  // room for n=16 x 100 tokens with 20 alternatives
  const std::string base = R"({"messages":[{"role":"user","content":"hi"}],"n":16,"logprobs":true,"top_logprobs":20)";
  // Explicit max_tokens beyond the bound: 400 naming the field and what to lower.
  try {
    parse_text(Endpoint::Chat, base + R"(,"max_tokens":101})", ctx);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "max_tokens");
    for (const char* f : {"'n'", "max_tokens", "top_logprobs", "stream"}) EXPECT_NE(e.message.find(f), std::string::npos) << e.message;
  }
  EXPECT_EQ(parse_text(Endpoint::Chat, base + R"(,"max_tokens":100})", ctx).params.max_tokens, 100);
  // Default max_tokens: lowered to what fits.
  EXPECT_EQ(parse_text(Endpoint::Chat, base + "}", ctx).params.max_tokens, 100);
  // A stream holds no logprobs: not bounded by it.
  EXPECT_EQ(parse_text(Endpoint::Chat, base + R"(,"max_tokens":300,"stream":true})", ctx).params.max_tokens, 300);
  ctx.max_response_bytes = 0;  // no bound
  EXPECT_EQ(parse_text(Endpoint::Chat, base + R"(,"max_tokens":300})", ctx).params.max_tokens, 300);
}

TEST(ServeLimits, ResponseBodyFitsThePerTokenEstimate) {
  // The admission estimate must not undercount what the response needs (20 alternatives of tokens of up
  // to 16 bytes; longer ones are rare, and the estimate is documented as assuming that).
  auto ctx = fx().ctx();
  auto r = parse_text(Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":20})", ctx);
  std::vector<k3::serve::ChoiceState> ch(1);
  int32_t longest = 0;
  for (int32_t id = 0; id < fx().tok.n_vocab(); ++id)
    if (!fx().tok.is_special(id) && fx().tok.token_bytes(id).size() <= 16 &&
        fx().tok.token_bytes(id).size() > fx().tok.token_bytes(longest).size())
      longest = id;
  const int tokens = 200;
  for (int t = 0; t < tokens; ++t) {
    k3::engine::TokenLogprob lp{longest, -1.2345678f, {}};
    for (int i = 0; i < 20; ++i) lp.top.push_back({longest, -0.123456789f * (i + 1)});
    ch[0].logprobs.push_back(lp);
  }
  const std::string body = k3::serve::build_response_body(Endpoint::Chat, r, "chatcmpl-x", 1, ch, {}, fx().tok);
  const int64_t per_token = static_cast<int64_t>(body.size()) / tokens;
  EXPECT_LE(per_token + static_cast<int64_t>(sizeof(k3::engine::TokenLogprob)) + 20 * 8 + 16,
            k3::serve::response_bytes_per_token(20))
      << "longest token " << fx().tok.token_bytes(longest).size() << " bytes";
  // The text form parses back to the same structure the DOM form had.
  const json j = json::parse(body);
  ASSERT_EQ(j["choices"][0]["logprobs"]["content"].size(), static_cast<size_t>(tokens));
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 20u);
  EXPECT_FLOAT_EQ(j["choices"][0]["logprobs"]["content"][0]["logprob"].get<float>(), -1.2345678f);
}

TEST(ServeLimits, CachedTokenCountsHiddenUnlessEnabled) {
  auto ctx = fx().ctx();
  const std::string body = R"({"messages":[{"role":"user","content":"hi"}]})";
  k3::serve::Usage u{10, 2, 8};
  auto r = parse_text(Endpoint::Chat, body, ctx);
  EXPECT_FALSE(k3::serve::build_response(Endpoint::Chat, r, "x", 1, {}, u, fx().tok)["usage"].contains("prompt_tokens_details"));
  EXPECT_FALSE(k3::serve::build_usage_chunk(Endpoint::Chat, r, "x", 1, u)["usage"].contains("prompt_tokens_details"));
  ctx.prompt_tokens_details = true;
  r = parse_text(Endpoint::Chat, body, ctx);
  EXPECT_EQ(k3::serve::build_response(Endpoint::Chat, r, "x", 1, {}, u, fx().tok)["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
}

TEST(ServeLimits, PromptEdgeCases) {
  auto ctx = fx().ctx();
  auto err = [&](Endpoint ep, const std::string& text) {
    try {
      parse_text(ep, text, ctx);
    } catch (const ApiError& e) {
      return std::to_string(e.status) + " " + e.param;
    }
    return std::string();  // accepted
  };
  const std::string prompt400 = "400 prompt";
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[[1,2],[3]]})"), prompt400);         // a batch of two
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[18446744073709551615]})"), prompt400);  // not -1
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[1024]})"), prompt400);
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[1.0]})"), prompt400);
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[]})"), prompt400);
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":{}})"), prompt400);
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[[]]})"), prompt400);
  EXPECT_EQ(err(Endpoint::Completions, R"({"prompt":[[5,6]]})"), "");
  std::string too_long = R"({"prompt":[)";
  for (int i = 0; i < 512; ++i) too_long += (i ? ",5" : "5");
  EXPECT_EQ(err(Endpoint::Completions, too_long + "]}"), prompt400);
  // Lone surrogates are not JSON text a parser accepts: 400 before any field is read.
  try {
    k3::serve::parse_json_body(R"({"prompt":"\ud800"})");
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
  }
  EXPECT_EQ(err(Endpoint::Chat, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})").substr(0, 3), "400");
  EXPECT_EQ(err(Endpoint::Chat, R"({"messages":[{"role":"user","content":5}]})").substr(0, 3), "400");
  // Found by fuzz_request: a content part whose type is not a string threw json::type_error (500).
  EXPECT_EQ(err(Endpoint::Chat, R"({"messages":[{"role":"user","content":[{"type":1.1,"text":"Hi"}]}]})").substr(0, 3), "400");
  EXPECT_EQ(err(Endpoint::Chat, R"({"messages":[{"role":"user","content":"hi"}],"model":"other"})").substr(0, 3), "404");
}

// The non-streamed response writes logprobs as text (openai_api.cpp put_*_logprobs); a stream builds
// them as JSON (chat_logprobs / completion_logprobs). Both must say the same thing, including for two
// alternatives whose texts coincide (completions key top_logprobs by text: the first, likelier, wins).
TEST(ServeLimits, TextLogprobsEqualTheStreamedForm) {
  auto ctx = fx().ctx();
  const auto& tok = fx().tok;
  int32_t dup_a = -1, dup_b = -1;  // two ids with the same rendered text (e.g. lone UTF-8 bytes -> U+FFFD)
  std::map<std::string, int32_t> by_text;
  for (int32_t id = 0; id < tok.n_vocab() && dup_b < 0; ++id) {
    if (tok.is_special(id)) continue;
    const std::string t = k3::text::utf8_lossy(tok.token_bytes(id));  // as the response renders it
    if (auto [it, fresh] = by_text.emplace(t, id); !fresh) dup_a = it->second, dup_b = id;
  }
  ASSERT_GE(dup_b, 0) << "no two tokens share a text: the duplicate-key case is not exercised";
  const int32_t ia = tok.encode("a")[0], ib = tok.encode("b")[0];
  std::vector<k3::engine::TokenLogprob> lps = {
      {ia, -0.5f, {{ia, -0.5f}, {dup_a, -1.25f}, {dup_b, -2.5f}, {ib, -3.0f}}},
      {dup_b, -0.1234567f, {{dup_b, -0.1234567f}, {ia, -7.75f}}},
      {ib, -1e-8f, {}},
  };
  for (Endpoint ep : {Endpoint::Chat, Endpoint::Completions}) {
    for (int top : {0, 1, 3, 20}) {
      const std::string body = ep == Endpoint::Chat
          ? R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":)" + std::to_string(top) + "}"
          : R"({"prompt":"hi","logprobs":)" + std::to_string(top) + "}";
      auto r = parse_text(ep, body, ctx);
      std::vector<k3::serve::ChoiceState> ch(2);
      ch[0].logprobs = lps;
      ch[1].logprobs = {lps[1]};
      const json j = json::parse(k3::serve::build_response_body(ep, r, "id", 1, ch, {}, tok));
      for (size_t c = 0; c < ch.size(); ++c) {
        int64_t off = 0;
        const json want = ep == Endpoint::Chat
                              ? json{{"content", k3::serve::chat_logprobs(ch[c].logprobs, tok, r.top_logprobs)}}
                              : k3::serve::completion_logprobs(ch[c].logprobs, tok, r.top_logprobs, off);
        EXPECT_EQ(j["choices"][c]["logprobs"], want) << (ep == Endpoint::Chat ? "chat" : "completions") << " top " << top;
      }
    }
  }
}
