// Structured outputs: the grammar engine (xgrammar over the tiny K3-marker vocabulary) and the API fields
// that ask for it. A sequence sampled at temperature 2 from random logits under a grammar's mask is always
// a sentence of the grammar (regex, JSON schema, a strict tool call inside K3's XTML tool section); bad
// schemas / grammars / fields are 400s naming the field; unknown fields are 400s unless allowed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <regex>

#include "k3/grammar/grammar_engine.h"
#include "k3/sampling/token_sampling.h"
#include "k3/serve/openai_api.h"
#include "serve_api_fixture.h"

namespace {

using k3::grammar::GrammarEngine;
using k3::grammar::GrammarSpec;
using k3::serve::ApiError;
using k3::serve::Endpoint;
using json = nlohmann::json;

#ifdef K3_HAVE_GRAMMAR

const GrammarEngine& engine() {
  static GrammarEngine e(k3test::api_fixture().tok, 1024);
  return e;
}

// Samples under the grammar from random logits until it terminates (or `limit` tokens); returns the ids
// before the stop token.
std::vector<int32_t> sample_under(const k3::grammar::CompiledGrammar& g, uint64_t seed, int limit, bool* terminated) {
  auto m = g.new_matcher();
  std::vector<uint32_t> mask(static_cast<size_t>(g.mask_words()));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<int32_t> out;
  *terminated = false;
  for (int step = 0; step < limit; ++step) {
    m->fill_allowed(mask);
    std::vector<float> logits(1024);
    for (auto& x : logits) x = nd(rng);
    k3::sampling::RowSampling r;
    r.temperature = 2.0f;
    r.allowed = mask;
    r.u = std::uniform_real_distribution<double>(0, 1)(rng);
    const auto res = k3::sampling::sample_row(logits, r);
    EXPECT_EQ(res.status, k3::sampling::SampleStatus::Ok);
    if (res.status != k3::sampling::SampleStatus::Ok) return out;
    EXPECT_TRUE(m->accept(res.token)) << "the grammar refused the token its own mask allowed: " << res.token;
    if (m->terminated()) {
      *terminated = true;
      return out;
    }
    out.push_back(res.token);
  }
  return out;
}

TEST(StructuredOutput, RegexSamplesMatchTheRegex) {
  const int32_t eos = k3test::api_fixture().tok.eos_id();
  GrammarSpec spec{GrammarSpec::Kind::Regex, "[a-c]{3}-[0-9]{2,4}", {eos}};
  const auto g = engine().compile(spec);
  int done = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    bool term = false;
    const auto ids = sample_under(*g, seed, 64, &term);
    const std::string text = k3test::api_fixture().tok.decode(ids);
    if (!term) continue;
    ++done;
    EXPECT_TRUE(std::regex_match(text, std::regex("[a-c]{3}-[0-9]{2,4}"))) << text;
  }
  EXPECT_EQ(done, 30);  // the regex is bounded: every sample ends
}

TEST(StructuredOutput, JsonSchemaSamplesValidate) {
  const int32_t eos = k3test::api_fixture().tok.eos_id();
  const json schema = {{"type", "object"},
                       {"properties",
                        {{"n", {{"type", "integer"}, {"minimum", 0}, {"maximum", 99}}},
                         {"c", {{"enum", {"red", "green"}}}},
                         {"ok", {{"type", "boolean"}}}}},
                       {"required", {"n", "c", "ok"}},
                       {"additionalProperties", false}};
  GrammarSpec spec{GrammarSpec::Kind::JsonSchema, schema.dump(), {eos}};
  const auto g = engine().compile(spec);
  int done = 0;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    bool term = false;
    const auto ids = sample_under(*g, seed, 200, &term);
    if (!term) continue;
    ++done;
    const json v = json::parse(k3test::api_fixture().tok.decode(ids));
    ASSERT_TRUE(v.is_object());
    EXPECT_EQ(v.size(), 3u);
    EXPECT_TRUE(v["n"].is_number_integer() && v["n"].get<int>() >= 0 && v["n"].get<int>() <= 99) << v;
    EXPECT_TRUE(v["c"] == "red" || v["c"] == "green") << v;
    EXPECT_TRUE(v["ok"].is_boolean()) << v;
  }
  EXPECT_GE(done, 20);
}

// A chat request with a strict tool and tool_choice "required": the compiled grammar (built by the API
// layer) lets only `<|open|>tools<|sep|><|open|>call tool="get" ...` through, with schema-valid arguments,
// parsed back by the chat adapter's parser into a tool call whose arguments validate.
TEST(StructuredOutput, StrictToolCallInsideTheXtmlSection) {
  auto& fx = k3test::api_fixture();
  auto ctx = fx.ctx();
  ctx.grammar = &engine();
  const json body = json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
      "chat_template_kwargs": {"thinking": false}, "tool_choice": "required",
      "tools": [{"type": "function", "function": {"name": "get", "strict": true, "parameters": {"type": "object",
        "properties": {"k": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["k"],
        "additionalProperties": false}}}]})");
  const auto r = k3::serve::parse_generation_request(Endpoint::Chat, body, ctx);
  ASSERT_TRUE(r.grammar);
  int calls = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    bool term = false;
    const auto ids = sample_under(*r.grammar, seed, 200, &term);
    if (!term) continue;
    auto parser = ctx.chat->make_parser(body, "chatcmpl-x-0");
    for (int32_t id : ids)
      parser->feed(fx.tok.is_special(id) ? k3::text::OutputPiece{id, {}} : k3::text::OutputPiece{-1, fx.tok.decode({&id, 1})});
    k3::serve::ChatDelta d = parser->take_delta();
    d.append(parser->finish());
    const json tc = k3::serve::tool_calls_json(d.tool_calls);
    ASSERT_GE(tc.size(), 1u) << fx.tok.decode(ids);
    for (const auto& c : tc) {
      EXPECT_EQ(c["function"]["name"], "get");
      const json args = json::parse(c["function"]["arguments"].get<std::string>());
      EXPECT_TRUE(args["k"].is_number_integer() && args["k"] >= 1 && args["k"] <= 9) << args;
      ++calls;
    }
  }
  EXPECT_GE(calls, 10);
}

TEST(StructuredOutput, ApiFieldsBuildAGrammarOrA400NamingTheField) {
  auto& fx = k3test::api_fixture();
  auto ctx = fx.ctx();
  ctx.grammar = &engine();
  auto parse = [&](Endpoint ep, const std::string& extra) {
    const std::string base = ep == Endpoint::Chat ? R"({"messages": [{"role": "user", "content": "hi"}])"
                                                  : R"({"prompt": "hi")";
    return k3::serve::parse_generation_request(ep, json::parse(base + (extra.empty() ? "" : ", " + extra) + "}"), ctx);
  };
  for (const char* ok : {R"("response_format": {"type": "json_object"})",
                         R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}})",
                         R"("structured_outputs": {"regex": "[0-9]+"})", R"("structured_outputs": {"choice": ["a", "b"]})",
                         R"("guided_json": {"type": "array"})", R"("guided_regex": "x+")", R"("guided_choice": ["y"])",
                         R"("guided_grammar": "root ::= \"a\"")", R"("grammar": "root ::= [a-z]+")",
                         R"("json_schema": {"type": "object"})"}) {
    EXPECT_TRUE(parse(Endpoint::Chat, ok).grammar) << ok;
    EXPECT_TRUE(parse(Endpoint::Completions, ok).grammar) << ok;
  }
  EXPECT_FALSE(parse(Endpoint::Chat, R"("response_format": {"type": "text"})").grammar);
  EXPECT_FALSE(parse(Endpoint::Chat, "").grammar);
  struct Bad {
    const char* extra;
    const char* param;
  };
  for (const Bad& b : std::vector<Bad>{
           {R"("response_format": {"type": "yaml"})", "response_format"},
           {R"("response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}})", "response_format"},
           {R"("response_format": {"type": "json_schema", "json_schema": {"schema": 5}})", "response_format"},
           {R"("structured_outputs": {"regex": "("})", "structured_outputs"},
           {R"("structured_outputs": {"regex": "a", "choice": ["b"]})", "structured_outputs"},
           {R"("structured_outputs": {"whitespace_pattern": "a"})", "structured_outputs"},
           {R"("guided_regex": "[")", "guided_regex"},
           {R"("guided_choice": [])", "guided_choice"},
           {R"("grammar": "root ::= (")", "grammar"},
           {R"("grammar": "root ::= \"a\"", "guided_regex": "b")", "grammar"},
           {R"("guided_decoding_backend": "outlines")", "guided_decoding_backend"},
           {R"("logit_bias": {"5": 101})", "logit_bias"},
           {R"("logit_bias": {"1024": 1})", "logit_bias"},
           {R"("logit_bias": {"-1": 1})", "logit_bias"},
           {R"("logit_bias": {"x": 1})", "logit_bias"},
           {R"("logit_bias": {"5": "1"})", "logit_bias"},
           {R"("frobnicate": 1)", "frobnicate"},
           {R"("tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}], "tool_choice": "required")", "tools"},
       }) {
    try {
      parse(Endpoint::Chat, b.extra);
      ADD_FAILURE() << "accepted: " << b.extra;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400) << b.extra;
      EXPECT_EQ(e.param, b.param) << b.extra << " -> " << e.message;
    }
  }
  // logit_bias reaches the sampling parameters, sorted by id.
  const auto lb = parse(Endpoint::Completions, R"("logit_bias": {"9": -100, "2": 5.5})");
  EXPECT_EQ(lb.params.logit_bias_ids, (std::vector<int32_t>{2, 9}));
  EXPECT_EQ(lb.params.logit_bias_values, (std::vector<float>{5.5f, -100.0f}));
  // --allow-unknown-fields: a warning, not a 400.
  ctx.allow_unknown_fields = true;
  EXPECT_NO_THROW(parse(Endpoint::Chat, R"("frobnicate": 1)"));
}

TEST(StructuredOutput, OversizedGrammarIsA400) {
  auto ctx = k3test::api_fixture().ctx();
  k3::grammar::GrammarEngineOptions o;
  o.max_source_bytes = 1000;
  GrammarEngine small(k3test::api_fixture().tok, 1024, o);
  ctx.grammar = &small;
  const json body = {{"prompt", "x"}, {"grammar", "root ::= \"" + std::string(2000, 'a') + "\""}};
  try {
    k3::serve::parse_generation_request(Endpoint::Completions, body, ctx);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "grammar");
  }
}

#endif  // K3_HAVE_GRAMMAR

TEST(StructuredOutput, WithoutAGrammarEngineTheFieldsAre400NotIgnored) {
  auto ctx = k3test::api_fixture().ctx();  // ctx.grammar == nullptr
  try {
    k3::serve::parse_generation_request(Endpoint::Chat,
                                        json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
                                                        "response_format": {"type": "json_object"}})"), ctx);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "response_format");
  }
}

}  // namespace
