// What `k3 chat` keeps between turns (history, system prompt, settings) and its /commands.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace k3cli {

struct ChatState {
  std::string system;             // the system prompt ("" = none)
  nlohmann::json history = nlohmann::json::array();  // OpenAI messages: user / assistant turns, in order
  float temperature = 0.6f;
  int max_tokens = 1024;
  // The chat request the model renders: {"messages": [system?, history...]}.
  nlohmann::json request() const;
};

struct CommandResult {
  bool exit = false;
  std::string message;  // what to tell the user (may be empty)
  bool error = false;   // the message is an error (the state is unchanged)
};

// `line` starts with '/': runs the command on `state`. Never throws for bad input (errors are results).
CommandResult run_chat_command(const std::string& line, ChatState& state);

// The /help text.
std::string chat_help();

}  // namespace k3cli
