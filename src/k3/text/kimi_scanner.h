// A hand-written matcher for Kimi's pre-tokeniser pattern (kimi_pattern()), giving the same pieces
// as the regex in time linear in the text and with constant stack, for texts of any length.
//
// Why not the regex: PCRE2 runs the pattern by backtracking. The letter atoms are groups
// ((?:[...]|[post-Unicode-14 code points])), so the JIT keeps one backtracking frame per repeated
// letter and a run of ~1,400 letters overflows its stack; a run of spaces makes [\s]*[\r\n]+ give
// back one space at a time, so 10 MB of spaces exceeds the match limit. Both limits only move
// with bigger settings. Every alternative of the pattern is a run of one class (plus a one-character
// lookahead and an optional contraction), so the first match at a position can be computed with a
// few forward scans instead, which is what this does.
//
// Classes are tiktoken's own (kimi_classes.h, generated from tests/data/tokenizer/kimi_classes.json),
// so the scanner does not depend on PCRE2's Unicode version.
#pragma once
#include <functional>
#include <string_view>

namespace k3::text {

// Calls fn for every piece in order; the pieces tile `text` exactly. Ill-formed UTF-8 never
// matches: like PCRE2_MATCH_INVALID_UTF, a match never spans it, and the bytes between matches
// become pieces of their own.
void kimi_scan(std::string_view text, const std::function<void(std::string_view)>& fn);

}  // namespace k3::text
