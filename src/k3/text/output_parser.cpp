#include "k3/text/output_parser.h"
#include "k3/text/json_escape.h"

#include <nlohmann/json.hpp>

namespace k3::text {

namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_ws(s[b])) ++b;
  while (e > b && is_ws(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// End of the longest prefix of s[from..] that does not end inside a UTF-8 sequence.
size_t utf8_safe_end(const std::string& s, size_t from) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n - from; ++k) {
    const auto c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t len = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > k ? n - k : n;
  }
  return n;
}

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_suffix(std::string_view s, std::string_view tag) {
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

std::string unescape_attr(std::string_view v) {
  std::string r;
  for (size_t i = 0; i < v.size();) {
    if (v.substr(i, 6) == "&quot;") {
      r += '"';
      i += 6;
    } else if (v.substr(i, 5) == "&amp;") {
      r += '&';
      i += 5;
    } else {
      r += v[i++];
    }
  }
  return r;
}

// `TAG k1="v1" k2="v2"` -> (TAG, attrs). Lenient: stops at the first malformed attribute.
std::pair<std::string, std::vector<std::pair<std::string, std::string>>> parse_header(std::string_view h) {
  size_t i = 0;
  while (i < h.size() && is_ws(h[i])) ++i;
  size_t s = i;
  while (i < h.size() && !is_ws(h[i])) ++i;
  std::string tag(h.substr(s, i - s));
  std::vector<std::pair<std::string, std::string>> attrs;
  while (i < h.size()) {
    while (i < h.size() && is_ws(h[i])) ++i;
    size_t ks = i;
    while (i < h.size() && h[i] != '=' && !is_ws(h[i])) ++i;
    if (i >= h.size() || h[i] != '=' || i + 1 >= h.size() || h[i + 1] != '"') break;
    std::string key(h.substr(ks, i - ks));
    i += 2;
    size_t vs = i;
    while (i < h.size() && h[i] != '"') ++i;
    attrs.emplace_back(key, unescape_attr(h.substr(vs, i - vs)));
    if (i < h.size()) ++i;
  }
  return {tag, attrs};
}

std::string attr(const std::vector<std::pair<std::string, std::string>>& attrs, const char* key) {
  for (const auto& [k, v] : attrs)
    if (k == key) return v;
  return {};
}

}  // namespace

OutputParser::OutputParser(const ChatFormat& fmt, OutputParserOptions opts)
    : kind_(fmt.kind()), m_(fmt.markers()), opts_(std::move(opts)) {
  if (kind_ == ChatFormatKind::K3Xtml) {
    stack_.push_back({Kind::Message, "message"});
    if (opts_.start_in_reasoning) stack_.push_back({Kind::Think, "think"});
    else stack_.push_back({Kind::Response, "response"});
  } else {
    k2_phase_ = opts_.start_in_reasoning ? K2Phase::Think : opts_.k2_think_tags ? K2Phase::Start : K2Phase::Content;
  }
}

void OutputParser::feed(const OutputPiece& piece) {
  if (piece.special_id >= 0) feed_special(piece.special_id);
  else feed_text(piece.text);
}

void OutputParser::feed_text(std::string_view text) {
  if (finished_ || text.empty()) return;
  if (kind_ == ChatFormatKind::K3Xtml) k3_text(text);
  else k2_text(text);
}

void OutputParser::feed_special(int32_t id) {
  if (finished_) return;
  if (kind_ == ChatFormatKind::K3Xtml) k3_special(id);
  else k2_special(id);
}

void OutputParser::finalize_call(int idx, bool complete) {
  if (idx < 0) return;
  ParsedToolCall& c = res_.tool_calls[idx];
  if (c.arguments.empty()) c.arguments = "{}";
  c.complete = complete;
}

// ---- K3 XTML ------------------------------------------------------------------------------------

void OutputParser::k3_special(int32_t id) {
  if (id == m_.open || id == m_.close) {
    // A header interrupted by another marker is malformed: it is dropped.
    header_.clear();
    k3_mode_ = id == m_.open ? K3Mode::OpenHeader : K3Mode::CloseHeader;
  } else if (id == m_.sep) {
    if (k3_mode_ == K3Mode::OpenHeader) k3_open(header_);
    else if (k3_mode_ == K3Mode::CloseHeader) k3_close(header_);
    header_.clear();
    k3_mode_ = K3Mode::Body;
  } else if (id == m_.end_of_msg) {
    header_.clear();
    k3_mode_ = K3Mode::Body;
    while (!stack_.empty()) pop_frame(false);
  }
  // Any other special token (e.g. [EOS]) carries no text and no structure here: ignored.
}

void OutputParser::k3_text(std::string_view t) {
  if (k3_mode_ != K3Mode::Body) {
    header_.append(t);
    return;
  }
  for (size_t i = stack_.size(); i-- > 0;) {
    Frame& f = stack_[i];
    switch (f.kind) {
      case Kind::Unknown: continue;  // text of unknown tags belongs to the enclosing channel
      case Kind::Think: res_.reasoning_content.append(t); return;
      case Kind::Json: res_.tool_calls[f.call].arguments.append(t); return;
      case Kind::Argument: {
        std::string& a = res_.tool_calls[f.call].arguments;
        f.arg_has_value = true;
        if (f.arg_string) json_escape_into(t, a);
        else a.append(t);
        return;
      }
      default: res_.content.append(t); return;  // response, or stray text at a structural level
    }
  }
  res_.content.append(t);
}

void OutputParser::k3_open(const std::string& header) {
  auto [tag, attrs] = parse_header(header);
  const int call = !stack_.empty() && stack_.back().kind == Kind::Call ? stack_.back().call : -1;
  Frame f{Kind::Unknown, tag};
  if (tag == "think") f.kind = Kind::Think;
  else if (tag == "response") f.kind = Kind::Response;
  else if (tag == "tools") f.kind = Kind::Tools;
  else if (tag == "message") f.kind = Kind::Message;
  else if (tag == "call") {
    f.kind = Kind::Call;
    ParsedToolCall c;
    c.name = attr(attrs, "tool");
    std::string index = attr(attrs, "index");
    if (index.empty()) index = std::to_string(res_.tool_calls.size() + 1);
    c.id = opts_.call_id_prefix + index;
    f.call = static_cast<int>(res_.tool_calls.size());
    res_.tool_calls.push_back(std::move(c));
  } else if (tag == "json" && call >= 0) {
    f.kind = Kind::Json;
    f.call = call;
  } else if (tag == "argument" && call >= 0) {
    f.kind = Kind::Argument;
    f.call = call;
    Frame& cf = stack_.back();
    std::string& a = res_.tool_calls[call].arguments;
    a += cf.call_has_args ? ", \"" : "{\"";
    cf.call_has_args = true;
    json_escape_into(attr(attrs, "key"), a);
    a += "\": ";
    f.arg_string = attr(attrs, "type") == "string";
    if (f.arg_string) a += '"';
  }
  stack_.push_back(std::move(f));
}

void OutputParser::k3_close(const std::string& header) {
  const std::string tag = trim(header);
  for (size_t i = stack_.size(); i-- > 0;) {
    if (stack_[i].name == tag) {
      while (stack_.size() > i + 1) pop_frame(false);
      pop_frame(true);
      return;
    }
  }
  // A close tag with no matching open tag is ignored.
}

void OutputParser::pop_frame(bool explicit_close) {
  Frame f = std::move(stack_.back());
  stack_.pop_back();
  if (f.kind == Kind::Argument) {
    std::string& a = res_.tool_calls[f.call].arguments;
    if (f.arg_string) a += '"';
    else if (!f.arg_has_value) a += "null";
  } else if (f.kind == Kind::Call) {
    if (f.call_has_args) res_.tool_calls[f.call].arguments += '}';
    finalize_call(f.call, explicit_close);
  }
}

// ---- K2 -----------------------------------------------------------------------------------------

void OutputParser::k2_flush_pending() {
  if (k2_phase_ == K2Phase::Start) {
    res_.content += k2_pending_;
    k2_phase_ = K2Phase::Content;
  } else if (k2_phase_ == K2Phase::Think) {
    res_.reasoning_content += k2_pending_;
  }
  k2_pending_.clear();
}

void OutputParser::k2_content_text(std::string_view t) {
  if (k2_phase_ == K2Phase::Content) {
    res_.content.append(t);
    return;
  }
  k2_pending_.append(t);
  if (k2_phase_ == K2Phase::Start) {
    size_t b = 0;
    while (b < k2_pending_.size() && is_ws(k2_pending_[b])) ++b;
    std::string_view rest = std::string_view(k2_pending_).substr(b);
    if (rest.size() < kThinkOpen.size()) {
      if (kThinkOpen.substr(0, rest.size()) == rest) return;  // undecided: hold
    } else if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
      std::string after(rest.substr(kThinkOpen.size()));
      k2_pending_.clear();
      k2_phase_ = K2Phase::Think;
      if (!after.empty()) k2_content_text(after);
      return;
    }
    k2_flush_pending();  // not a think block: everything is content
    return;
  }
  // Think phase: reasoning up to </think>, holding back a partial closing tag.
  size_t pos = k2_pending_.find(kThinkClose);
  if (pos != std::string::npos) {
    res_.reasoning_content.append(k2_pending_, 0, pos);
    std::string after = k2_pending_.substr(pos + kThinkClose.size());
    k2_pending_.clear();
    k2_phase_ = K2Phase::Content;
    res_.content += after;
    return;
  }
  size_t hold = partial_suffix(k2_pending_, kThinkClose);
  res_.reasoning_content.append(k2_pending_, 0, k2_pending_.size() - hold);
  k2_pending_.erase(0, k2_pending_.size() - hold);
}

void OutputParser::k2_text(std::string_view t) {
  switch (k2_mode_) {
    case K2Mode::CallId: k2_id_.append(t); return;
    case K2Mode::Args: res_.tool_calls[k2_call_].arguments.append(t); return;
    case K2Mode::Text: k2_content_text(t); return;
  }
}

void OutputParser::k2_begin_call(bool /*have_args*/) {
  ParsedToolCall c;
  std::string id = trim(k2_id_);
  k2_id_.clear();
  std::string name = id;
  if (name.rfind("functions.", 0) == 0) name = name.substr(10);
  size_t colon = name.rfind(':');
  if (colon != std::string::npos && colon + 1 < name.size() &&
      name.find_first_not_of("0123456789", colon + 1) == std::string::npos)
    name = name.substr(0, colon);
  c.name = name;
  c.id = id.empty() ? opts_.call_id_prefix + std::to_string(res_.tool_calls.size()) : id;
  k2_call_ = static_cast<int>(res_.tool_calls.size());
  res_.tool_calls.push_back(std::move(c));
}

void OutputParser::k2_end_call(bool complete) {
  if (k2_mode_ == K2Mode::CallId) k2_begin_call(false);
  if (k2_mode_ != K2Mode::Text) finalize_call(k2_call_, complete);
  k2_call_ = -1;
  k2_mode_ = K2Mode::Text;
}

void OutputParser::k2_special(int32_t id) {
  if (id == m_.call_begin) {
    k2_end_call(false);  // an unterminated previous call
    // Structure ends any undecided / partial-tag text: it is released to its channel. A tool call
    // inside an unclosed <think> ends the reasoning.
    k2_flush_pending();
    if (k2_phase_ == K2Phase::Think) k2_phase_ = K2Phase::Content;
    k2_mode_ = K2Mode::CallId;
    k2_id_.clear();
  } else if (id == m_.argument_begin) {
    if (k2_mode_ == K2Mode::CallId) {
      k2_begin_call(true);
      k2_mode_ = K2Mode::Args;
    }
  } else if (id == m_.call_end) {
    k2_end_call(true);
  } else if (id == m_.section_begin || id == m_.section_end || id == m_.im_end) {
    if (k2_mode_ != K2Mode::Text) k2_end_call(false);
    if (id == m_.section_begin || id == m_.im_end) {
      k2_flush_pending();
      if (k2_phase_ == K2Phase::Think) k2_phase_ = K2Phase::Content;
    }
  }
  // Other specials are ignored.
}

// ---- streaming ----------------------------------------------------------------------------------

const ParseResult& OutputParser::finish() {
  if (finished_) return res_;
  if (kind_ == ChatFormatKind::K3Xtml) {
    header_.clear();  // an unterminated tag header is dropped
    while (!stack_.empty()) pop_frame(false);
  } else {
    if (k2_mode_ != K2Mode::Text) k2_end_call(false);
    k2_flush_pending();
  }
  for (auto& c : res_.tool_calls) c.valid_json = nlohmann::json::accept(c.arguments);
  finished_ = true;
  return res_;
}

ParserDelta OutputParser::take_delta() {
  ParserDelta d;
  auto take = [&](const std::string& s, size_t& sent, std::string& out) {
    size_t end = finished_ ? s.size() : utf8_safe_end(s, sent);
    if (end > sent) {
      out.assign(s, sent, end - sent);
      sent = end;
    }
  };
  take(res_.reasoning_content, sent_reasoning_, d.reasoning_content);
  take(res_.content, sent_content_, d.content);
  sent_calls_.resize(res_.tool_calls.size());
  for (size_t i = 0; i < res_.tool_calls.size(); ++i) {
    const ParsedToolCall& c = res_.tool_calls[i];
    CallSent& s = sent_calls_[i];
    ToolCallDelta td;
    td.index = static_cast<int>(i);
    take(c.arguments, s.args, td.arguments);
    if (!s.header) {
      s.header = true;
      td.id = c.id;
      td.name = c.name;
      d.tool_calls.push_back(std::move(td));
    } else if (!td.arguments.empty()) {
      d.tool_calls.push_back(std::move(td));
    }
  }
  return d;
}

}  // namespace k3::text
