// Shared fixtures for the tokenizer tests: the Kimi vocab (loaded once) and golden files.
#pragma once
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "k3/text/tokenizer.h"
#include "test_util.h"

namespace k3test {

inline const std::string kKimiModel = shared_path("data/tokenizers/kimi/tiktoken.model");
inline const std::string kCl100kModel = shared_path("data/tokenizers/openai/cl100k_base.tiktoken");
inline const std::string kTokData = K3_SOURCE_DIR "/tests/data/tokenizer/";
inline const std::string kK3Config = kTokData + "k3_tokenizer_config.json";

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open " + path);
  return nlohmann::json::parse(f);
}

// Kimi vocab + the K3 special-token table fixture; loaded once for all tests.
inline const k3::text::Tokenizer& kimi() {
  static const k3::text::Tokenizer t = k3::text::Tokenizer::load_files(kKimiModel, kK3Config);
  return t;
}

// tests/data/tiny-tokenizer (scripts/make-tiny-tokenizer): 768 BPE ranks (Kimi's first 768: the 256 bytes
// and merges) with the K3 special tokens at 768.. ([BOS] 768, [EOS] 769, <|end_of_msg|> 770, <|open|> 771,
// <|close|> 772, <|sep|> 773). For tests that need the markers and byte tokens but not the real
// vocabulary: they run without ../shared.
inline const k3::text::Tokenizer& tiny_markers() {
  static const k3::text::Tokenizer t = k3::text::Tokenizer::load(K3_SOURCE_DIR "/tests/data/tiny-tokenizer");
  return t;
}

inline const nlohmann::json& kimi_goldens() {
  static const nlohmann::json j = load_json(kTokData + "kimi_goldens.json");
  return j;
}

inline std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace k3test
