#include "cli/chat_commands.h"

#include <cmath>
#include <fstream>

namespace k3cli {

nlohmann::json ChatState::request() const {
  nlohmann::json messages = nlohmann::json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  for (const auto& m : history) messages.push_back(m);
  return {{"messages", std::move(messages)}};
}

std::string chat_help() {
  return "/help          this list\n"
         "/reset         forget the conversation (the system prompt stays)\n"
         "/system TEXT   set the system prompt (no TEXT: remove it)\n"
         "/temp X        sampling temperature (0 = greedy)\n"
         "/max N         most tokens per reply\n"
         "/save FILE     write the conversation as JSON (OpenAI messages)\n"
         "/exit          quit (also /quit, Ctrl-D, or Ctrl-C at the prompt)\n"
         "A line ending in \\ continues on the next line. Ctrl-C stops a reply.";
}

namespace {
CommandResult fail(std::string msg) { return {false, std::move(msg), true}; }

// A whole-string number: "0.7" yes, "0.7x", "", "nan" no.
bool parse_double(const std::string& s, double& v) {
  if (s.empty()) return false;
  try {
    size_t used = 0;
    v = std::stod(s, &used);
    return used == s.size() && std::isfinite(v);
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

CommandResult run_chat_command(const std::string& line, ChatState& st) {
  const size_t sp = line.find(' ');
  const std::string cmd = line.substr(0, sp);
  std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
  while (!arg.empty() && (arg.back() == ' ' || arg.back() == '\t')) arg.pop_back();
  while (!arg.empty() && (arg.front() == ' ' || arg.front() == '\t')) arg.erase(0, 1);
  if (cmd == "/help" || cmd == "/?") return {false, chat_help()};
  if (cmd == "/exit" || cmd == "/quit") return {true, ""};
  if (cmd == "/reset" || cmd == "/clear") {
    st.history = nlohmann::json::array();
    return {false, "(conversation cleared)"};
  }
  if (cmd == "/system") {
    st.system = arg;
    return {false, arg.empty() ? "(system prompt removed)" : "(system prompt set)"};
  }
  if (cmd == "/temp") {
    double v = 0;
    if (!parse_double(arg, v) || v < 0 || v > 100) return fail("/temp: expected a number 0..100, got '" + arg + "'");
    st.temperature = static_cast<float>(v);
    return {false, "(temperature " + arg + ")"};
  }
  if (cmd == "/max") {
    double v = 0;
    if (!parse_double(arg, v) || v < 1 || v > 1e9 || v != std::floor(v))
      return fail("/max: expected a whole number of tokens >= 1, got '" + arg + "'");
    st.max_tokens = static_cast<int>(v);
    return {false, "(at most " + arg + " tokens per reply)"};
  }
  if (cmd == "/save") {
    if (arg.empty()) return fail("/save: a file name is needed");
    std::ofstream f(arg, std::ios::binary | std::ios::trunc);
    f << st.request()["messages"].dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    f.close();
    if (!f) return fail("/save: cannot write " + arg);
    return {false, "(saved " + std::to_string(st.history.size()) + " messages to " + arg + ")"};
  }
  return fail("unknown command " + cmd + " (/help lists them)");
}

}  // namespace k3cli
