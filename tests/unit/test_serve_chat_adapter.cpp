// The model chat adapter (ChatFormat + OutputParser behind the server's ChatAdapter seam) and the
// server's response assembly: the same scripted engine outputs, assembled as a stream of chunks
// (merged as a client does) and as one non-streamed response, give identical content /
// reasoning_content / tool_calls / finish_reason. No model needed.
#include <gtest/gtest.h>

#include <random>

#include "k3/serve/model_chat_adapter.h"
#include "k3/serve/openai_api.h"
#include "k3/text/chat_format.h"
#include "test_util.h"
#include "tokenizer_test_util.h"

using k3::engine::OutputPiece;
using k3::serve::ApiError;
using k3::serve::Endpoint;
using nlohmann::json;

namespace {

// tests/data/tiny-tokenizer: [BOS] 768, <|end_of_msg|> 770, <|open|> 771, <|close|> 772, <|sep|> 773.
const k3::text::Tokenizer& tiny() {
  static const auto t = k3::text::Tokenizer::load(k3test::source_path("tests/data/tiny-tokenizer"));
  return t;
}
const k3::serve::ChatAdapter& adapter() {
  static const auto a = k3::serve::make_model_chat_adapter("kimi_k3", tiny(), {768, {770, 769}});
  return *a;
}
k3::serve::ApiContext ctx() {
  k3::serve::ApiContext c;
  c.model_name = "tiny";
  c.tok = &tiny();
  c.chat = &adapter();
  c.bos = 768;
  c.max_model_len = 2048;
  c.vocab_size = 1024;
  return c;
}

// Marker-spelled model output -> pieces (special ids; text between them split into 1..4-byte runs).
std::vector<OutputPiece> pieces_of(const std::string& script, const k3::text::Tokenizer& tok, std::mt19937* rng) {
  std::vector<OutputPiece> out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (run.empty()) return;
    const std::string t = tok.decode(run);
    run.clear();
    if (!rng) {
      out.push_back({-1, t});
      return;
    }
    for (size_t i = 0; i < t.size();) {
      size_t n = 1 + (*rng)() % 4;
      n = std::min(n, t.size() - i);
      out.push_back({-1, t.substr(i, n)});  // ASCII scripts: any split is valid UTF-8
      i += n;
    }
  };
  for (int32_t id : tok.encode(script, /*allow_special=*/true)) {
    if (tok.is_special(id)) {
      flush();
      out.push_back({id, ""});
    } else {
      run.push_back(id);
    }
  }
  flush();
  return out;
}

struct Assembled {
  json message;          // non-streamed choices[0].message
  std::string finish;    // non-streamed finish_reason
  json streamed;         // stream merged the way the openai client does
  std::string stream_finish;
};

// Runs one choice through the server's assembly (server.cpp on_output): per engine step
// chat_step() -> build_chunk (stream) and ChoiceState.message.append (non-stream).
Assembled assemble(const json& body, const std::vector<OutputPiece>& pieces, const std::string& engine_reason,
                   std::mt19937& rng) {
  const auto gr = k3::serve::parse_generation_request(Endpoint::Chat, body, ctx());
  auto p_stream = adapter().make_parser(gr.body, "chatcmpl-abc-0");
  auto p_full = adapter().make_parser(gr.body, "chatcmpl-abc-0");
  k3::serve::ChoiceState c;
  Assembled a;
  a.streamed = {{"content", ""}, {"reasoning_content", ""}, {"tool_calls", json::array()}};
  bool first = true;
  // random engine steps of 1..3 pieces; the full parser gets the same steps in one go per step too
  size_t i = 0;
  while (true) {
    const size_t n = std::min<size_t>(1 + rng() % 3, pieces.size() - i);
    std::vector<OutputPiece> step(pieces.begin() + i, pieces.begin() + i + n);
    i += n;
    const bool finished = i == pieces.size();
    auto delta = k3::serve::chat_step(*p_stream, step, finished);
    const bool had_calls = !c.message.tool_calls.empty() || !delta.tool_calls.empty();
    int64_t off = 0;
    const std::string fr = finished ? k3::serve::openai_finish_reason(engine_reason, had_calls) : "";
    if (first || !delta.empty() || finished) {
      json ch = k3::serve::build_chunk(Endpoint::Chat, gr, "chatcmpl-abc", 1, 0, first, delta, "", {}, fr, tiny(), off);
      first = false;
      const json& d = ch["choices"][0]["delta"];
      if (d.contains("content")) a.streamed["content"] = a.streamed["content"].get<std::string>() + d["content"].get<std::string>();
      if (d.contains("reasoning_content"))
        a.streamed["reasoning_content"] =
            a.streamed["reasoning_content"].get<std::string>() + d["reasoning_content"].get<std::string>();
      for (const auto& t : d.value("tool_calls", json::array())) {
        auto& tcs = a.streamed["tool_calls"];
        const int idx = t["index"];
        while (static_cast<int>(tcs.size()) <= idx)
          tcs.push_back({{"id", ""}, {"type", "function"}, {"function", {{"name", ""}, {"arguments", ""}}}});
        if (t.contains("id")) tcs[idx]["id"] = t["id"];
        if (t["function"].contains("name")) tcs[idx]["function"]["name"] = t["function"]["name"];
        tcs[idx]["function"]["arguments"] =
            tcs[idx]["function"]["arguments"].get<std::string>() + t["function"]["arguments"].get<std::string>();
      }
      if (!ch["choices"][0]["finish_reason"].is_null()) a.stream_finish = ch["choices"][0]["finish_reason"];
    }
    c.message.append(k3::serve::chat_step(*p_full, step, finished));
    if (finished) break;
  }
  c.finish_reason = engine_reason;
  json r = k3::serve::build_response(Endpoint::Chat, gr, "chatcmpl-abc", 1, {c}, {}, tiny());
  a.message = r["choices"][0]["message"];
  a.finish = r["choices"][0]["finish_reason"];
  return a;
}

void expect_same(const Assembled& a) {
  EXPECT_EQ(a.streamed["content"], a.message["content"]);
  EXPECT_EQ(a.streamed["reasoning_content"], a.message.value("reasoning_content", json("")));
  EXPECT_EQ(a.streamed["tool_calls"], a.message.value("tool_calls", json::array()));
  EXPECT_EQ(a.stream_finish, a.finish);
}

json body(json extra = json::object()) {
  json b = {{"model", "tiny"}, {"messages", json::array({{{"role", "user"}, {"content", "Weather in Paris?"}}})}};
  b.update(extra);
  return b;
}

json tools() {
  return json::array({{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "Weather of a city"},
                         {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
}

const std::string kCall =
    "Let me check.<|close|>think<|sep|><|open|>response<|sep|>Checking<|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>"
    "{\"city\": \"Paris\"}<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
    "<|end_of_msg|>";
const std::string kPlain =
    "The user greets.<|close|>think<|sep|><|open|>response<|sep|>Hello there!<|close|>response<|sep|>"
    "<|close|>message<|sep|><|end_of_msg|>";

}  // namespace

TEST(ServeChatAdapter, RenderIsBosPlusFormat) {
  // Independent expectation: the text the official Jinja template renders for the same request
  // (tests/data/chat/k3_goldens.json, python/gen_chat_goldens.py), encoded with the markers as specials,
  // after [BOS]; not the ChatFormat under test.
  const json goldens = k3test::load_json(k3test::source_path("tests/data/chat/k3_goldens.json"));
  int checked = 0;
  for (const auto& c : goldens["cases"]) {
    // user_typed_markers: re-encoding the text would turn the user's typed markers into control tokens
    if (!c["add_generation_prompt"].get<bool>() || c["name"] == "user_typed_markers") continue;
    json b = c["request"];
    b["model"] = "tiny";
    std::vector<int32_t> expect = tiny().encode(c["text"].get<std::string>(), /*allow_special=*/true);
    expect.insert(expect.begin(), 768);
    EXPECT_EQ(adapter().render(b), expect) << c["name"];
    ++checked;
  }
  EXPECT_GE(checked, 5);
  EXPECT_EQ(adapter().stop_token_ids(), (std::vector<int32_t>{770, 769}));  // format's first, eos deduped
}

TEST(ServeChatAdapter, ReasoningContentAndNoMarkers) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto a = assemble(body(), pieces_of(kPlain, tiny(), &rng), "stop", rng);
    expect_same(a);
    EXPECT_EQ(a.message["content"], "Hello there!");
    EXPECT_EQ(a.message["reasoning_content"], "The user greets.");
    EXPECT_EQ(a.finish, "stop");
    EXPECT_FALSE(a.message.contains("tool_calls"));
  }
  // thinking off: the prompt opens the response channel; everything is content
  std::mt19937 rng(7);
  auto a = assemble(body({{"chat_template_kwargs", {{"thinking", false}}}}),
                    pieces_of("Hi!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", tiny(), &rng), "stop", rng);
  expect_same(a);
  EXPECT_EQ(a.message["content"], "Hi!");
  EXPECT_FALSE(a.message.contains("reasoning_content"));
}

TEST(ServeChatAdapter, ToolCallsStreamEqualsNonStream) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    auto a = assemble(body({{"tools", tools()}}), pieces_of(kCall, tiny(), &rng), "stop", rng);
    expect_same(a);
    EXPECT_EQ(a.finish, "tool_calls");
    EXPECT_EQ(a.message["reasoning_content"], "Let me check.");
    EXPECT_EQ(a.message["content"], "Checking");
    ASSERT_EQ(a.message["tool_calls"].size(), 1u);
    const auto& tc = a.message["tool_calls"][0];
    EXPECT_EQ(tc["id"], "call_abc-0_1");  // per-request prefix + the call's index
    EXPECT_EQ(tc["type"], "function");
    EXPECT_EQ(tc["function"]["name"], "get_weather");
    ASSERT_TRUE(tc["function"]["arguments"].is_string());
    EXPECT_EQ(json::parse(tc["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  }
  // cut off by max_tokens mid-call: finish_reason stays "length", both ways alike
  std::mt19937 rng(3);
  const std::string cut = kCall.substr(0, kCall.find("Paris"));
  auto a = assemble(body({{"tools", tools()}}), pieces_of(cut, tiny(), &rng), "length", rng);
  expect_same(a);
  EXPECT_EQ(a.finish, "length");
}

TEST(ServeChatAdapter, CallIdsUniquePerChoice) {
  const json b = body({{"tools", tools()}});
  auto p0 = adapter().make_parser(b, "chatcmpl-x1-0"), p1 = adapter().make_parser(b, "chatcmpl-x1-1");
  std::string ids[2];
  int k = 0;
  for (auto* p : {p0.get(), p1.get()}) {
    auto d = k3::serve::chat_step(*p, pieces_of(kCall, tiny(), nullptr), true);
    ASSERT_EQ(d.tool_calls.size(), 1u);
    ids[k++] = d.tool_calls[0].id;
  }
  EXPECT_EQ(ids[0], "call_x1-0_1");
  EXPECT_NE(ids[0], ids[1]);
}

TEST(ServeChatAdapter, ToolChoice) {
  // none: tools still declared (plus the template's tool-choice note), calls never extracted
  std::mt19937 rng(5);
  auto a = assemble(body({{"tools", tools()}, {"tool_choice", "none"}}), pieces_of(kCall, tiny(), &rng), "stop", rng);
  expect_same(a);
  EXPECT_FALSE(a.message.contains("tool_calls"));
  EXPECT_EQ(a.finish, "stop");
  EXPECT_EQ(a.message["content"], "Checking");
  // required / named are enforced by the grammar engine (test_structured_output.cpp: the answer is the call
  // alone); a server without one answers 400 rather than ignoring them.
  for (const json& choice : {json("required"), json{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}) {
    try {
      k3::serve::parse_generation_request(Endpoint::Chat, body({{"tools", tools()}, {"tool_choice", choice}}), ctx());
      ADD_FAILURE() << "tool_choice " << choice.dump() << " accepted without a grammar engine";
    } catch (const k3::serve::ApiError& e) {
      EXPECT_NE(std::string(e.what()).find("structured outputs are not available"), std::string::npos) << e.what();
    }
  }
  auto err = [](const json& b) {
    try {
      k3::serve::parse_generation_request(Endpoint::Chat, b, ctx());
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      return e.param;
    }
    ADD_FAILURE() << b.dump();
    return std::string();
  };
  EXPECT_EQ(err(body({{"tool_choice", "required"}})), "tool_choice");
  EXPECT_EQ(err(body({{"tools", tools()}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}})),
            "tool_choice");
  EXPECT_EQ(err(body({{"tool_choice", "sometimes"}})), "tool_choice");
  EXPECT_EQ(err(body({{"tools", json::array({{{"type", "function"}}})}})), "tools");
  EXPECT_EQ(err(body({{"reasoning_effort", "extreme"}})), "reasoning_effort");
  EXPECT_EQ(err(body({{"messages", json::array({{{"role", "user"}, {"content", json::array({{{"type", "image_url"}}})}}})}})),
            "messages");
}

TEST(ServeChatAdapter, K2Format) {
  K3_SKIP_WITHOUT_SHARED();
  static const auto tok =
      k3::text::Tokenizer::load_files(k3test::kKimiModel, k3test::kTokData + "k2_tokenizer_config.json");
  auto a = k3::serve::make_model_chat_adapter("kimi_linear", tok, {-1, {}});
  const int32_t im_end = *tok.token_id("<|im_end|>");
  EXPECT_EQ(a->stop_token_ids(), std::vector<int32_t>{im_end});
  const json b = body({{"tools", tools()}});
  auto p = a->make_parser(b, "chatcmpl-q-0");
  auto d = k3::serve::chat_step(
      *p, pieces_of("<think>hmm</think>ok<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
                    "<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
                    tok, nullptr),
      true);
  EXPECT_EQ(d.reasoning_content, "hmm");
  EXPECT_EQ(d.content, "ok");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].id, "functions.get_weather:0");
}
