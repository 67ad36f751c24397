// JSON string escaping as Python's json.dumps(ensure_ascii=False) writes it: the templates' tojson and
// the tool-call arguments rebuilt by the output parser must match it byte for byte.
#pragma once
#include <string>
#include <string_view>

namespace k3::text {

// Appends the escaped body of `s` (without quotes) to `out`: \" \\ \n \r \t \b \f, other control
// bytes as \u00XX, everything else (UTF-8 included) as is.
void json_escape_into(std::string_view s, std::string& out);

}  // namespace k3::text
