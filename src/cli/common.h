// Helpers shared by the CLI verbs.
#pragma once
#include <cstdint>
#include <string>

namespace k3cli {

// The model directory to use: -m if given, else $K3_MODEL, else the built-in default model
// (models/k3-tiny beside the working directory or the binary). Throws k3::Error if none is found.
std::string resolve_model_dir(const std::string& given);

// Throws k3::Error unless every id the tokenizer can produce is a row of the model's embedding
// (a tokenizer from another model would otherwise index past it); `k3 serve` checks the same.
void check_tokenizer_fits(int64_t tokenizer_n_vocab, int64_t model_vocab_size);

// "2GiB", "512MB", "1e9" -> bytes; a value below 1 (e.g. "0.25") is that fraction of `fraction_of`
// (default: physical RAM).
int64_t parse_memory(const std::string& s, int64_t fraction_of = 0);
// Whether parse_memory reads `s` as a fraction (a number below 1 without a unit) rather than a size.
bool memory_is_fraction(const std::string& s);

// "1.23 GB" style.
std::string human_bytes(double bytes);
std::string human_count(double n);

}  // namespace k3cli
