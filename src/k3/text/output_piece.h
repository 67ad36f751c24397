// One unit of generated output as text front ends see it. Produced by the engine (engine/sequence.cpp:
// StreamDecoder + StopMatcher), consumed by output parsers (text/output_parser.h) and the server; it
// lives in text/ so that parsers need nothing of the engine.
#pragma once
#include <cstdint>
#include <string>

namespace k3::text {

// Either text (valid UTF-8, stop strings already removed) or a special token (a control marker such as
// <|open|>), which output parsers act on.
struct OutputPiece {
  int32_t special_id = -1;
  std::string text;
};

}  // namespace k3::text
