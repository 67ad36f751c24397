#include "k3/text/stream_decoder.h"

#include "k3/text/utf8.h"

namespace k3::text {

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_bytes(id);  // throws for invalid ids before touching state
  std::string out;
  const size_t used = utf8_lossy_append(pending_, out, /*final=*/false);
  pending_.erase(0, used);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_lossy(pending_);
  pending_.clear();
  return out;
}

}  // namespace k3::text
