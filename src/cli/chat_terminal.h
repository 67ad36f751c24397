// The terminal side of `k3 chat`: whether stdin/stdout are a terminal and colours are wanted, Ctrl-C as a
// flag (stop the reply, not the program), and reading one input line at a time.
#pragma once
#include <string>

namespace k3cli {

class ChatTerminal {
 public:
  // Installs the SIGINT handler (restored by the destructor).
  ChatTerminal();
  ~ChatTerminal();
  ChatTerminal(const ChatTerminal&) = delete;
  ChatTerminal& operator=(const ChatTerminal&) = delete;

  bool interactive() const { return interactive_; }  // stdin and stdout are terminals: prompts are shown
  bool color() const { return color_; }              // ANSI styles: a terminal, NO_COLOR unset, TERM not "dumb"

  // Ctrl-C since the last call (and clears it).
  static bool take_interrupt();

  enum class Read { Line, Eof, Interrupted };
  // One line without its newline. Lines longer than kMaxLineBytes are an error (k3::Error), not memory.
  Read read_line(std::string& line);
  static constexpr size_t kMaxLineBytes = size_t{1} << 20;

  // Text in a style when colours are on ("2": dim, "1": bold, "31": red...), plain otherwise.
  std::string styled(const char* sgr, const std::string& text) const;

 private:
  bool interactive_ = false, color_ = false;
  std::string pending_;  // bytes read past the last newline
  bool eof_ = false;
};

}  // namespace k3cli
