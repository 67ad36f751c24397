// Incremental detokenisation for streaming output: emits only complete, valid UTF-8.
#pragma once
#include <cstdint>
#include <string>

#include "k3/text/tokenizer.h"

namespace k3::text {

// Tokens can end in the middle of a multi-byte character, so bytes are buffered until the
// character is complete. Bytes that can never become valid are replaced by U+FFFD (one per
// maximal ill-formed subpart, like Python's errors="replace"), so the concatenation of all
// push() and flush() results equals utf8_lossy(decode(all ids)).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(&tok) {}
  std::string push(int32_t id);
  // Emits what is still held back (an incomplete sequence becomes U+FFFD) and resets.
  std::string flush();

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace k3::text
