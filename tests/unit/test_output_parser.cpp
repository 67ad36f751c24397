// OutputParser: scripted model outputs for both formats, fed whole and fragmented, malformed
// outputs, and a randomized property test of the streaming guarantee.
#include <gtest/gtest.h>

#include <random>

#include "k3/text/output_parser.h"
#include "tokenizer_test_util.h"

using namespace k3::text;
using k3::text::OutputPiece;

namespace {

const Tokenizer& k2_tok() {
  static const Tokenizer t = Tokenizer::load_files(k3test::kKimiModel, k3test::kTokData + "k2_tokenizer_config.json");
  return t;
}
const ChatFormat& k3_fmt() {
  // the tiny vocabulary's K3 markers (768..): the K3 tests run without ../shared
  static const ChatFormat f(ChatFormatKind::K3Xtml, k3test::tiny_markers());
  return f;
}
const ChatFormat& k2_fmt() {
  static const ChatFormat f(ChatFormatKind::K2, k2_tok());
  return f;
}

// Model output written with marker strings -> pieces: special ids, and the text between them as
// one text piece per run (what the engine's stream decoder delivers, modulo fragmentation).
std::vector<OutputPiece> pieces_of(const std::string& script, const Tokenizer& tok) {
  std::vector<OutputPiece> out;
  std::vector<int32_t> run;
  auto flush = [&] {
    if (!run.empty()) out.push_back({-1, tok.decode(run)});
    run.clear();
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

struct Collected {
  ParseResult result;
  ParserDelta joined;  // concatenation of all deltas
  std::vector<std::string> call_ids, call_names;
};

// Feeds pieces (optionally splitting text into random 1-3 byte fragments and taking deltas at
// random points) and checks the streaming guarantee.
Collected run(const ChatFormat& fmt, const OutputParserOptions& opts, const std::vector<OutputPiece>& pieces,
              uint32_t seed, bool fragment) {
  OutputParser p(fmt, opts);
  std::mt19937 rng(seed);
  Collected c;
  auto absorb = [&](ParserDelta d) {
    c.joined.reasoning_content += d.reasoning_content;
    c.joined.content += d.content;
    for (auto& t : d.tool_calls) {
      if (t.index >= static_cast<int>(c.joined.tool_calls.size())) {
        EXPECT_EQ(t.index, static_cast<int>(c.joined.tool_calls.size()));  // calls start in order
        EXPECT_FALSE(t.name.empty() && t.id.empty());
        c.joined.tool_calls.push_back({t.index, t.id, t.name, ""});
      } else {
        EXPECT_TRUE(t.id.empty() && t.name.empty());  // id/name only in the first delta
      }
      c.joined.tool_calls[t.index].arguments += t.arguments;
    }
  };
  for (const auto& piece : pieces) {
    if (piece.special_id >= 0 || !fragment) {
      p.feed(piece);
    } else {
      for (size_t i = 0; i < piece.text.size();) {
        size_t n = std::min<size_t>(1 + rng() % 3, piece.text.size() - i);
        p.feed({-1, piece.text.substr(i, n)});
        i += n;
        if (rng() % 2) absorb(p.take_delta());
      }
    }
    if (!fragment || rng() % 2) absorb(p.take_delta());
  }
  c.result = p.finish();
  absorb(p.take_delta());
  EXPECT_TRUE(p.take_delta().empty());
  EXPECT_EQ(c.joined.reasoning_content, c.result.reasoning_content);
  EXPECT_EQ(c.joined.content, c.result.content);
  EXPECT_EQ(c.joined.tool_calls.size(), c.result.tool_calls.size());
  for (size_t i = 0; i < std::min(c.joined.tool_calls.size(), c.result.tool_calls.size()); ++i) {
    EXPECT_EQ(c.joined.tool_calls[i].id, c.result.tool_calls[i].id);
    EXPECT_EQ(c.joined.tool_calls[i].name, c.result.tool_calls[i].name);
    EXPECT_EQ(c.joined.tool_calls[i].arguments, c.result.tool_calls[i].arguments);
  }
  return c;
}

struct Call {
  std::string id, name, args;
  bool complete = true;
};
struct Case {
  std::string name;
  bool k3;
  bool start_in_reasoning;
  std::string script;
  std::string reasoning, content;
  std::vector<Call> calls;
};

const char* kMarkerBits[] = {"<|", "|>", "<think>", "</think>", "call tool=", "<|open|>", "<|sep|>"};

void check_case(const Case& tc) {
  SCOPED_TRACE(tc.name);
  const ChatFormat& fmt = tc.k3 ? k3_fmt() : k2_fmt();
  const Tokenizer& tok = tc.k3 ? k3test::tiny_markers() : k2_tok();
  OutputParserOptions opts;
  opts.start_in_reasoning = tc.start_in_reasoning;
  const auto pieces = pieces_of(tc.script, tok);
  const Collected whole = run(fmt, opts, pieces, 0, false);
  EXPECT_EQ(whole.result.reasoning_content, tc.reasoning);
  EXPECT_EQ(whole.result.content, tc.content);
  ASSERT_EQ(whole.result.tool_calls.size(), tc.calls.size());
  for (size_t i = 0; i < tc.calls.size(); ++i) {
    EXPECT_EQ(whole.result.tool_calls[i].id, tc.calls[i].id);
    EXPECT_EQ(whole.result.tool_calls[i].name, tc.calls[i].name);
    EXPECT_EQ(whole.result.tool_calls[i].arguments, tc.calls[i].args);
    EXPECT_EQ(whole.result.tool_calls[i].complete, tc.calls[i].complete);
  }
  for (const char* bit : kMarkerBits)
    if (tc.content.find(bit) == std::string::npos) {
      EXPECT_EQ(whole.result.content.find(bit), std::string::npos) << bit;
    }
  for (uint32_t seed = 1; seed <= 25; ++seed) {
    SCOPED_TRACE(seed);
    const Collected frag = run(fmt, opts, pieces, seed, true);
    EXPECT_EQ(frag.result.reasoning_content, whole.result.reasoning_content);
    EXPECT_EQ(frag.result.content, whole.result.content);
    ASSERT_EQ(frag.result.tool_calls.size(), whole.result.tool_calls.size());
    for (size_t i = 0; i < tc.calls.size(); ++i) {
      EXPECT_EQ(frag.result.tool_calls[i].id, whole.result.tool_calls[i].id);
      EXPECT_EQ(frag.result.tool_calls[i].name, whole.result.tool_calls[i].name);
      EXPECT_EQ(frag.result.tool_calls[i].arguments, whole.result.tool_calls[i].arguments);
      EXPECT_EQ(frag.result.tool_calls[i].complete, whole.result.tool_calls[i].complete);
    }
  }
}

const std::string kCallW =
    "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Paris\"}"
    "<|close|>json<|sep|><|close|>call<|sep|>";

std::vector<Case> cases() {
  return {
      // ---- K3 ----
      {"k3_think_then_response", true, true,
       "Let me think: 2+2=4.<|close|>think<|sep|><|open|>response<|sep|>The answer is 4.<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
       "Let me think: 2+2=4.", "The answer is 4.", {}},
      {"k3_no_thinking", true, false, "Hi there!<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>", "",
       "Hi there!", {}},
      {"k3_stopped_before_close", true, false, "Partial answer", "", "Partial answer", {}},
      {"k3_tool_call", true, true,
       "Need weather.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>" + kCallW +
           "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>",
       "Need weather.", "", {{"call_1", "get_weather", "{\"city\": \"Paris\"}"}}},
      {"k3_parallel_calls", true, false,
       "Checking both.<|close|>response<|sep|><|open|>tools<|sep|>" + kCallW +
           "<|open|>call tool=\"search_docs\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{\"query\":\"kda\",\"k\":3}"
           "<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|>",
       "", "Checking both.",
       {{"call_1", "get_weather", "{\"city\": \"Paris\"}"}, {"call_2", "search_docs", "{\"query\":\"kda\",\"k\":3}"}}},
      {"k3_argument_tags", true, false,
       "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"book\" index=\"1\"<|sep|>"
       "<|open|>argument key=\"city\" type=\"string\"<|sep|>Pa\"ris\n北京<|close|>argument<|sep|>"
       "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
       "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"a\": [1, true]}<|close|>argument<|sep|>"
       "<|close|>call<|sep|><|close|>tools<|sep|>",
       "", "", {{"call_1", "book", "{\"city\": \"Pa\\\"ris\\n北京\", \"days\": 3, \"opts\": {\"a\": [1, true]}}"}}},
      {"k3_unicode", true, true,
       "思考中… 🤔<|close|>think<|sep|><|open|>response<|sep|>你好，世界！😀 Ça va?<|close|>response<|sep|>",
       "思考中… 🤔", "你好，世界！😀 Ça va?", {}},
      {"k3_think_tags_are_text", true, false, "Use <think> and </think> in HTML-ish text.<|close|>response<|sep|>", "",
       "Use <think> and </think> in HTML-ish text.", {}},
      {"k3_unknown_tag_inherits", true, false,
       "before <|open|>quote src=\"x\"<|sep|>inner<|close|>quote<|sep|> after<|close|>response<|sep|>", "",
       "before inner after", {}},
      {"k3_escaped_name_no_args", true, false,
       "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"a&quot;b&amp;c\" index=\"7\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
       "", "", {{"call_7", "a\"b&c", "{}"}}},
      // ---- K3 malformed ----
      {"k3_unterminated_call", true, false,
       "ok<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"city\": \"Pa",
       "", "ok", {{"call_1", "get_weather", "{\"city\": \"Pa", false}}},
      {"k3_invalid_json_args", true, false,
       "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{not json"
       "<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>",
       "", "", {{"call_1", "f", "{not json"}}},
      {"k3_interrupted_header", true, false, "A<|open|>respo<|open|>response<|sep|>B<|close|>response<|sep|>", "", "AB", {}},
      {"k3_unclosed_header_at_end", true, true, "r<|close|>think<|sep|><|open|>resp", "r", "", {}},
      {"k3_stray_close_and_sep", true, false, "x<|close|>nothing<|sep|>y<|sep|>z", "", "xyz", {}},
      {"k3_end_of_msg_inside_think", true, true, "still thinking<|end_of_msg|>", "still thinking", "", {}},
      {"k3_stray_text_in_tools", true, false,
       "<|close|>response<|sep|><|open|>tools<|sep|>\n" + kCallW + "\n<|close|>tools<|sep|>", "", "\n\n",
       {{"call_1", "get_weather", "{\"city\": \"Paris\"}"}}},
      {"k3_unterminated_string_argument", true, false,
       "<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>argument key=\"q\" type=\"string\"<|sep|>abc",
       "", "", {{"call_1", "f", "{\"q\": \"abc\"}", false}}},
      // ---- K2 ----
      {"k2_plain", false, false, "Hello, world!<|im_end|>", "", "Hello, world!", {}},
      {"k2_think_tags", false, false, "<think>Reasoning here.</think>The answer.<|im_end|>", "Reasoning here.",
       "The answer.", {}},
      {"k2_think_leading_ws", false, false, "\n <think>r</think>\n\nans", "r", "\n\nans", {}},
      {"k2_not_think", false, false, "<thinking is fun>", "", "<thinking is fun>", {}},
      {"k2_partial_open_at_end", false, false, "  <th", "", "  <th", {}},
      {"k2_partial_close_at_end", false, false, "<think>abc</thi", "abc</thi", "", {}},
      {"k2_close_without_open", false, false, "a </think> b", "", "a </think> b", {}},
      {"k2_tool_calls", false, false,
       "Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}"
       "<|tool_call_end|><|tool_call_begin|> functions.search_docs:1 <|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|><|im_end|>",
       "", "Let me check.",
       {{"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"}, {"functions.search_docs:1", "search_docs", "{}"}}},
      {"k2_think_then_tools", false, false,
       "<think>need tool</think><|tool_calls_section_begin|><|tool_call_begin|>functions.now:0<|tool_call_argument_begin|><|tool_call_end|><|tool_calls_section_end|>",
       "need tool", "", {{"functions.now:0", "now", "{}"}}},
      {"k2_unterminated_call", false, false,
       "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": 1",
       "", "", {{"functions.f:0", "f", "{\"a\": 1", false}}},
      {"k2_call_without_args_marker", false, false, "<|tool_call_begin|>weird_name<|tool_call_end|>x", "", "x",
       {{"weird_name", "weird_name", "{}"}}},
      {"k2_unclosed_think_then_section", false, false,
       "<think>hmm<|tool_calls_section_begin|><|tool_call_begin|>functions.g:3<|tool_call_argument_begin|>[1]<|tool_call_end|>",
       "hmm", "", {{"functions.g:3", "g", "[1]"}}},
      {"k2_unicode", false, false, "<think>想一想</think>答案：😀", "想一想", "答案：😀", {}},
  };
}

}  // namespace

TEST(OutputParser, ScriptedOutputsK3) {
  int n = 0;
  for (const auto& tc : cases())
    if (tc.k3) check_case(tc), ++n;
  EXPECT_GE(n, 10);
}

TEST(OutputParser, ScriptedOutputsK2) {
  K3_SKIP_WITHOUT_SHARED();  // the K2 markers need the real Kimi vocabulary
  int n = 0;
  for (const auto& tc : cases())
    if (!tc.k3) check_case(tc), ++n;
  EXPECT_GE(n, 5);
}

TEST(OutputParser, FinishReasonAndValidity) {
  OutputParser p(k3_fmt(), {});
  for (const auto& piece : pieces_of("<|close|>response<|sep|><|open|>tools<|sep|>" + kCallW, k3test::tiny_markers())) p.feed(piece);
  const auto& r = p.finish();
  ASSERT_EQ(r.tool_calls.size(), 1u);
  EXPECT_TRUE(r.tool_calls[0].valid_json);
  EXPECT_EQ(r.finish_reason("stop"), "tool_calls");
  EXPECT_EQ(r.finish_reason("length"), "length");
  OutputParser q(k3_fmt(), {});
  q.feed_text("plain");
  EXPECT_EQ(q.finish().finish_reason("stop"), "stop");
}

TEST(OutputParser, CallStartStreamsBeforeArguments) {
  OutputParser p(k3_fmt(), {});
  for (const auto& piece : pieces_of("<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
                                     "<|open|>json type=\"object\"<|sep|>{\"a\"",
                                     k3test::tiny_markers()))
    p.feed(piece);
  ParserDelta d = p.take_delta();
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.tool_calls[0].id, "call_1");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"a\"");
  p.feed_text(": 1}");
  d = p.take_delta();
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].name.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, ": 1}");
}

TEST(OutputParser, DeltasHoldIncompleteUtf8AndPartialTags) {
  K3_SKIP_WITHOUT_SHARED();
  OutputParser p(k2_fmt(), {});
  p.feed_text("<thi");
  EXPECT_TRUE(p.take_delta().empty());  // could still be <think>
  p.feed_text("nk>ab</th");
  ParserDelta d = p.take_delta();
  EXPECT_EQ(d.reasoning_content, "ab");  // "</th" held back
  p.feed_text("ink>\xE4\xBD");           // first two bytes of 你
  d = p.take_delta();
  EXPECT_TRUE(d.content.empty());
  p.feed_text("\xA0!");
  EXPECT_EQ(p.take_delta().content, "你!");
}

// Random well-formed K3 outputs (random texts, 0-3 calls in json or argument form) with random
// fragmentation and delta timing: exact fields, and identical results for every feeding.
TEST(OutputParser, PropertyRandomK3) {
  std::mt19937 rng(1234);
  const std::vector<std::string> alphabet = {"a", "b", " ", "\n", "<", ">", "/", "think", "\"", "=", "&amp;", "é", "中", "😀", "{", "}", ":", "<|x|>"};
  auto rand_text = [&](int maxlen) {
    std::string s;
    int n = static_cast<int>(rng() % (maxlen + 1));
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int iter = 0; iter < 200; ++iter) {
    SCOPED_TRACE(iter);
    const bool think = rng() % 2;
    std::vector<OutputPiece> pieces;
    const auto& m = k3_fmt().markers();
    auto sp = [&](int32_t id) { pieces.push_back({id, ""}); };
    auto tx = [&](const std::string& t) {
      if (!t.empty()) pieces.push_back({-1, t});
    };
    auto open = [&](const std::string& h) { sp(m.open); tx(h); sp(m.sep); };
    auto close = [&](const std::string& h) { sp(m.close); tx(h); sp(m.sep); };
    std::string reasoning, content;
    if (think) {
      reasoning = rand_text(12);
      tx(reasoning);
      close("think");
      open("response");
    }
    content = rand_text(12);
    tx(content);
    close("response");
    const int ncalls = static_cast<int>(rng() % 4);
    std::vector<Call> calls;
    if (ncalls) open("tools");
    for (int k = 0; k < ncalls; ++k) {
      Call c;
      c.name = "fn_" + std::to_string(rng() % 100);
      c.id = "call_" + std::to_string(k + 1);
      open("call tool=\"" + c.name + "\" index=\"" + std::to_string(k + 1) + "\"");
      if (rng() % 2) {
        c.args = "{\"v\": \"" + rand_text(6) + "\"}";
        open("json type=\"object\"");
        // the json text may arrive in several pieces
        for (size_t i = 0; i < c.args.size(); i += 4) tx(c.args.substr(i, 4));
        close("json");
      } else {
        const std::string n = std::to_string(rng() % 1000);
        open("argument key=\"n\" type=\"number\"");
        tx(n);
        close("argument");
        c.args = "{\"n\": " + n + "}";
      }
      close("call");
      calls.push_back(c);
    }
    if (ncalls) close("tools");
    close("message");
    sp(m.end_of_msg);

    OutputParserOptions opts;
    opts.start_in_reasoning = think;
    const Collected whole = run(k3_fmt(), opts, pieces, 0, false);
    EXPECT_EQ(whole.result.reasoning_content, reasoning);
    EXPECT_EQ(whole.result.content, content);
    ASSERT_EQ(whole.result.tool_calls.size(), calls.size());
    for (size_t k = 0; k < calls.size(); ++k) {
      EXPECT_EQ(whole.result.tool_calls[k].name, calls[k].name);
      EXPECT_EQ(whole.result.tool_calls[k].id, calls[k].id);
      EXPECT_EQ(whole.result.tool_calls[k].arguments, calls[k].args);
    }
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const Collected frag = run(k3_fmt(), opts, pieces, iter * 10 + seed, true);
      EXPECT_EQ(frag.result.reasoning_content, reasoning);
      EXPECT_EQ(frag.result.content, content);
      ASSERT_EQ(frag.result.tool_calls.size(), calls.size());
      for (size_t k = 0; k < calls.size(); ++k) EXPECT_EQ(frag.result.tool_calls[k].arguments, calls[k].args);
    }
  }
}

// Random garbage (random markers of both formats interleaved with random text): never crashes,
// same result however it is fragmented, deltas add up.
TEST(OutputParser, PropertyRandomGarbage) {
  K3_SKIP_WITHOUT_SHARED();
  std::mt19937 rng(99);
  const std::vector<std::string> alphabet = {"a", " ", "<think>", "</think>", "</th", "<th", "call tool=\"x\"", "\"", "é", "😀", "{"};
  for (int fmt_i = 0; fmt_i < 2; ++fmt_i) {
    const ChatFormat& fmt = fmt_i ? k2_fmt() : k3_fmt();
    const auto& m = fmt.markers();
    const std::vector<int32_t> specials = {m.open, m.close, m.sep, m.end_of_msg, m.im_end, m.section_begin,
                                           m.section_end, m.call_begin, m.argument_begin, m.call_end, 163584};
    for (int iter = 0; iter < 150; ++iter) {
      SCOPED_TRACE(iter);
      std::vector<OutputPiece> pieces;
      const int n = static_cast<int>(rng() % 30);
      for (int i = 0; i < n; ++i) {
        if (rng() % 3 == 0) {
          int32_t id = specials[rng() % specials.size()];
          if (id >= 0) pieces.push_back({id, ""});
        } else {
          std::string t;
          for (int k = 0, len = 1 + static_cast<int>(rng() % 4); k < len; ++k) t += alphabet[rng() % alphabet.size()];
          pieces.push_back({-1, t});
        }
      }
      OutputParserOptions opts;
      opts.start_in_reasoning = rng() % 2;
      const Collected whole = run(fmt, opts, pieces, 0, false);
      for (uint32_t seed = 1; seed <= 3; ++seed) {
        const Collected frag = run(fmt, opts, pieces, seed + iter * 7, true);
        EXPECT_EQ(frag.result.reasoning_content, whole.result.reasoning_content);
        EXPECT_EQ(frag.result.content, whole.result.content);
        ASSERT_EQ(frag.result.tool_calls.size(), whole.result.tool_calls.size());
        for (size_t k = 0; k < whole.result.tool_calls.size(); ++k)
          EXPECT_EQ(frag.result.tool_calls[k].arguments, whole.result.tool_calls[k].arguments);
      }
    }
  }
}
