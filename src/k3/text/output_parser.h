// Turns the engine's output stream (OutputPiece: text or special-token ids, in order) into OpenAI
// chat fields: reasoning_content, content and tool_calls, for the K3 XTML and K2 formats.
//
// Streaming guarantee: after any sequence of feed() calls, take_delta() returns exactly what became
// final since the previous take_delta(); after finish(), one more take_delta() returns the rest. The
// concatenation of all deltas equals finish()'s result field by field, whatever the fragmentation of
// the input text, and control markers / tag text never reach content: text whose role is not yet
// known (a tag header between <|open|> and <|sep|>, a partial "</think>") is held back until resolved.
// Deltas also hold back an incomplete trailing UTF-8 sequence (released when completed or at finish).
//
// Malformed output never throws; see docs/chat-format.md ("Parser") for how each case degrades.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "k3/text/chat_format.h"
#include "k3/text/output_piece.h"

namespace k3::text {

struct ParsedToolCall {
  std::string id;         // K3: prefix + the call's index attribute; K2: the model's "functions.NAME:IDX"
  std::string name;
  std::string arguments;  // JSON text as produced by the model (passed through even if invalid)
  bool complete = false;  // the call's closing marker was seen
  bool valid_json = false;  // arguments parse as JSON (set by finish())
};

struct ToolCallDelta {
  int index = 0;          // position in tool_calls (OpenAI streaming "index")
  std::string id, name;   // set only in the first delta of a call
  std::string arguments;  // the next fragment of the arguments
};

struct ParserDelta {
  std::string reasoning_content;
  std::string content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning_content.empty() && content.empty() && tool_calls.empty(); }
};

struct ParseResult {
  std::string reasoning_content;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  // "tool_calls" when the model called tools and stopped normally; otherwise the engine's reason.
  std::string finish_reason(const std::string& engine_reason) const {
    return !tool_calls.empty() && engine_reason == "stop" ? "tool_calls" : engine_reason;
  }
};

struct OutputParserOptions {
  // Generation starts inside the reasoning channel (K3: the prompt ended with <|open|>think<|sep|>,
  // see ChatFormat::generation_starts_in_reasoning; K2: a prompt that ended with "<think>").
  bool start_in_reasoning = false;
  // K3 tool-call ids are call_id_prefix + index (or ordinal); make it request-unique if needed.
  std::string call_id_prefix = "call_";
  // K2: output that begins with "<think>" (after optional whitespace) is reasoning up to "</think>".
  bool k2_think_tags = true;
};

class OutputParser {
 public:
  explicit OutputParser(const ChatFormat& fmt, OutputParserOptions opts = {});

  void feed(const OutputPiece& piece);
  void feed_text(std::string_view text);
  void feed_special(int32_t id);
  // What became final since the last call (see the streaming guarantee above).
  ParserDelta take_delta();
  // Ends the stream: releases held-back text, closes open calls (complete=false). Idempotent.
  const ParseResult& finish();
  // What is final so far (without held-back text).
  const ParseResult& current() const { return res_; }

 private:
  enum class Kind { Message, Think, Response, Tools, Call, Json, Argument, Unknown };
  struct Frame {
    Kind kind;
    std::string name;
    int call = -1;            // Call/Json/Argument: index into res_.tool_calls
    bool arg_string = false;  // Argument: type="string"
    bool arg_has_value = false;
    bool call_has_args = false;  // Call: saw <|open|>argument
  };
  enum class K3Mode { Body, OpenHeader, CloseHeader };
  enum class K2Mode { Text, CallId, Args };
  enum class K2Phase { Start, Think, Content };

  // K3
  void k3_special(int32_t id);
  void k3_text(std::string_view t);
  void k3_open(const std::string& header);
  void k3_close(const std::string& header);
  void pop_frame(bool explicit_close);
  // K2
  void k2_special(int32_t id);
  void k2_text(std::string_view t);
  void k2_content_text(std::string_view t);
  void k2_flush_pending();
  void k2_begin_call(bool have_args);
  void k2_end_call(bool complete);

  void finalize_call(int idx, bool complete);

  ChatFormatKind kind_;
  ChatMarkers m_;
  OutputParserOptions opts_;
  ParseResult res_;
  bool finished_ = false;

  std::vector<Frame> stack_;
  K3Mode k3_mode_ = K3Mode::Body;
  std::string header_;

  K2Mode k2_mode_ = K2Mode::Text;
  K2Phase k2_phase_ = K2Phase::Start;
  std::string k2_pending_;  // undecided / held-back text of the current phase
  std::string k2_id_;
  int k2_call_ = -1;

  // streaming bookkeeping
  size_t sent_reasoning_ = 0, sent_content_ = 0;
  struct CallSent {
    bool header = false;
    size_t args = 0;
  };
  std::vector<CallSent> sent_calls_;
};

}  // namespace k3::text
