// A guard to run before nlohmann::json::parse on untrusted files: nlohmann parses deep nesting
// fine, but destroying and dumping such a value recurses once per level, so a 4 MB config of
// "[[[[...]]]]" crashed the loader with a stack overflow. Real configs and headers nest < 10 deep.
#pragma once
#include <string>
#include <string_view>

namespace k3 {

inline constexpr int kMaxJsonDepth = 64;

// Throws k3::Error (naming `what`) if arrays/objects in `text` nest deeper than max_depth. Brackets
// inside JSON strings do not count. Linear, no allocation.
void check_json_depth(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);

}  // namespace k3
