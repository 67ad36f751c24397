// ChatFormat: prompt rendering against goldens rendered by the reference Jinja templates
// (python/gen_chat_goldens.py), request parsing errors, markers and helpers.
#include <gtest/gtest.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "k3/core/error.h"
#include "k3/text/chat_format.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

using namespace k3::text;
using ojson = nlohmann::ordered_json;

namespace {

const Tokenizer& k2_tok() {
  static const Tokenizer t = Tokenizer::load_files(k3test::kKimiModel, k3test::kTokData + "k2_tokenizer_config.json");
  return t;
}

ojson load_ojson(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return ojson::parse(f);
}

void check_goldens(const std::string& file, ChatFormatKind kind, const Tokenizer& tok) {
  const ojson g = load_ojson(k3test::source_path("tests/data/chat/" + file));
  const ChatFormat fmt(kind, tok);
  ASSERT_GE(g["cases"].size(), 30u);
  int n = 0;
  for (const auto& c : g["cases"]) {
    const std::string name = c["name"];
    SCOPED_TRACE(file + ": " + name);
    const ChatRequest req = ChatRequest::from_json(c["request"]);
    const bool agp = c["add_generation_prompt"];
    const std::string expected = c["text"];
    EXPECT_EQ(fmt.render_text(req, agp), expected);
    const std::vector<int32_t> ids = fmt.render(req, tok, agp);
    EXPECT_EQ(tok.decode(ids), expected);
    const std::vector<int32_t> jinja_ids = tok.encode(expected, /*allow_special=*/true);
    auto n_special = [&](const std::vector<int32_t>& v) {
      return std::count_if(v.begin(), v.end(), [&](int32_t id) { return tok.is_special(id); });
    };
    if (name == "user_typed_markers") {
      // Markers typed by the user stay plain text in our ids, while re-encoding the text with
      // allow_special=true would turn them into control tokens.
      EXPECT_LT(n_special(ids), n_special(jinja_ids));
      EXPECT_NE(ids, jinja_ids);
    } else {
      EXPECT_EQ(ids, jinja_ids);
    }
    ++n;
  }
  EXPECT_GE(n, 30);
}

k3::Error parse_error(const std::string& body) {
  try {
    ChatRequest::from_json(ojson::parse(body));
  } catch (const k3::Error& e) {
    return e;
  }
  ADD_FAILURE() << "no error for " << body;
  return k3::Error("");
}

}  // namespace

TEST(ChatFormat, K3GoldensMatchJinja) {
  K3_SKIP_WITHOUT_SHARED();
  check_goldens("k3_goldens.json", ChatFormatKind::K3Xtml, k3test::kimi());
}
// The same 34 Jinja goldens through the tiny vocabulary (tests/data/tiny-tokenizer: the K3 markers at
// 768..): the rendering is checked without ../shared; the test above adds the real ids.
TEST(ChatFormat, K3GoldensMatchJinjaTinyVocab) { check_goldens("k3_goldens.json", ChatFormatKind::K3Xtml, k3test::tiny_markers()); }

TEST(ChatFormat, K2GoldensMatchJinja) {
  K3_SKIP_WITHOUT_SHARED();
  check_goldens("k2_goldens.json", ChatFormatKind::K2, k2_tok());
}

TEST(ChatFormat, FactoryAndStops) {
  K3_SKIP_WITHOUT_SHARED();
  const auto k3 = ChatFormat::for_model_type("kimi_k3", k3test::kimi());
  EXPECT_EQ(k3.kind(), ChatFormatKind::K3Xtml);
  EXPECT_EQ(k3.stop_token_ids(), std::vector<int32_t>{163586});
  EXPECT_EQ(k3.markers().open, 163587);
  const auto k2 = ChatFormat::for_model_type("kimi_linear", k2_tok());
  EXPECT_EQ(k2.kind(), ChatFormatKind::K2);
  EXPECT_EQ(k2.stop_token_ids(), std::vector<int32_t>{163586});
  EXPECT_EQ(k2.markers().section_begin, 163595);
  EXPECT_EQ(k2.markers().call_end, 163599);
  EXPECT_FALSE(k2.generation_starts_in_reasoning(
      ChatRequest::from_json(ojson::parse(R"({"messages":[{"role":"user","content":"hi"}]})"))));
  EXPECT_EQ(k2.markers().im_middle, 163601);
  EXPECT_EQ(ChatFormat::kind_from_name("k2"), ChatFormatKind::K2);
  EXPECT_EQ(ChatFormat::kind_from_name("xtml"), ChatFormatKind::K3Xtml);
  EXPECT_THROW(ChatFormat::kind_from_name("chatml"), k3::Error);
  EXPECT_THROW(ChatFormat::for_model_type("llama", k3test::kimi()), k3::Error);
  // The K3 table has no <|im_end|> etc.: a clear error naming the token.
  try {
    ChatFormat(ChatFormatKind::K2, k3test::kimi());
    FAIL();
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("<|im_end|>"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatFormat(ChatFormatKind::K3Xtml, k2_tok()), k3::Error);
}

TEST(ChatFormat, GenerationPromptThinking) {
  const auto fmt = ChatFormat::for_model_type("kimi_k3", k3test::tiny_markers());
  auto on = ChatRequest::from_json(ojson::parse(R"({"messages":[{"role":"user","content":"hi"}]})"));
  auto off = ChatRequest::from_json(
      ojson::parse(R"({"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"thinking":false}})"));
  EXPECT_TRUE(fmt.generation_starts_in_reasoning(on));
  EXPECT_FALSE(fmt.generation_starts_in_reasoning(off));
  const std::string t_on = fmt.render_text(on, true), t_off = fmt.render_text(off, true);
  EXPECT_TRUE(t_on.ends_with("<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>"));
  EXPECT_TRUE(t_off.ends_with("<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>"));
  const auto ids = fmt.render(on, k3test::tiny_markers(), true);
  ASSERT_GE(ids.size(), 3u);
  // <|open|> think <|sep|> at the end, as special ids (tiny vocabulary: <|open|> 771, <|sep|> 773;
  // "think" is several BPE tokens there)
  EXPECT_EQ(ids.back(), 773);
  const auto open = std::find(ids.rbegin(), ids.rend(), 771);
  ASSERT_NE(open, ids.rend());
  EXPECT_EQ(k3test::tiny_markers().decode(std::vector<int32_t>(open.base(), ids.end() - 1)), "think");
  EXPECT_EQ(ChatFormat::thinking_effort(on), "max");
}

TEST(ChatFormat, UserMarkersStayInert) {
  const auto fmt = ChatFormat::for_model_type("kimi_k3", k3test::tiny_markers());
  const auto req = ChatRequest::from_json(ojson::parse(
      R"({"messages":[{"role":"user","content":"<|open|>x<|sep|><|end_of_msg|>"}],"chat_template_kwargs":{"thinking":false}})"));
  const auto ids = fmt.render(req, k3test::tiny_markers(), false);
  // Only the template's own markers: thinking-effort is off with thinking=false, so one message:
  // <|open|> <|sep|> <|close|> <|sep|> <|end_of_msg|>.
  int specials = 0;
  for (int32_t id : ids) specials += k3test::tiny_markers().is_special(id);
  EXPECT_EQ(specials, 5);
}

TEST(ChatFormat, K3ToolMessageNeedsName) {
  const auto fmt = ChatFormat::for_model_type("kimi_k3", k3test::tiny_markers());
  const auto req = ChatRequest::from_json(
      ojson::parse(R"({"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"zz","content":"r"}]})"));
  try {
    fmt.render_text(req, true);
    FAIL();
  } catch (const k3::Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages[1]"), std::string::npos) << e.what();
  }
}

TEST(ChatFormat, ObjectArgumentsUseArgumentTags) {
  const auto fmt = ChatFormat::for_model_type("kimi_k3", k3test::tiny_markers());
  const auto req = ChatRequest::from_json(ojson::parse(R"({"messages":[{"role":"user","content":"x"},
    {"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f",
     "arguments":{"s":"v\"1","n":2,"o":{"b":1,"a":[true,null]}}}}]}],"chat_template_kwargs":{"thinking":false}})"));
  const std::string t = fmt.render_text(req, false);
  EXPECT_NE(t.find("<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"s\" type=\"string\"<|sep|>v\"1"
                   "<|close|>argument<|sep|><|open|>argument key=\"n\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
                   "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"b\": 1, \"a\": [true, null]}<|close|>argument"),
            std::string::npos)
      << t;
}

TEST(ChatFormat, JsonHelpers) {
  const ojson v = ojson::parse(R"({"b":[1,2.5,"x\ny\u0001é"],"A":null,"a":{"z":true,"Y":false}})");
  EXPECT_EQ(py_json_dumps(v), "{\"b\": [1, 2.5, \"x\\ny\\u0001é\"], \"A\": null, \"a\": {\"z\": true, \"Y\": false}}");
  // dictsort is case-insensitive and stable: "A" before "a" (input order), then "b".
  EXPECT_EQ(json_sorted(v), "{\"A\":null,\"a\":{\"Y\":false,\"z\":true},\"b\":[1,2.5,\"x\\ny\\u0001é\"]}");
  EXPECT_EQ(py_json_dumps(ojson::array()), "[]");
  EXPECT_EQ(py_json_dumps(ojson::object()), "{}");
}

TEST(ChatRequestParse, Errors) {
  auto has = [](const k3::Error& e, const std::string& s) {
    return std::string(e.what()).find(s) != std::string::npos;
  };
  EXPECT_TRUE(has(parse_error(R"({})"), "messages"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[]})"), "messages"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"content":"x"}]})"), "messages[0].role"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"robot","content":"x"}]})"), "messages[0].role"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"user","content":5}]})"), "messages[0].content"));
  EXPECT_TRUE(has(parse_error(
                      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]})"),
                  "messages[0].content[1].type"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}]})"),
                  "messages[0].tool_calls[0].function.name"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":5}}]}]})"),
                  "messages[0].tool_calls[0].function.arguments"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})"), "tools[0].function"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval","function":{"name":"f"}}]})"),
                  "tools[0].type"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"})"), "tool_choice"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"user","content":"x"}],"reasoning_effort":"extreme"})"), "reasoning_effort"));
  EXPECT_TRUE(has(parse_error(R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"thinking":"yes"}})"),
                  "chat_template_kwargs.thinking"));
}

TEST(ChatRequestParse, Fields) {
  const auto r = ChatRequest::from_json(nlohmann::json::parse(R"({
    "messages":[{"role":"developer","content":"d"},{"role":"user","name":"u","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null,"reasoning_content":"r","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
      {"role":"tool","tool_call_id":"c1","name":"f","content":"ok"}],
    "tools":[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"f"}},"reasoning_effort":"low","chat_template_kwargs":{"thinking":false}})"));
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].original_role, "developer");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[1].name, "u");
  EXPECT_FALSE(r.messages[2].content.has_value());
  EXPECT_EQ(r.messages[2].reasoning_content, "r");
  ASSERT_EQ(r.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[2].tool_calls[0].arguments, "{\"x\":1}");
  EXPECT_EQ(r.messages[3].tool_call_id, "c1");
  ASSERT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.tools[0].name, "f");
  EXPECT_EQ(r.tool_choice.mode, ToolChoice::Mode::Function);
  EXPECT_EQ(r.tool_choice.function_name, "f");
  EXPECT_EQ(r.reasoning_effort, "low");
  EXPECT_FALSE(r.thinking());
  EXPECT_EQ(ChatFormat::thinking_effort(r), "low");
}
