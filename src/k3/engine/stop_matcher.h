// Incremental stop-string matcher over streamed, decoded text (bytes, UTF-8 aware).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace k3::engine {

// Feed decoded text chunks with push(); forward Result::emit to the client. Text that might be
// the start of a stop string is held back until it is either completed (=> stop) or ruled out
// (=> released). On a match, emit is the text before the earliest match and stopped = true; the
// stop string itself and anything after it is dropped (OpenAI / vLLM behaviour). Emitted text
// never ends inside a UTF-8 sequence: a trailing incomplete sequence is held back too.
class StopMatcher {
 public:
  struct Result {
    std::string emit;
    bool stopped = false;
  };

  // Throws k3::Error on an empty stop string.
  explicit StopMatcher(std::vector<std::string> stops);

  // After a stop, further pushes return {"", true}.
  Result push(std::string_view text);
  // End of generation: returns (and clears) whatever is held back; "" after a stop.
  std::string flush();

  bool stopped() const { return stopped_; }
  // Bytes currently held back.
  size_t held() const { return buf_.size(); }

 private:
  std::vector<std::string> stops_;
  std::string buf_;
  bool stopped_ = false;
};

}  // namespace k3::engine
