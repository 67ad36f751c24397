// Errors carry context: which file, which tensor, which field, what was expected.
#pragma once
#include <stdexcept>
#include <string>

namespace k3 {

// The one exception type of libk3. Front ends catch it, print what() and exit non-zero
// (CLI) or turn it into an error response (server).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

}  // namespace k3
