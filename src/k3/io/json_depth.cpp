#include "k3/io/json_depth.h"

#include "k3/core/error.h"

namespace k3 {

void check_json_depth(std::string_view text, const std::string& what, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw Error(what + ": JSON nested more than " + std::to_string(max_depth) + " levels deep");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
}

}  // namespace k3
