// UTF-8 helpers shared by the tokenizer pieces: validation and lossy decoding.
// Lossy decoding follows the Unicode "maximal subpart" practice (one U+FFFD per maximal ill-formed
// subpart), which is what Python's bytes.decode("utf-8", errors="replace") and HF tokenizers do.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace k3::text {

// Length of the well-formed UTF-8 sequence starting at s[0], or 0 if s does not start with one
// (ill-formed, or truncated by the end of s).
size_t utf8_seq_len(std::string_view s);

bool is_valid_utf8(std::string_view s);

// Appends the lossy decoding of `in` to `out` and returns how many bytes of `in` were consumed.
// With final=false a trailing sequence that is incomplete but could still become valid is left
// unconsumed (the caller keeps it for later); with final=true everything is consumed.
size_t utf8_lossy_append(std::string_view in, std::string& out, bool final);

// Whole-string lossy decode (final=true).
std::string utf8_lossy(std::string_view in);

}  // namespace k3::text
